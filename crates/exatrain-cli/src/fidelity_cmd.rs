//! `exatrain fidelity`: the planner against measured trainer runs, term by term.

use std::path::PathBuf;

use clap::Args;
use exatrain_spec::SpecError;
use exatrain_study::fidelity;

use crate::reports;

#[derive(Args)]
pub struct FidelityArgs {
    /// A folder of `exatrain train --report` JSON files or framework logs (Megatron-LM,
    /// Megatron-DeepSpeed, torchtitan; .log/.out/.txt with their run file), or one such file.
    /// Logs are compared on their step time and peak memory, predicted on --cluster.
    #[arg(long)]
    pub runs: PathBuf,
    /// Flag terms whose relative error exceeds this.
    #[arg(long, default_value_t = 0.1)]
    pub tolerance: f64,
    /// Also write an HTML page with a predicted-vs-measured scatter plot.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
    /// Predict with this cluster (preset or TOML, e.g. one `exatrain calibrate --fit` wrote)
    /// instead of the prediction each report carries.
    #[arg(long)]
    pub cluster: Option<String>,
}

pub fn run(a: FidelityArgs) -> Result<(), SpecError> {
    exatrain_train::train::check_range(
        "--tolerance",
        a.tolerance,
        0.0,
        1e6,
        "a relative error ≥ 0 (0.1 = 10 %)",
    )?;
    let files = reports::files(&a.runs, "--runs")?;
    let (logs, jsons) = crate::framework_logs::split(files);
    let mut runs = reports::read(&jsons)?;
    let cluster = a.cluster.as_deref().map(exatrain_spec::load::cluster).transpose()?;
    if let Some(cluster) = &cluster {
        for (name, v) in &mut runs {
            reports::replan(name, v, cluster)?;
        }
    }
    for f in &logs {
        let cluster = cluster.as_ref().ok_or_else(|| {
            SpecError::new(format!(
                "--runs: {} is a framework log: say which machine it ran on with --cluster",
                f.display()
            ))
        })?;
        let (run, log) = crate::framework_logs::measured(f, None)?;
        // priced as the framework that wrote the log runs it, with the switches its arguments
        // print, as `calibrate --fit` fits it
        let cluster = &run.cluster_as_run(cluster);
        let p = exatrain_cost::plan(&run.model, cluster, &run.layout)
            .map_err(|e| SpecError::new(format!("log {}: {e}", run.name)))?;
        runs.push((
            run.name.clone(),
            serde_json::json!({
                "framework_log": log.format,
                "model": run.model.name,
                "cluster": cluster.name,
                "layout": run.layout,
                "measured": { "step_s": run.step_s, "memory_peak_bytes": log.max_memory_bytes },
                "planned": reports::planned(&p),
            }),
        ));
    }
    let fid = fidelity::compare(&runs, a.tolerance).map_err(SpecError::new)?;
    if let Some(out) = &a.out {
        exatrain_tune::store::write_atomic(out, fidelity::html(&fid).as_bytes())?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&fid).expect("json"));
        return Ok(());
    }
    println!(
        "{:<12} {:<20} {:>14} {:>14} {:>9}",
        "run", "term", "predicted", "measured", "error"
    );
    for r in &fid.rows {
        let e = r.rel_error.map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e));
        println!(
            "{:<12} {:<20} {:>14.4e} {:>14.4e} {:>9}{}",
            r.run,
            r.term,
            r.predicted,
            r.measured,
            e,
            if r.flagged { "  <-- off" } else { "" }
        );
    }
    println!();
    println!(
        "{:<20} {:>5} {:>14} {:>11} {:>8}",
        "term", "runs", "median |err|", "max |err|", "flagged"
    );
    for t in &fid.summary {
        println!(
            "{:<20} {:>5} {:>13.1}% {:>10.1}% {:>8}",
            t.term,
            t.runs,
            100.0 * t.median_abs_error,
            100.0 * t.max_abs_error,
            t.flagged
        );
    }
    Ok(())
}
