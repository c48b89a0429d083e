//! A layout as what users launch: a complete job for Megatron-LM, Megatron-DeepSpeed or
//! torchtitan, started by `torchrun` on each node or by Slurm's `srun` (one task per GPU, with a
//! wrapper that sets the rank variables), or a TOML run file for exatrain's own tools.
//!
//! Each framework module turns (model, layout) into a [`Job`]: the environment the framework
//! needs, its entry point and flags, the placeholders the user fills in (data, tokenizer,
//! iterations, learning rate, checkpoints) and extra files. [`launch`] wraps a job for a launcher.
//! What a framework cannot express is refused by [`Framework::can_run`] with the reason.

mod deepspeed;
mod launch;
mod megatron_lm;
mod torchtitan;

use exatrain_spec::{ClusterSpec, Framework, ModelSpec, ParallelConfig, SpecError};

/// Output formats: a framework (launched with `--launcher`), `slurm` (Megatron-LM under Slurm,
/// the same as `megatron-lm --launcher slurm`), or exatrain's run file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Framework(Framework),
    Slurm,
    Exatrain,
}

impl std::str::FromStr for Format {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "slurm" => Ok(Format::Slurm),
            "exatrain" => Ok(Format::Exatrain),
            _ => s.parse().map(Format::Framework).map_err(|_| {
                SpecError::new(format!(
                    "--format {s} is not known (allowed: megatron-lm, megatron-deepspeed, torchtitan, slurm, exatrain)"
                ))
            }),
        }
    }
}

/// How the job's processes are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Launcher {
    /// `launch.sh`, run once per node: `torchrun --nnodes N --nproc-per-node P`.
    #[default]
    Torchrun,
    /// `job.sbatch` + `rank.sh`: `srun` with one task per GPU.
    Slurm,
}

impl std::str::FromStr for Launcher {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "torchrun" => Ok(Launcher::Torchrun),
            "slurm" => Ok(Launcher::Slurm),
            _ => Err(SpecError::new(format!(
                "--launcher {s} is not known (allowed: torchrun, slurm)"
            ))),
        }
    }
}

/// One file of an export.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    pub name: String,
    pub contents: String,
}

/// A framework's job, launcher-independent.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub framework: Framework,
    /// Environment every rank needs, with the reason (a comment) for each.
    pub env: Vec<(String, String, String)>,
    /// What each process runs after `python` (`pretrain_gpt.py`, `-m torchtitan.train`).
    pub program: String,
    /// The framework's flags, one per line (a flag and its value).
    pub flags: Vec<String>,
    /// Shell lines defining the placeholders the flags use (`$TRAIN_ITERS`, `$DATA_ARGS`…).
    pub placeholders: String,
    /// Where to run from (a comment).
    pub run_from: String,
    /// A variable the launcher sets to the folder holding the job's files (torchtitan imports
    /// its recipe from there), unless the user set it.
    pub job_dir_var: Option<&'static str>,
    pub files: Vec<File>,
}

/// Ranks per node and nodes: `nnodes × nproc = gpus` exactly, with as many ranks per node as
/// the node's devices allow (12 GPUs on 8-GPU nodes: 2 nodes of 6).
pub fn shape(gpus: u32, devices_per_node: u32) -> (u32, u32) {
    let per_node = (1..=devices_per_node.min(gpus).max(1))
        .rev()
        .find(|p| gpus.is_multiple_of(*p))
        .unwrap_or(1);
    (gpus / per_node, per_node)
}

/// A `--make-vocab-size-divisible-by` value for which the framework's padding (`vocab` rounded
/// up to a multiple of value × tp) gives exactly `padded`: the frameworks' default 128 when it
/// does, else the smallest that does.
pub fn vocab_divisor(vocab: u32, padded: u32, tp: u32) -> Result<u32, String> {
    if !padded.is_multiple_of(tp) {
        return Err(format!(
            "the planned vocabulary of {padded} rows cannot be split over tp {tp} (the frameworks pad to a multiple of tp)"
        ));
    }
    let per = padded / tp;
    let pads = |d: u32| vocab.div_ceil(d * tp) * d * tp == padded;
    if pads(128) {
        return Ok(128);
    }
    (1..=per)
        .filter(|d| per.is_multiple_of(*d))
        .find(|d| vocab.div_ceil(d * tp) * d * tp == padded)
        .ok_or_else(|| format!("no padding multiple turns vocab {vocab} into {padded} rows over tp {tp}"))
}

/// The flags Megatron-LM and Megatron-DeepSpeed spell alike, before the ones they spell
/// differently: sizes, and the head width when it is not hidden / heads.
fn megatron_shape_flags(m: &ModelSpec) -> Vec<String> {
    let mut f = vec![
        format!("--num-layers {}", m.layers),
        format!("--hidden-size {}", m.hidden),
        format!("--num-attention-heads {}", m.heads),
        format!("--ffn-hidden-size {}", m.ffn_hidden),
        format!("--seq-length {}", m.seq_len),
        format!("--max-position-embeddings {}", m.seq_len),
    ];
    if m.head_dim * m.heads != m.hidden {
        f.push(format!("--kv-channels {}", m.head_dim));
    }
    f
}

