//! The run folder's edges, shared by both training engines: a folder that holds a run is never
//! overwritten by accident (`claim`), `metrics.jsonl` holds each step once (`Progress` cuts it
//! back to the resumed step), progress looks the same on one rank and many, and a run whose
//! bytes exceed the machine's available memory is refused before anything is allocated.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use exatrain_spec::{ModelSpec, ParallelConfig, SpecError};
use exatrain_train::checkpoint;

const METRICS: &str = "metrics.jsonl";

/// What in `dir` shows that it holds a run, if anything.
pub fn holds_run(dir: &Path) -> Option<String> {
    let ckpts = checkpoint::list(dir);
    if let Some((step, name)) = ckpts.last() {
        return Some(format!("checkpoint {name} (step {step})"));
    }
    if dir.join("latest").exists() {
        return Some("a `latest` checkpoint pointer".into());
    }
    let metrics = dir.join(METRICS);
    if metrics.is_file() {
        let n = std::fs::read_to_string(&metrics).map_or(0, |s| s.lines().count());
        return Some(format!("{METRICS} with {n} steps"));
    }
    None
}

/// Make `out` the folder of a new run: refused if it holds one, unless `overwrite`, which
/// removes its checkpoints, `latest` and metrics (the tokenized data is kept and reused).
pub fn claim(out: &Path, overwrite: bool) -> Result<(), SpecError> {
    let Some(what) = holds_run(out) else {
        return Ok(());
    };
    if !overwrite {
        return Err(SpecError::new(format!(
            "--out {}: holds a run ({what}); continue it with --resume {0}, or start over with --overwrite (deletes its checkpoints and metrics)",
            out.display()
        )));
    }
    let rm = |p: PathBuf| -> Result<(), SpecError> {
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(SpecError::new(format!("--overwrite: {}: {e}", p.display())))
            }
            _ => Ok(()),
        }
    };
    // `latest` first, so a crash part-way leaves no pointer to a removed checkpoint
    rm(out.join("latest"))?;
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("ckpt-") {
            rm(entry.path())?;
        }
    }
    rm(out.join(METRICS))
}

/// Keep the lines of `metrics.jsonl` in `dir` up to step `through` (a resumed run repeats the
/// steps after its checkpoint); written to a temporary file and renamed.
fn cut_metrics(dir: &Path, through: u64) -> Result<(), SpecError> {
    let path = dir.join(METRICS);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= through)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    exatrain_tune::store::write_atomic(&path, kept.as_bytes())
}

/// Per-step output: a line appended to `metrics.jsonl`, and on the terminal either a JSON line
/// on stdout (`--json`) or a progress bar with the loss and throughput.
pub struct Progress {
    bar: indicatif::ProgressBar,
    json: bool,
    metrics: Mutex<std::fs::File>,
}

impl Progress {
    /// Output for a run in `dir` from step `start` to `total`.
    pub fn new(dir: &Path, start: u64, total: u64, json: bool) -> Result<Progress, SpecError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| SpecError::new(format!("--out {}: cannot create: {e}", dir.display())))?;
        cut_metrics(dir, start)?;
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(METRICS))
            .map_err(|e| SpecError::new(format!("{}: {e}", dir.join(METRICS).display())))?;
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("template"));
        bar.set_position(start);
        if json {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        Ok(Progress {
            bar,
            json,
            metrics: Mutex::new(metrics),
        })
    }

    /// One finished step: its JSON line and its one-line summary.
    pub fn step(&self, step: u64, line: &serde_json::Value, summary: String) -> Result<(), SpecError> {
        let text = line.to_string();
        writeln!(self.metrics.lock().expect("metrics lock"), "{text}")
            .map_err(|e| SpecError::new(format!("{METRICS}: {e}")))?;
        if self.json {
            println!("{text}");
        } else {
            self.bar.set_position(step);
            self.bar.set_message(summary);
        }
        Ok(())
    }

    /// A message above the bar (or to stderr when there is none).
    pub fn say(&self, s: String) {
        if self.bar.is_hidden() {
            eprintln!("{s}")
        } else {
            self.bar.println(s)
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Bytes one rank of `pc` holds, as the planner counts them (weights, gradients, optimizer,
/// activations) plus the logits and their gradient, which the trainer keeps in fp32.
pub fn rank_bytes(spec: &ModelSpec, pc: &ParallelConfig) -> Result<f64, SpecError> {
    let (trained, layout) = exatrain_train::parallel::as_trained(spec, pc);
    let cluster = exatrain_spec::load::cluster("frontier")?.for_trainer();
    let p = exatrain_cost::plan(&trained, &cluster, &layout)?;
    let m = &p.memory_bytes;
    let logits = 2.0 * 4.0 * pc.micro_batch as f64 * spec.seq_len as f64 * spec.padded_vocab as f64 / pc.tp as f64;
    Ok(m.weights + m.grads + m.optimizer + m.activations + logits)
}

/// The memory this machine can still give, bytes (`MemAvailable`), if known.
fn available_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// Refuse a run whose `ranks_here` ranks of `pc` need more than the machine has available.
pub fn check_memory(spec: &ModelSpec, pc: &ParallelConfig, ranks_here: usize) -> Result<(), SpecError> {
    let per_rank = rank_bytes(spec, pc)?;
    let need = per_rank * ranks_here as f64;
    let Some(have) = available_bytes() else {
        return Ok(());
    };
    if need > have {
        let gib = |x: f64| x / (1u64 << 30) as f64;
        return Err(SpecError::new(format!(
            "memory: the run needs ≈ {:.2} GiB ({} rank(s) × {:.2} GiB: weights, gradients, AdamW, activations, logits) but this machine has {:.2} GiB available; lower --micro-batch, use --recompute full, or split the model with --tp/--pp",
            gib(need),
            ranks_here,
            gib(per_rank),
            gib(have)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder, removed with everything in it when the test ends.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("exatrain-runfolder-{name}-"))
            .tempdir()
            .expect("a folder under the system's temp dir")
    }

    #[test]
    fn a_folder_with_a_run_is_claimed_only_with_overwrite() {
        let scratch = tmp("claim");
        let d = scratch.path();
        assert!(claim(d, false).is_ok());
        std::fs::write(d.join(METRICS), "{\"step\":1}\n").unwrap();
        let e = claim(d, false).unwrap_err().0;
        assert!(e.contains("--resume") && e.contains("--overwrite"), "{e}");
        std::fs::create_dir_all(d.join("data")).unwrap();
        claim(d, true).unwrap();
        assert!(holds_run(d).is_none() && d.join("data").is_dir());
    }

    #[test]
    fn metrics_are_cut_back_to_the_resumed_step() {
        let scratch = tmp("metrics");
        let d = scratch.path();
        let lines: String = (1..=5).map(|s| format!("{{\"step\":{s}}}\n")).collect();
        std::fs::write(d.join(METRICS), lines).unwrap();
        let p = Progress::new(d, 3, 6, true).unwrap();
        p.step(4, &serde_json::json!({"step": 4}), String::new()).unwrap();
        let steps: Vec<u64> = std::fs::read_to_string(d.join(METRICS))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, vec![1, 2, 3, 4]);
    }
}
