//! Tuning over a real framework: each trial is the exported job of its layout (Megatron-LM,
//! Megatron-DeepSpeed or torchtitan, under torchrun or Slurm), run for a few iterations in its
//! own folder; its throughput and out-of-memory come from the framework's log. The study's
//! DeepHyper-on-Frontier loop, with exatrain's search and exporter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exatrain_export::{export, Format, Launcher};
use exatrain_spec::{ClusterSpec, Framework, ModelSpec, ParallelConfig};

use crate::eval::{looks_like_oom, run_shell, tail, Evaluator, Outcome};
use crate::logs;

/// Logged iterations skipped before timing.
pub const WARMUP: usize = 2;

/// The framework evaluator.
pub struct FrameworkEval {
    pub framework: Framework,
    pub launcher: Launcher,
    pub model: ModelSpec,
    pub cluster: ClusterSpec,
    /// Trials are written to `dir/trial-N/` (the job's files and `trial.log`).
    pub dir: PathBuf,
    /// Iterations each trial trains (`TRAIN_ITERS`); the first [`WARMUP`] are not timed.
    pub trial_steps: u64,
    pub timeout: Duration,
}

fn write_job(dir: &Path, files: &[exatrain_export::File]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for f in files {
        std::fs::write(dir.join(&f.name), &f.contents)?;
        #[cfg(unix)]
        if f.name.ends_with(".sh") || f.name.ends_with(".sbatch") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(&f.name), std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

impl FrameworkEval {
    /// The folder of one trial.
    pub fn trial_dir(&self, trial: u64) -> PathBuf {
        self.dir.join(format!("trial-{trial}"))
    }
}

impl Evaluator for FrameworkEval {
    fn evaluate(&self, cfg: &ParallelConfig, trial: u64) -> Outcome {
        let files = match export(
            &self.model,
            &self.cluster,
            cfg,
            Format::Framework(self.framework),
            self.launcher,
        ) {
            Ok(f) => f,
            Err(e) => return Outcome::Failed { message: e.to_string() },
        };
        let dir = self.trial_dir(trial);
        if let Err(e) = write_job(&dir, &files) {
            return Outcome::Failed {
                message: format!("{}: cannot write the job: {e}", dir.display()),
            };
        }
        let script = match self.launcher {
            Launcher::Torchrun => "launch.sh",
            Launcher::Slurm => "job.sbatch",
        };
        let env = [
            ("TRAIN_ITERS".to_string(), self.trial_steps.to_string()),
            ("CKPT_DIR".to_string(), dir.join("checkpoints").display().to_string()),
            ("SAVE_INTERVAL".to_string(), (self.trial_steps + 1).to_string()),
            ("SLURM_SUBMIT_DIR".to_string(), dir.display().to_string()),
        ];
        let ran = run_shell(&format!("bash {script}"), Some(&dir), &env, self.timeout);
        let (success, code, out, err) = match ran.exited(self.timeout) {
            Ok(r) => r,
            Err(outcome) => return outcome,
        };
        let all = format!("{out}\n{err}");
        let _ = std::fs::write(dir.join("trial.log"), &all);
        let parsed = logs::parse(&all);
        let oom = parsed.as_ref().map_or(looks_like_oom(&all), |l| l.out_of_memory);
        if oom {
            return Outcome::OutOfMemory { message: tail(&all, 2) };
        }
        let log = match parsed {
            Ok(l) => l,
            Err(why) => {
                return Outcome::Failed {
                    message: format!(
                        "exit {}: {why}: {}",
                        code.map_or("signal".into(), |c| c.to_string()),
                        tail(&all, 3)
                    ),
                }
            }
        };
        if !success {
            return Outcome::Failed {
                message: format!(
                    "exit {}: {}",
                    code.map_or("signal".into(), |c| c.to_string()),
                    tail(&all, 3)
                ),
            };
        }
        let tokens = cfg.global_batch as f64 * self.model.seq_len as f64;
        let steps = log.step_times(WARMUP, tokens, cfg.gpus());
        if steps.is_empty() {
            return Outcome::Failed {
                message: format!("{} logged no timed iteration", self.framework),
            };
        }
        Outcome::Ok {
            value: tokens / crate::median(&steps),
        }
    }
}
