//! 3D parallelism over in-process ranks trains what one process trains: for every
//! factorization of 8 ranks into (tp, pp, dp), and with ZeRO 0/1/2, recompute none/selective/
//! full, sequence parallel on and off, GPipe, 1F1B and interleaved schedules, the first 5 losses match the single-process run
//! within 1e-5 relative and the final parameters within 1e-4; the bytes moved match the
//! planner's; a failing rank stops the job with its message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exatrain_parallel::comm::in_process;
use exatrain_spec::{Dtype, ModelFile, ModelSpec, ParallelConfig, Recompute};
use exatrain_train::data;
use exatrain_train::parallel::{self, Options, RankResult, Schedule};
use exatrain_train::train::{TrainConfig, Trainer};
use exatrain_train::GptShape;

const CORPUS: &str = include_str!("../../../data/corpus/devils-dictionary.txt");

/// A fresh folder, removed with everything in it when the test ends.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("exatrain-3d-{name}-"))
        .tempdir()
        .expect("a folder under the system's temp dir")
}

/// 8 layers, 8 heads of width 4, vocabulary 300 padded to 304 (so tp shards end in padding).
fn spec() -> ModelSpec {
    ModelFile {
        name: Some("t3d".into()),
        layers: Some(8),
        hidden: Some(32),
        heads: Some(8),
        seq_len: Some(16),
        vocab: Some(300),
        padded_vocab: Some(304),
        ..Default::default()
    }
    .resolve("t3d")
    .unwrap()
}

fn dataset(dir: &Path) -> PathBuf {
    let src = dir.join("corpus.txt");
    let cut = CORPUS.char_indices().take_while(|(i, _)| *i < 30_000).last().unwrap().0;
    std::fs::write(&src, &CORPUS[..cut]).unwrap();
    let d = dir.join("data");
    data::prepare(&src, 300, &d).unwrap();
    d
}

fn cfg(mb: usize, gb: usize) -> TrainConfig {
    TrainConfig {
        steps: 5,
        micro_batch: mb,
        global_batch: gb,
        warmup: 2,
        lr: 3e-3,
        eval_every: 0,
        ckpt_every: 0,
        ..Default::default()
    }
}

fn run(pc: &ParallelConfig, sched: Schedule, data: &Path) -> Vec<Result<RankResult, String>> {
    run_buckets(pc, sched, 0, data)
}

