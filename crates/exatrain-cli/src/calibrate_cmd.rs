//! `exatrain calibrate`: measure this machine and write it as a cluster spec.

use std::path::PathBuf;

use clap::Args;
use exatrain_spec::{presets, Dtype, ParallelConfig, SpecError};
use exatrain_train::calibrate;
use exatrain_tune::store::write_atomic;

#[derive(Args)]
pub struct CalibrateArgs {
    /// Write the measured machine as a cluster TOML that `plan` and `tune` accept (--cluster FILE).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Fewer and smaller benchmarks (seconds instead of tens of seconds).
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub json: bool,
}

fn memory_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(16.0, |kib| kib / 1048576.0)
}

pub fn run(a: CalibrateArgs) -> Result<(), SpecError> {
    let c = calibrate::calibrate(memory_gib(), a.quick);
    c.spec.validate()?;
    // The planner on this machine, for the trainer's bench config (compare with `cargo bench -p exatrain-train`).
    let bench = presets::model("bench")?;
    let cfg = ParallelConfig {
        dtype: Dtype::Fp32,
        ..ParallelConfig::new(1, 1, 1, 8, 8)
    };
    let p = exatrain_cost::plan(&bench, &c.spec, &cfg)?;
    if let Some(out) = &a.out {
        let text = toml::to_string(&c.spec).map_err(|e| SpecError::new(format!("--out {}: {e}", out.display())))?;
        let header = format!(
            "# Measured by `exatrain calibrate` on this machine ({} threads): fp32 GEMM peak {:.1} GFLOP/s,\n# memory {:.1} GB/s; GEMM curve fitted on {} shapes (median error {:.1} %).\n",
            c.threads,
            c.peak_gflops,
            c.memory_gbps,
            c.gemm.len(),
            100.0 * c.fit_error
        );
        write_atomic(out, format!("{header}{text}").as_bytes())?;
    }
    if a.json {
        let mut v = serde_json::to_value(&c).expect("json");
        v["bench_prediction"] =
            serde_json::json!({"step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s, "time_s": p.time_s});
        println!("{v}");
        return Ok(());
    }
    println!("{:>6} {:>6} {:>6} {:>10} {:>10}", "m", "n", "k", "GFLOP/s", "fitted");
    for g in &c.gemm {
        println!(
            "{:>6} {:>6} {:>6} {:>10.1} {:>10.1}",
            g.m,
            g.n,
            g.k,
            g.gflops,
            c.peak_gflops * c.fit.efficiency(g.m as f64, g.n as f64, g.k as f64)
        );
    }
    println!(
        "\nfp32 GEMM peak {:.1} GFLOP/s; curve max_efficiency {:.3}, half_size {:.0} (median error {:.1} %); memory {:.1} GB/s; {} threads",
        c.peak_gflops,
        c.fit.max_efficiency,
        c.fit.half_size,
        100.0 * c.fit_error,
        c.memory_gbps,
        c.threads
    );
    println!(
        "planner on this machine, bench config (6×384, seq 256, batch 8, fp32): {:.3} s/step, {:.0} tokens/s",
        p.step_time_s, p.tokens_per_s
    );
    if let Some(out) = &a.out {
        println!("wrote {} (use: exatrain plan --cluster {0} ...)", out.display());
    }
    Ok(())
}