/// The flags both Megatrons spell alike, after the ones they spell differently: head tying,
/// biases, dropout, and the vocabulary padding that gives the planned rows.
fn megatron_tail_flags(m: &ModelSpec, tp: u32) -> Result<Vec<String>, String> {
    let mut f = Vec::new();
    if !m.tied_embeddings {
        f.push("--untie-embeddings-and-output-weights".into());
    }
    if !m.bias {
        f.push("--disable-bias-linear".into());
    }
    if !m.dropout {
        f.push("--attention-dropout 0".into());
        f.push("--hidden-dropout 0".into());
    }
    f.push(format!(
        "--make-vocab-size-divisible-by {}",
        vocab_divisor(m.vocab, m.padded_vocab, tp)?
    ));
    Ok(f)
}

/// Training flags whose values are the script's placeholders (both Megatrons), then `extra`.
fn megatron_training_flags(extra: &[&str]) -> Vec<String> {
    [
        "--train-iters $TRAIN_ITERS",
        "--lr $LR",
        "--min-lr $MIN_LR",
        "--lr-decay-style cosine",
        "--lr-warmup-fraction 0.01",
        "--weight-decay 0.1",
        "--clip-grad 1.0",
        "--adam-beta1 0.9",
        "--adam-beta2 0.95",
        "--init-method-std 0.02",
        "--save $CKPT_DIR",
        "--load $CKPT_DIR",
        "--save-interval $SAVE_INTERVAL",
        "--log-interval 1",
        "--eval-interval $TRAIN_ITERS",
        "--eval-iters 1",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

/// The shell lines defining the placeholders [`megatron_training_flags`] uses.
fn megatron_training_placeholders(name: &str) -> String {
    format!(
        "TRAIN_ITERS=${{TRAIN_ITERS:-100}}        # PLACEHOLDER: iterations of this run\n\
         LR=${{LR:-3e-4}}                        # PLACEHOLDER: peak learning rate\n\
         MIN_LR=${{MIN_LR:-3e-5}}                # PLACEHOLDER: final learning rate (cosine decay)\n\
         CKPT_DIR=${{CKPT_DIR:-checkpoints/{name}}}  # PLACEHOLDER: checkpoints (saved and resumed)\n\
         SAVE_INTERVAL=${{SAVE_INTERVAL:-1000}}  # PLACEHOLDER: iterations between checkpoints\n"
    )
}

/// Export a layout.
pub fn export(
    m: &ModelSpec,
    cl: &ClusterSpec,
    c: &ParallelConfig,
    format: Format,
    launcher: Launcher,
) -> Result<Vec<File>, SpecError> {
    c.check(m, c.gpus())?;
    if c.fp8 {
        // Transformer Engine's FP8 needs FP8 tensor cores: the job would fail at its first step
        cl.device.require_fp8()?;
    }
    let (framework, launcher) = match format {
        Format::Exatrain => return run_file(m, cl, c),
        Format::Slurm => (Framework::MegatronLm, Launcher::Slurm),
        Format::Framework(f) => (f, launcher),
    };
    framework
        .can_run(m, c)
        .map_err(|why| SpecError::new(format!("--format {framework}: {why}")))?;
    let job = match framework {
        Framework::MegatronLm => megatron_lm::job(m, c),
        Framework::MegatronDeepspeed => deepspeed::job(m, c),
        Framework::Torchtitan => torchtitan::job(m, c),
    }
    .map_err(|why| SpecError::new(format!("--format {framework}: {why}")))?;
    Ok(launch::files(m, cl, c, job, launcher))
}

/// exatrain's run file: what `export --format exatrain` writes, and what `plan --run` and
/// `calibrate --fit` (beside a framework log) read.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub model: ModelSpec,
    /// The cluster preset or file the layout was planned on.
    pub cluster: String,
    pub parallel: ParallelConfig,
}

impl RunFile {
    /// Read a run file; the error is one line.
    pub fn parse(text: &str) -> Result<RunFile, String> {
        toml::from_str(text).map_err(|e| {
            format!(
                "not a run file (`export --format exatrain`): {}",
                exatrain_spec::load::toml_error(text, &e)
            )
        })
    }
}

fn run_file(m: &ModelSpec, cl: &ClusterSpec, c: &ParallelConfig) -> Result<Vec<File>, SpecError> {
    let text = toml::to_string(&RunFile {
        model: m.clone(),
        cluster: cl.name.clone(),
        parallel: *c,
    })
    .map_err(|e| SpecError::new(format!("--format exatrain: {e}")))?;
    Ok(vec![File {
        name: "run.toml".into(),
        contents: format!(
            "# {} on {} GPUs: exported by exatrain; `exatrain plan --run run.toml` reads it\n{text}",
            m.name,
            c.gpus()
        ),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_fills_nodes_exactly() {
        assert_eq!(shape(12, 8), (2, 6));
        assert_eq!(shape(16, 8), (2, 8));
        assert_eq!(shape(4, 8), (1, 4));
        assert_eq!(shape(7, 4), (7, 1));
        assert_eq!(shape(1024, 8), (128, 8));
    }

    #[test]
    fn vocab_divisor_reproduces_the_planned_rows() {
        assert_eq!(vocab_divisor(50257, 50304, 8), Ok(6));
        assert_eq!(vocab_divisor(50257, 51200, 8), Ok(128));
        assert_eq!(vocab_divisor(51200, 51200, 8), Ok(128));
        assert_eq!(vocab_divisor(128256, 128256, 8), Ok(1));
        assert!(vocab_divisor(50257, 50304, 7).is_err());
        for (v, p, tp) in [(50257u32, 50304u32, 4u32), (32000, 32000, 2), (50257, 51200, 8)] {
            let d = vocab_divisor(v, p, tp).unwrap();
            assert_eq!(v.div_ceil(d * tp) * d * tp, p);
        }
    }
}
