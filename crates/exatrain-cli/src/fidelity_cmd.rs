//! `exatrain fidelity`: the planner against measured trainer runs, term by term.

use std::path::PathBuf;

use clap::Args;
use exatrain_spec::SpecError;
use exatrain_study::fidelity;

#[derive(Args)]
pub struct FidelityArgs {
    /// A folder of `exatrain train --report` JSON files (or one such file).
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
}

pub fn run(a: FidelityArgs) -> Result<(), SpecError> {
    let files: Vec<PathBuf> = if a.runs.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&a.runs)
            .map_err(|e| SpecError::new(format!("--runs {}: {e}", a.runs.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        v.sort();
        v
    } else if a.runs.is_file() {
        vec![a.runs.clone()]
    } else {
        return Err(SpecError::new(format!(
            "--runs {}: no such file or folder",
            a.runs.display()
        )));
    };
    if files.is_empty() {
        return Err(SpecError::new(format!(
            "--runs {}: no .json reports (write them with `exatrain train --report FILE`)",
            a.runs.display()
        )));
    }
    let mut runs = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| SpecError::new(format!("{}: {e}", f.display())))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| SpecError::new(format!("{}: not JSON: {e}", f.display())))?;
        let name = f.file_stem().map_or("run".into(), |s| s.to_string_lossy().into_owned());
        runs.push((name, v));
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