/// [`run`] with data-parallel gradient buckets of `bucket_elems`.
fn run_buckets(
    pc: &ParallelConfig,
    sched: Schedule,
    bucket_elems: usize,
    data: &Path,
) -> Vec<Result<RankResult, String>> {
    let c = cfg(pc.micro_batch as usize, pc.global_batch as usize);
    let pc = &ParallelConfig {
        dp_bucket: Some(bucket_elems as u64),
        ..*pc
    };
    let ranks = in_process(pc.gpus() as usize, Duration::from_secs(20));
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|comm| {
                let c = c.clone();
                s.spawn(move || {
                    let opts = Options {
                        schedule: sched,
                        ..Default::default()
                    };
                    parallel::train(&spec(), &c, pc, &opts, data, &comm).map_err(|e| e.0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

struct Reference {
    losses: Vec<f64>,
    params: Vec<f32>,
}

fn reference(dir: &Path, data: &Path, mb: usize, gb: usize) -> Reference {
    let mut t = Trainer::new(spec(), cfg(mb, gb), data, &dir.join(format!("single-{mb}-{gb}"))).unwrap();
    let losses = (0..5).map(|_| t.train_step().unwrap().loss).collect();
    Reference {
        losses,
        params: t.model.params.clone(),
    }
}

fn layout(tp: u32, pp: u32, dp: u32, mb: u32, gb: u32) -> ParallelConfig {
    ParallelConfig {
        dtype: Dtype::Fp32,
        ..ParallelConfig::new(tp, pp, dp, mb, gb)
    }
}

/// Run `pc` (data-parallel buckets of `bucket_elems`) and assert it trains what one process
/// trained (`want`); its ranks' results.
fn trains_like_one_process(
    name: &str,
    pc: &ParallelConfig,
    sched: Schedule,
    bucket_elems: usize,
    data: &Path,
    want: &Reference,
) -> Vec<RankResult> {
    let results: Vec<RankResult> = run_buckets(pc, sched, bucket_elems, data)
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    assert_matches(name, pc, &results, want);
    results
}

fn assert_matches(name: &str, pc: &ParallelConfig, results: &[RankResult], want: &Reference) {
    for r in results {
        for (a, b) in r.losses.iter().zip(&want.losses) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{name}: losses {:?} vs one process {:?}",
                r.losses,
                want.losses
            );
        }
    }
    let shape = GptShape::from_spec(&spec()).unwrap();
    let dp0 = results.iter().filter(|r| r.report.dp == 0).flat_map(|r| &r.chunks);
    let got = parallel::whole_params(&shape, dp0);
    let worst = got
        .iter()
        .zip(&want.params)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "{name}: final parameters differ by {worst}");
    // every data-parallel replica ends with the same parameters
    for d in 1..pc.dp {
        let other = parallel::whole_params(
            &shape,
            results.iter().filter(|r| r.report.dp == d).flat_map(|r| &r.chunks),
        );
        assert_eq!(other, got, "{name}: dp rank {d} differs from dp rank 0");
    }
}

#[test]
fn every_factorization_of_8_ranks_trains_what_one_process_trains() {
    let scratch = tmp("fact");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 2, 16);
    let mut n = 0;
    for tp in [1u32, 2, 4, 8] {
        for pp in [1u32, 2, 4, 8] {
            if 8 % (tp * pp) != 0 {
                continue;
            }
            let dp = 8 / (tp * pp);
            let zero = if dp > 1 { (n % 3) as u8 } else { 0 };
            let pc = ParallelConfig {
                zero,
                ..layout(tp, pp, dp, 2, 16)
            };
            let name = format!("tp {tp} pp {pp} dp {dp} zero {zero}");
            trains_like_one_process(&name, &pc, Schedule::OneFOneB, 0, &data, &want);
            n += 1;
        }
    }
    assert_eq!(n, 10, "the ordered factorizations of 8 into three factors");
}

#[test]
fn zero_recompute_and_schedules_train_what_one_process_trains() {
    let scratch = tmp("opts");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 1, 16);
    let cases: Vec<(&str, ParallelConfig, Schedule)> = vec![
        (
            "tp2 pp2 dp2 ZeRO-2 selective",
            ParallelConfig {
                zero: 2,
                recompute: Recompute::Selective,
                ..layout(2, 2, 2, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "pp2 dp4 ZeRO-1 full GPipe",
            ParallelConfig {
                zero: 1,
                recompute: Recompute::Full,
                ..layout(1, 2, 4, 1, 16)
            },
            Schedule::GPipe,
        ),
        (
            "tp2 pp2 dp2 interleaved v2 ZeRO-1",
            ParallelConfig {
                zero: 1,
                virtual_stages: 2,
                ..layout(2, 2, 2, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "pp4 dp2 interleaved v2 full",
            ParallelConfig {
                virtual_stages: 2,
                recompute: Recompute::Full,
                ..layout(1, 4, 2, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "tp4 pp2 selective",
            ParallelConfig {
                recompute: Recompute::Selective,
                ..layout(4, 2, 1, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "tp2 pp2 dp2 SP ZeRO-1",
            ParallelConfig {
                zero: 1,
                sequence_parallel: true,
                ..layout(2, 2, 2, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "tp4 pp2 SP full",
            ParallelConfig {
                sequence_parallel: true,
                recompute: Recompute::Full,
                ..layout(4, 2, 1, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "tp2 pp2 dp2 SP interleaved selective ZeRO-2",
            ParallelConfig {
                zero: 2,
                sequence_parallel: true,
                virtual_stages: 2,
                recompute: Recompute::Selective,
                ..layout(2, 2, 2, 1, 16)
            },
            Schedule::OneFOneB,
        ),
        (
            "tp8 SP GPipe",
            ParallelConfig {
                sequence_parallel: true,
                ..layout(8, 1, 1, 1, 16)
            },
            Schedule::GPipe,
        ),
        (
            "dp8 ZeRO-2 full",
            ParallelConfig {
                zero: 2,
                recompute: Recompute::Full,
                ..layout(1, 1, 8, 1, 16)
            },
            Schedule::OneFOneB,
        ),
    ];
    for (name, pc, sched) in cases {
        trains_like_one_process(name, &pc, sched, 0, &data, &want);
    }
}

/// Flash attention and context parallelism train what one process trains (with the kept
/// probabilities): each CP rank's two chunks of every sequence at their positions, the keys and
/// values gathered over the group, the gradients reduced and ZeRO-sharded over dp · cp.
#[test]
fn flash_attention_and_context_parallelism_train_what_one_process_trains() {
    let scratch = tmp("cp");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 1, 16);
    let cp = |cp: u32, pc: ParallelConfig| ParallelConfig {
        cp,
        flash_attention: true,
        ..pc
    };
    let cases: Vec<(&str, ParallelConfig, Schedule)> = vec![
        ("flash, one rank", cp(1, layout(1, 1, 1, 1, 16)), Schedule::OneFOneB),
        (
            "flash tp2 pp2 dp2 selective",
            ParallelConfig {
                recompute: Recompute::Selective,
                ..cp(1, layout(2, 2, 2, 1, 16))
            },
            Schedule::OneFOneB,
        ),
        ("cp8", cp(8, layout(1, 1, 1, 1, 16)), Schedule::OneFOneB),
        (
            "cp2 dp4 ZeRO-1",
            ParallelConfig {
                zero: 1,
                ..cp(2, layout(1, 1, 4, 1, 16))
            },
            Schedule::OneFOneB,
        ),
        (
            "cp2 tp2 pp2 SP full",
            ParallelConfig {
                sequence_parallel: true,
                recompute: Recompute::Full,
                ..cp(2, layout(2, 2, 1, 1, 16))
            },
            Schedule::OneFOneB,
        ),
        (
            "cp4 pp2 interleaved v2",
            ParallelConfig {
                virtual_stages: 2,
                ..cp(4, layout(1, 2, 1, 1, 16))
            },
            Schedule::OneFOneB,
        ),
        (
            "cp2 tp2 dp2 ZeRO-2 rank order pp-dp-tp",
            ParallelConfig {
                zero: 2,
                order: "pp-dp-tp".parse().unwrap(),
                ..cp(2, layout(2, 1, 2, 1, 16))
            },
            Schedule::OneFOneB,
        ),
    ];
    for (name, pc, sched) in cases {
        let results = trains_like_one_process(name, &pc, sched, 0, &data, &want);
        if pc.cp > 1 {
            // the context-parallel ranks of a sequence end with the same weights
            let shape = GptShape::from_spec(&spec()).unwrap();
            let of = |c: u32| {
                parallel::whole_params(
                    &shape,
                    results
                        .iter()
                        .filter(|r| r.report.dp == 0 && r.report.cp == c)
                        .flat_map(|r| &r.chunks),
                )
            };
            assert_eq!(of(pc.cp - 1), of(0), "{name}: cp ranks differ");
        }
    }
}

#[test]
fn gradient_buckets_reduced_during_backward_train_what_one_process_trains() {
    let scratch = tmp("buckets");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 1, 16);
    // bucket_elems 1: every block is its own bucket, started as backward leaves it
    for (zero, overlap, pp, v, tp, sp) in [
        (0u8, true, 1u32, 1u32, 1u32, false),
        (0, false, 1, 1, 1, false),
        (1, true, 2, 1, 1, false),
        (2, true, 2, 2, 1, false),
        (1, true, 1, 1, 2, true),
        (2, false, 2, 1, 2, true),
    ] {
        let dp = 8 / (pp * tp);
        let pc = ParallelConfig {
            zero,
            overlap_dp: overlap,
            virtual_stages: v,
            sequence_parallel: sp,
            ..layout(tp, pp, dp, 1, 16)
        };
        let name = format!("{} overlap {overlap} (bucket per block)", parallel::describe(&pc));
        let results = trains_like_one_process(&name, &pc, Schedule::OneFOneB, 1, &data, &want);
        // the same bytes as one bucket per chunk, up to each bucket's padding to dp shards
        let one: Vec<RankResult> = run(&pc, Schedule::OneFOneB, &data)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let bytes = |r: &[RankResult]| {
            let reports: Vec<_> = r.iter().map(|x| x.report.clone()).collect();
            parallel::aggregate(&reports).comm_bytes.dp
        };
        let (many, single) = (bytes(&results), bytes(&one));
        let buckets = 8 / (pp * v) as usize + 1;
        let pad = 4.0 * (buckets * dp as usize) as f64 * 18.0;
        assert!(
            many > 0.0 && (many - single).abs() <= pad,
            "{name}: dp bytes {many} vs {single}"
        );
        if zero == 0 {
            assert_eq!(many, single, "{name}: all-reduce buckets have no padding");
        }
    }
}

#[test]
fn bytes_moved_and_held_match_the_planner() {
    let scratch = tmp("bytes");
    let dir = scratch.path();
    let data = dataset(dir);
    // bytes do not depend on the machine; priced as the trainer runs them (no framework)
    let cluster = exatrain_spec::presets::cluster("frontier").unwrap().for_trainer();
    let cases = [
        layout(2, 2, 2, 2, 16),
        ParallelConfig {
            zero: 1,
            ..layout(2, 1, 4, 1, 16)
        },
        ParallelConfig {
            zero: 2,
            recompute: Recompute::Full,
            ..layout(1, 2, 4, 1, 16)
        },
        ParallelConfig {
            virtual_stages: 2,
            ..layout(2, 4, 1, 1, 8)
        },
        ParallelConfig {
            recompute: Recompute::Selective,
            ..layout(4, 2, 1, 2, 8)
        },
        ParallelConfig {
            sequence_parallel: true,
            zero: 1,
            ..layout(2, 2, 2, 1, 16)
        },
        ParallelConfig {
            sequence_parallel: true,
            recompute: Recompute::Full,
            ..layout(4, 1, 2, 2, 16)
        },
        ParallelConfig {
            cp: 2,
            flash_attention: true,
            zero: 1,
            ..layout(2, 1, 2, 1, 16)
        },
        ParallelConfig {
            cp: 4,
            flash_attention: true,
            recompute: Recompute::Full,
            ..layout(1, 2, 1, 1, 16)
        },
    ];
    for pc in cases {
        let results: Vec<RankResult> = run(&pc, Schedule::OneFOneB, &data)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let reports: Vec<_> = results.iter().map(|r| r.report.clone()).collect();
        let got = parallel::aggregate(&reports);
        let (trained, as_planned) = parallel::as_trained(&spec(), &pc);
        let plan = exatrain_cost::plan(&trained, &cluster, &as_planned).unwrap();
        let name = parallel::describe(&pc);
        let (m, b) = (&got.memory_bytes, &got.comm_bytes);
        eprintln!(
            "{name}\n  tp {} vs {} | pp {} vs {} | dp {} vs {} | weights {} vs {} | grads {} vs {} | optimizer {} vs {} | activations {} vs {}",
            b.tp, plan.comm_bytes.tp, b.pp, plan.comm_bytes.pp, b.dp, plan.comm_bytes.dp,
            m.weights, plan.memory_bytes.weights, m.grads, plan.memory_bytes.grads,
            m.optimizer, plan.memory_bytes.optimizer, m.activations, plan.memory_bytes.activations
        );
        let close = |a: f64, b: f64, slack: f64| (a - b).abs() <= slack + 1e-9 * b.abs();
        assert!(
            close(b.tp, plan.comm_bytes.tp, 0.0),
            "{name}: tp bytes {} vs {}",
            b.tp,
            plan.comm_bytes.tp
        );
        assert!(
            close(b.cp, plan.comm_bytes.cp, 0.0),
            "{name}: cp bytes {} vs {}",
            b.cp,
            plan.comm_bytes.cp
        );
        assert!(
            close(b.pp, plan.comm_bytes.pp, 0.0),
            "{name}: pp bytes {} vs {}",
            b.pp,
            plan.comm_bytes.pp
        );
        // ZeRO pads each of (at most 2) regions to dp equal shards: a few elements per collective
        let pad = 4.0 * 2.0 * pc.dp as f64 * (pc.microbatches() as f64 + 2.0);
        assert!(
            close(b.dp, plan.comm_bytes.dp, if pc.zero > 0 { pad } else { 0.0 }),
            "{name}: dp bytes {} vs {}",
            b.dp,
            plan.comm_bytes.dp
        );
        assert_eq!(m.weights as f64, plan.memory_bytes.weights, "{name}: weights");
        assert!(
            close(
                m.optimizer as f64,
                plan.memory_bytes.optimizer,
                8.0 * 2.0 * pc.dp as f64
            ),
            "{name}: optimizer"
        );
        assert!(
            close(m.grads as f64, plan.memory_bytes.grads, 4.0 * 2.0 * pc.dp as f64),
            "{name}: grads"
        );
    }
}

#[test]
fn a_checkpoint_from_one_layout_resumes_exactly_on_another() {
    let scratch = tmp("resume");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 1, 16);
    let run_with = |pc: &ParallelConfig, start: Option<parallel::Start>| {
        let c = TrainConfig {
            ckpt_every: 3,
            ..cfg(1, 16)
        };
        let saved = std::sync::Mutex::new(Vec::new());
        let save = |s: &parallel::Start| {
            saved.lock().unwrap().push(s.clone());
            Ok(())
        };
        let ranks = in_process(pc.gpus() as usize, Duration::from_secs(20));
        let results: Vec<RankResult> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .into_iter()
                .map(|comm| {
                    let (c, start, save) = (c.clone(), start.clone(), &save);
                    let data = &data;
                    s.spawn(move || {
                        let opts = Options {
                            start,
                            on_checkpoint: Some(save),
                            ..Default::default()
                        };
                        parallel::train(&spec(), &c, pc, &opts, data, &comm).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (results, saved.into_inner().unwrap())
    };
    let a = ParallelConfig {
        zero: 1,
        ..layout(2, 2, 2, 1, 16)
    };
    let (_, saved) = run_with(&a, None);
    assert_eq!(
        saved.iter().map(|s| s.step).collect::<Vec<_>>(),
        [3, 5],
        "checkpoints at 3 and at the end"
    );
    let worst = saved[1]
        .params
        .iter()
        .zip(&want.params)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst < 1e-4,
        "the gathered final state is the model one process trains ({worst})"
    );
    // resume step 3's state on a different layout: ZeRO-2, 4 stages interleaved, no tp
    let b = ParallelConfig {
        zero: 2,
        virtual_stages: 2,
        ..layout(1, 4, 2, 1, 16)
    };
    let (results, saved_b) = run_with(&b, Some(saved[0].clone()));
    let got = &results[0].losses;
    assert_eq!(got.len(), 2, "steps 4 and 5 only");
    for (x, y) in got.iter().zip(&want.losses[3..]) {
        assert!(
            (x - y).abs() <= 1e-5 * y.abs(),
            "resumed losses {got:?} vs {:?}",
            &want.losses[3..]
        );
    }
    let worst = saved_b[0]
        .params
        .iter()
        .zip(&want.params)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "resumed final parameters differ by {worst}");
    assert_eq!(saved_b[0].opt_step, 5);
}

#[test]
fn a_failing_rank_stops_every_rank_with_its_message() {
    let scratch = tmp("fail");
    let dir = scratch.path();
    let data = dataset(dir);
    let missing = dir.join("no-such-data");
    let pc = layout(2, 2, 2, 1, 16);
    let c = cfg(1, 16);
    let ranks = in_process(8, Duration::from_secs(60));
    let t0 = std::time::Instant::now();
    let results: Vec<Result<RankResult, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let c = c.clone();
                // rank 5 is pointed at a folder that does not exist
                let d = if r == 5 { missing.clone() } else { data.clone() };
                let pc = &pc;
                s.spawn(move || parallel::train(&spec(), &c, pc, &Options::default(), &d, &comm).map_err(|e| e.0))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "stopped in {:?}, not at the 60 s timeout",
        t0.elapsed()
    );
    for (r, res) in results.iter().enumerate() {
        let e = res
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("rank {r} finished although rank 5 failed"));
        assert!(e.contains("no-such-data"), "rank {r}: {e}");
    }
}

/// Uneven pipeline stages (the planner's split of 8 layers over 3 stages: 2, 3, 3... or an
/// explicit first/last size) train what one process trains, with tp and dp too.
#[test]
fn uneven_pipeline_stages_train_what_one_process_trains() {
    let scratch = tmp("uneven");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 2, 16);
    for (tp, pp, dp, first, last) in [
        (1u32, 3u32, 1u32, None, None),
        (2, 3, 1, None, None),
        (1, 3, 2, Some(4), None),
        (1, 5, 1, None, Some(4)),
        (1, 2, 2, Some(3), Some(5)),
    ] {
        let pc = ParallelConfig {
            first_stage_layers: first,
            last_stage_layers: last,
            zero: if dp > 1 { 1 } else { 0 },
            ..layout(tp, pp, dp, 2, 16)
        };
        let split = pc.stage_layers(&spec()).unwrap();
        assert!(!split.even(), "{pc:?}");
        let name = format!(
            "tp {tp} pp {pp} dp {dp} stages {:?}",
            (0..pp).map(|s| split.of(s)).collect::<Vec<_>>()
        );
        trains_like_one_process(&name, &pc, Schedule::OneFOneB, 0, &data, &want);
    }
}

/// Interleaving over stages that count the embedding and the loss as layers (Megatron-LM's
/// `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`, as Llama 3
/// 405B's 126 layers on 16 stages): 8 layers on 5 stages (1, 2, 2, 2, 1), 2 chunks per stage of
/// one slot each, so the very first chunk holds only the embedding and the very last only the
/// head; it trains what one process trains, with tp too.
#[test]
fn interleaved_stages_counting_the_embedding_and_the_loss_train_what_one_process_trains() {
    let scratch = tmp("interleave-ends");
    let dir = scratch.path();
    let data = dataset(dir);
    let want = reference(dir, &data, 2, 20);
    for tp in [1u32, 2] {
        let pc = ParallelConfig {
            virtual_stages: 2,
            ..layout(tp, 5, 1, 2, 20)
        };
        pc.check(&spec(), pc.gpus()).unwrap();
        let split = pc.stage_layers(&spec()).unwrap();
        assert!(split.accounts_for_ends(), "{split:?}");
        let chunks: Vec<_> = (0..10).map(|k| split.chunk_range(k, 2)).collect();
        assert_eq!(chunks[0], 0..0);
        assert_eq!(chunks[1], 0..1);
        assert_eq!(chunks[9], 8..8);
        assert!(chunks.windows(2).all(|w| w[0].end == w[1].start), "{chunks:?}");
        let name = format!("tp {tp} pp 5 v 2 chunks {chunks:?}");
        trains_like_one_process(&name, &pc, Schedule::OneFOneB, 0, &data, &want);
    }
}
