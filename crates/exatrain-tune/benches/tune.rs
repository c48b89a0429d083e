//! Tuner benchmarks. Run: `cargo bench -p exatrain-tune --bench tune`.
//! 1. Exhaustive search over the whole space: layouts evaluated and per second.
//! 2. Bayesian vs random search with the cost model as the black box: trials to reach within 2 %
//!    of the exhaustive optimum (median over 10 seeds).

use std::time::Instant;

use exatrain_spec::presets;
use exatrain_tune::bayes::{self, Settings, Strategy};
use exatrain_tune::eval::CostModel;
use exatrain_tune::exhaustive;
use exatrain_tune::median;
use exatrain_tune::space::{self, SpaceSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    println!(
        "## exhaustive search (whole space, rayon on {} threads)",
        rayon::current_num_threads()
    );
    println!(
        "{:<10} {:<9} {:>6} {:>6} {:>10} {:>9} {:>9} {:>12}",
        "model", "cluster", "gpus", "gbs", "layouts", "feasible", "seconds", "layouts/s"
    );
    for (model, cluster, gpus, gbs) in [
        ("gpt-22b", "frontier", 128u32, 1024u32),
        ("gpt-175b", "frontier", 1024, 1024),
        ("gpt-1t", "frontier", 3072, 3072),
        ("llama3-405b", "dgx-h100", 2048, 2048),
    ] {
        let m = presets::model(model).unwrap();
        let c = presets::cluster(cluster).unwrap();
        let s = SpaceSpec::new(gpus, gbs);
        let t0 = Instant::now();
        let r = exhaustive::search(&m, &c, &s, 10, &|_| {});
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "{:<10} {:<9} {:>6} {:>6} {:>10} {:>9} {:>9.3} {:>12.0}",
            model,
            cluster,
            gpus,
            gbs,
            r.evaluated,
            r.feasible,
            dt,
            r.evaluated as f64 / dt
        );
    }

    let seeds: u64 = if quick { 3 } else { 10 };
    let budget = 100;
    println!("\n## black-box search with the cost model as the objective ({seeds} seeds, budget {budget})");
    println!(
        "{:<10} {:>6} {:>8} {:>5} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "model", "gpus", "space", "<2%", "strategy", "trials→2%", "trials→5%", "trials→10%", "best@30", "best@100"
    );
    for (model, gpus, gbs) in [
        ("gpt-22b", 128u32, 1024u32),
        ("gpt-175b", 1024, 1024),
        ("gpt-1t", 3072, 3072),
    ] {
        let m = presets::model(model).unwrap();
        let c = presets::cluster("frontier").unwrap();
        let s = SpaceSpec::new(gpus, gbs);
        let space: Vec<_> = space::configs(&m, &s).collect();
        let top = exhaustive::search(&m, &c, &s, 1000, &|_| {});
        let optimum = top.best[0].plan.tokens_per_s;
        let near = top
            .best
            .iter()
            .filter(|r| r.plan.tokens_per_s >= 0.98 * optimum)
            .count();
        let eval = CostModel { model: &m, cluster: &c };
        // bayes: the GP's mean is the textbook trend fitted to the trials; bayes-flat: a constant
        // mean (the ablation, `tune --no-trend`)
        for (name, strategy, trend) in [
            ("bayes", Strategy::Bayes, true),
            ("bayes-flat", Strategy::Bayes, false),
            ("random", Strategy::Random, false),
        ] {
            use rayon::prelude::*;
            // one row per seed: trials to 2 %, 5 %, 10 %, best after 30 and 100 trials
            let rows: Vec<[f64; 5]> = (0..seeds)
                .into_par_iter()
                .map(|seed| {
                    let t = bayes::run(
                        &space,
                        &eval,
                        &Settings {
                            encoding: Some(bayes::Encoding::new(&m, &c)),
                            trend,
                            ..Settings::new(strategy, budget, seed)
                        },
                        Vec::new(),
                        &mut |_| Ok(()),
                    )
                    .unwrap();
                    let reach = |tol| bayes::trials_to_reach(&t, optimum, tol).map_or(f64::INFINITY, |n| n as f64);
                    let best_at =
                        |k: usize| t.iter().take(k).filter_map(|x| x.outcome.value()).fold(0.0, f64::max) / optimum;
                    [reach(0.02), reach(0.05), reach(0.10), best_at(30), best_at(100)]
                })
                .collect();
            let col = |k: usize| rows.iter().map(|r| r[k]).collect::<Vec<f64>>();
            let (to2, to5, to10, at30, at100) = (col(0), col(1), col(2), col(3), col(4));
            let show = |v: Vec<f64>| {
                let m = median(&v);
                if m.is_finite() {
                    format!("{m:.0}")
                } else {
                    format!(">{budget}")
                }
            };
            println!(
                "{:<10} {:>6} {:>8} {:>5} {:<10} {:>10} {:>10} {:>10} {:>9.1}% {:>9.1}%",
                model,
                gpus,
                space.len(),
                near,
                name,
                show(to2),
                show(to5),
                show(to10),
                100.0 * median(&at30),
                100.0 * median(&at100)
            );
        }
    }
}
