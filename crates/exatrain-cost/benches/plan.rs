//! How many layouts per second the planner's core evaluates on one core.
//! Run: `cargo bench -p exatrain-cost --bench plan`.

use std::hint::black_box;
use std::time::Instant;

use exatrain_cost::plan;
use exatrain_spec::{presets, ParallelConfig, Recompute};

fn main() {
    println!(
        "{:<10} {:<10} {:>10} {:>14} {:>10}",
        "model", "cluster", "configs", "configs/s", "ns/config"
    );
    for (model, cluster, gpus) in [
        ("gpt-22b", "frontier", 1024u32),
        ("gpt-175b", "frontier", 1024),
        ("gpt-1t", "frontier", 3072),
        ("llama3-70b", "dgx-h100", 1024),
    ] {
        let m = presets::model(model).unwrap();
        let c = presets::cluster(cluster).unwrap();
        // A fixed mix of valid layouts, evaluated round-robin.
        let mut cfgs = Vec::new();
        for tp in [1u32, 2, 4, 8] {
            for pp in [1u32, 2, 4, 8, 16] {
                if gpus % (tp * pp) != 0 {
                    continue;
                }
                let dp = gpus / (tp * pp);
                for recompute in Recompute::ALL {
                    for zero in 0..=3u8 {
                        let cfg = ParallelConfig {
                            zero,
                            recompute,
                            ..ParallelConfig::new(tp, pp, dp, 1, dp * 8)
                        };
                        if plan(&m, &c, &cfg).is_ok() {
                            cfgs.push(cfg);
                        }
                    }
                }
            }
        }
        let n = 2_000_000usize;
        let t0 = Instant::now();
        let mut acc = 0.0;
        for i in 0..n {
            let p = plan(black_box(&m), black_box(&c), black_box(&cfgs[i % cfgs.len()])).unwrap();
            acc += p.step_time_s;
        }
        let dt = t0.elapsed().as_secs_f64();
        black_box(acc);
        println!(
            "{:<10} {:<10} {:>10} {:>14.0} {:>10.0}",
            model,
            cluster,
            n,
            n as f64 / dt,
            dt / n as f64 * 1e9
        );
    }
}
