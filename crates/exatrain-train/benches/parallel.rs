//! The 3D-parallel trainer on the bench config (6 × 384, seq 256, vocab 8192, global batch 8)
//! over in-process ranks: for a handful of layouts, the bytes each collective kind moved per
//! step and the bytes held per category, against the planner's prediction for the same layout,
//! and tokens/s (on 2 cores the ranks share the cores: this shows the machinery's overhead, not
//! scaling). Run: `cargo bench -p exatrain-train --bench parallel`.

use std::time::Duration;

use exatrain_parallel::comm::in_process;
use exatrain_spec::{presets, ParallelConfig, Recompute};
use exatrain_train::parallel::{self, Options};
use exatrain_train::train::TrainConfig;

fn main() {
    let spec = presets::model("bench").unwrap();
    let dir = std::env::temp_dir().join(format!("exatrain-bench-parallel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, include_str!("../../../data/corpus/devils-dictionary.txt")).unwrap();
    let data = dir.join("data");
    exatrain_train::data::prepare(&corpus, spec.vocab, &data).unwrap();
    // bytes do not depend on the machine; priced as the trainer runs them (no framework)
    let cluster = presets::cluster("frontier").unwrap().for_trainer();
    let l = |tp, pp, dp, mb| ParallelConfig::new(tp, pp, dp, mb, 8);
    let layouts = [
        l(1, 1, 1, 8),
        l(1, 1, 2, 4),
        ParallelConfig {
            zero: 1,
            ..l(1, 1, 4, 2)
        },
        l(2, 1, 1, 8),
        l(1, 2, 1, 2),
        l(2, 2, 1, 2),
        ParallelConfig {
            zero: 2,
            recompute: Recompute::Full,
            ..l(1, 2, 2, 2)
        },
        ParallelConfig {
            recompute: Recompute::Selective,
            ..l(2, 1, 2, 4)
        },
        ParallelConfig {
            virtual_stages: 3,
            ..l(1, 2, 1, 2)
        },
        ParallelConfig {
            sequence_parallel: true,
            ..l(2, 2, 1, 2)
        },
        ParallelConfig {
            sequence_parallel: true,
            zero: 1,
            recompute: Recompute::Selective,
            ..l(2, 1, 2, 4)
        },
    ];
    println!(
        "| layout | tokens/s | TP bytes meas/plan | PP bytes meas/plan | DP bytes meas/plan | weights | grads | optimizer | activations |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for pc in layouts {
        let cfg = TrainConfig {
            steps: 4,
            micro_batch: pc.micro_batch as usize,
            global_batch: 8,
            eval_every: 0,
            ckpt_every: 0,
            ..Default::default()
        };
        let ranks = in_process(pc.gpus() as usize, Duration::from_secs(120));
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .into_iter()
                .map(|comm| {
                    let (spec, cfg, pc, data) = (&spec, &cfg, &pc, &data);
                    s.spawn(move || parallel::train(spec, cfg, pc, &Options::default(), data, &comm).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let reports: Vec<_> = results.iter().map(|r| r.report.clone()).collect();
        let got = parallel::aggregate(&reports);
        let (trained, as_planned) = parallel::as_trained(&spec, &pc);
        let plan = exatrain_cost::plan(&trained, &cluster, &as_planned).unwrap();
        let tokens_per_s = (8 * spec.seq_len) as f64 / got.step_s;
        let pair = |a: f64, b: f64| {
            if a == b {
                format!("{:.0} = plan", a)
            } else {
                format!("{:.0} / {:.0}", a, b)
            }
        };
        let ratio = |a: usize, b: f64| {
            if b > 0.0 {
                format!("{:+.2} %", 100.0 * (a as f64 / b - 1.0))
            } else {
                "-".into()
            }
        };
        let (b, m, pm) = (got.comm_bytes, got.memory_bytes, plan.memory_bytes);
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            parallel::describe(&pc),
            tokens_per_s,
            pair(b.tp, plan.comm_bytes.tp),
            pair(b.pp, plan.comm_bytes.pp),
            pair(b.dp, plan.comm_bytes.dp),
            ratio(m.weights, pm.weights),
            ratio(m.grads, pm.grads),
            ratio(m.optimizer, pm.optimizer),
            ratio(m.activations, pm.activations),
        );
    }
}
