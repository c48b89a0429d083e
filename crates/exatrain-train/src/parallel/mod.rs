//! 3D-parallel training over any [`Communicator`]: the planner's [`ParallelConfig`] run as is.
//!
//! Rank `r` sits at (tp, dp, pp) = `pc.coords(r)`; groups are split from the world by the rank
//! grid. Each rank holds `virtual_stages` model chunks ([`Part`]s): chunk `c` of pipeline rank
//! `p` is virtual stage `c·pp + p`, owning layers `[s·L/(pp·v), (s+1)·L/(pp·v))`, the first
//! stage the embedding, the last the head and loss, each cut into the rank's tensor-parallel
//! shard. One executor runs the pipeline schedule ([`exatrain_parallel::schedule`]) — a list of
//! (microbatch, chunk, forward|backward) steps — sending activations forward and their gradients
//! back between neighbouring stages. Then the data-parallel reduction (ZeRO 0, 1 or 2), the tied
//! embedding's reduction between the first and the last stage, clipping to the global norm
//! across every rank, and AdamW on the rank's (sharded) state.
//!
//! With fp32, the same seed and data, every layout trains what one process trains, up to the
//! order of floating-point sums: tested for every factorization of 8 ranks.

mod executor;
mod groups;
mod zero;

use std::path::{Path, PathBuf};

use exatrain_cost::Times;
use exatrain_parallel::comm::{CommError, Communicator};
use exatrain_spec::{ModelSpec, ParallelConfig, SpecError};
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Cpu};
use crate::model::{GptShape, Part};
use crate::train::TrainConfig;

/// The pipeline schedule when `virtual_stages` is 1 (more than 1 always runs interleaved 1F1B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// All forwards, then all backwards.
    #[serde(rename = "gpipe")]
    GPipe,
    /// One forward, one backward after a warm-up (Megatron's default).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl std::str::FromStr for Schedule {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" => Ok(Schedule::OneFOneB),
            _ => Err(SpecError::new(format!(
                "--schedule {s} is not known (allowed: gpipe, 1f1b)"
            ))),
        }
    }
}

/// The whole model's training state, in the single-process layout ([`crate::model::ParamLayout::new`]):
/// what a checkpoint holds, whatever layout wrote it, so a run resumes on any other layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// optimizer steps completed
    pub step: u64,
    /// AdamW's bias-correction step
    pub opt_step: u64,
    pub params: Vec<f32>,
    /// AdamW moments
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    /// the lowest training loss so far (the divergence guard's reference)
    pub min_loss: Option<f64>,
}

/// One finished step, as world rank 0 sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepLine {
    /// 1-based
    pub step: u64,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub seconds: f64,
    pub tokens_per_s: f64,
    /// at evaluation steps (`eval_every` and the last): the validation loss and the sample of
    /// the whole model, as one process computes them
    pub val_loss: Option<f64>,
    pub sample: Option<String>,
}

/// How to run besides the layout.
#[derive(Default)]
pub struct Options<'a> {
    pub schedule: Schedule,
    /// resume from this state (its `step` is the first step to run)
    pub start: Option<Start>,
    /// called on world rank 0 with the whole state every `ckpt_every` steps and after the last
    /// (all ranks take part in gathering it)
    #[allow(clippy::type_complexity)]
    pub on_checkpoint: Option<&'a (dyn Fn(&Start) -> Result<(), SpecError> + Sync)>,
    /// called on world rank 0 after every step
    pub on_step: Option<&'a (dyn Fn(&StepLine) + Sync)>,
    /// called on world rank 0 with the whole state at evaluation steps (every `eval_every` and
    /// the last; all ranks take part in gathering it): the validation loss and a sample
    #[allow(clippy::type_complexity)]
    pub on_eval: Option<&'a (dyn Fn(&Start) -> Result<(f64, Option<String>), SpecError> + Sync)>,
    /// called on world rank 0 when the divergence guard stops the run, with the first step
    /// whose checkpoint gave the bad loss; returns the checkpoint that is still good
    #[allow(clippy::type_complexity)]
    pub on_diverge: Option<&'a (dyn Fn(u64) -> Result<Option<PathBuf>, SpecError> + Sync)>,
}

/// Bytes one rank sends per step in each collective kind (ring count, as the planner's
/// `comm_bytes`: an all-reduce of M bytes over n ranks sends 2(n−1)/n·M).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CommBytes {
    pub tp: f64,
    pub pp: f64,
    pub dp: f64,
    /// the tied embedding's gradient between the first and the last stage (pp > 1)
    pub embedding: f64,
    /// the tp all-gather that rebuilds activations received in 1/tp slices (pp > 1, tp > 1)
    pub pp_gather: f64,
    /// the context-parallel key/value exchange: all-gathered forward, again and its gradient
    /// reduce-scattered backward (cp > 1)
    #[serde(default)]
    pub cp: f64,
}

/// Bytes held, with the planner's `memory_bytes` names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBytes {
    pub weights: usize,
    /// gradients kept across the step's microbatches (ZeRO-2: the shard)
    pub grads: usize,
    pub optimizer: usize,
    /// activations kept for backward, all in-flight microbatches
    pub activations: usize,
    /// the backward workspace, the recompute scratch and (ZeRO-2) the per-microbatch gradient
    /// buffer that is reduce-scattered after each backward (the planner does not count these)
    pub workspace: usize,
}

/// One rank's measurements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: usize,
    pub tp: u32,
    /// the context-parallel coordinate (0 without)
    #[serde(default)]
    pub cp: u32,
    pub dp: u32,
    pub pp: u32,
    /// mean over the steps after the first (all steps if only one)
    pub step_s: f64,
    /// the planner's terms as measured: compute = forward and backward kernels (recomputation
    /// included, communication excluded); tp_comm = tensor-parallel collectives; pp_comm =
    /// pipeline sends and the all-gather of received slices; dp_comm = data-parallel
    /// collectives and the tied embedding's all-reduce; bubble = waiting in pipeline receives;
    /// optimizer = global norm, clipping and AdamW
    pub time_s: Times,
    pub comm_bytes: CommBytes,
    pub memory_bytes: MemoryBytes,
}

/// What one rank ends with.
#[derive(Debug, Clone)]
pub struct RankResult {
    /// Mean training loss of each step (the same on every rank).
    pub losses: Vec<f64>,
    /// Global gradient norm of each step, before clipping.
    pub grad_norms: Vec<f64>,
    /// Wall time of each step on this rank.
    pub step_seconds: Vec<f64>,
    pub report: RankReport,
    /// Each chunk's part and final parameters.
    pub chunks: Vec<(Part, Vec<f32>)>,
}

fn comm_err(e: CommError) -> SpecError {
    SpecError::new(e.0)
}

/// Check a layout against the model, the world and the batch before any work starts.
pub fn check(spec: &ModelSpec, cfg: &TrainConfig, pc: &ParallelConfig, world_size: usize) -> Result<(), SpecError> {
    cfg.check()?;
    if pc.gpus() as usize != world_size {
        return Err(SpecError::new(format!(
            "{} = {} ranks, but the job has {world_size}",
            pc.grid(),
            pc.gpus()
        )));
    }
    pc.check(spec, pc.gpus()).map_err(|e| SpecError::new(e.to_string()))?;
    if pc.micro_batch as usize != cfg.micro_batch || pc.global_batch as usize != cfg.global_batch {
        return Err(SpecError::new(format!(
            "the layout's batch ({} × {}) differs from the run's ({} × {})",
            pc.micro_batch, pc.global_batch, cfg.micro_batch, cfg.global_batch
        )));
    }
    if pc.zero > 2 {
        return Err(SpecError::new(format!(
            "--zero {}: the trainer implements ZeRO 0, 1 and 2",
            pc.zero
        )));
    }
    let shape = GptShape::from_spec(spec)?;
    let part = Part {
        tp: pc.tp as usize,
        flash: pc.flash_attention,
        cp: pc.cp as usize,
        ..Part::whole(&shape)
    };
    part.check(&shape)?;
    Ok(())
}

/// Train `cfg.steps` steps as rank `world.rank()` of the layout `pc`. On an error the rank
/// aborts the world, so the other ranks stop at their next collective with a message naming it.
pub fn train(
    spec: &ModelSpec,
    cfg: &TrainConfig,
    pc: &ParallelConfig,
    opts: &Options,
    data_dir: &Path,
    world: &dyn Communicator,
) -> Result<RankResult, SpecError> {
    train_on(Cpu::default(), spec, cfg, pc, opts, data_dir, world)
}

/// [`train`] on backend `be` (each of the rank's model chunks holds a clone of it).
pub fn train_on<B: Backend<R = f32> + Clone>(
    be: B,
    spec: &ModelSpec,
    cfg: &TrainConfig,
    pc: &ParallelConfig,
    opts: &Options,
    data_dir: &Path,
    world: &dyn Communicator,
) -> Result<RankResult, SpecError> {
    match executor::run(be, spec, cfg, pc, opts, data_dir, world) {
        Ok(r) => Ok(r),
        // every rank saw the same loss and norm and stops at the same point: nothing to abort
        Err(Stop::Agreed(e)) => Err(e),
        Err(Stop::Failed(e)) => {
            world.abort(&e.0);
            Err(e)
        }
    }
}

/// How a rank's run ended early.
enum Stop {
    /// every rank stops here with this error (the divergence guard)
    Agreed(SpecError),
    /// this rank failed: the others must be stopped
    Failed(SpecError),
}

impl From<SpecError> for Stop {
    fn from(e: SpecError) -> Stop {
        Stop::Failed(e)
    }
}

/// all ranks of data-parallel rank 0).
pub fn whole_params<'a>(shape: &GptShape, chunks: impl IntoIterator<Item = &'a (Part, Vec<f32>)>) -> Vec<f32> {
    let full = crate::model::ParamLayout::new(shape);
    let mut out = vec![0.0f32; full.total];
    for (part, params) in chunks {
        let layout = crate::model::ParamLayout::of_part(shape, part);
        for (l, w, n) in layout.shard_runs(shape) {
            out[w..w + n].copy_from_slice(&params[l..l + n]);
        }
    }
    out
}

/// The planner-comparable aggregate of the ranks' reports: the time terms of the rank that
/// computes longest (the planner models the slowest stage), each byte term's maximum over ranks
/// (the busiest rank), the step the slowest rank's, and the memory of the rank holding the most
/// (as the planner reports its fullest stage).
pub fn aggregate(reports: &[RankReport]) -> RankReport {
    let mut a = RankReport::default();
    let mx = |x: &mut f64, y: f64| *x = x.max(y);
    // the time terms of the critical rank: the one that computes longest (the planner's
    // slowest stage; a faster stage's waiting for it is imbalance, not the pipeline bubble)
    if let Some(r) = reports
        .iter()
        .max_by(|a, b| a.time_s.compute.total_cmp(&b.time_s.compute))
    {
        a.time_s = r.time_s;
    }
    for r in reports {
        mx(&mut a.step_s, r.step_s);
        mx(&mut a.comm_bytes.tp, r.comm_bytes.tp);
        mx(&mut a.comm_bytes.pp, r.comm_bytes.pp);
        mx(&mut a.comm_bytes.dp, r.comm_bytes.dp);
        mx(&mut a.comm_bytes.embedding, r.comm_bytes.embedding);
        mx(&mut a.comm_bytes.pp_gather, r.comm_bytes.pp_gather);
        mx(&mut a.comm_bytes.cp, r.comm_bytes.cp);
    }
    let held = |m: &MemoryBytes| m.weights + m.grads + m.optimizer + m.activations;
    if let Some(r) = reports.iter().max_by_key(|r| held(&r.memory_bytes)) {
        a.memory_bytes = r.memory_bytes;
    }
    a
}

/// The model and layout the planner should be asked about to compare with this trainer: it
/// trains in fp32 without dropout (with flash attention or not, and overlapping the
/// data-parallel reduction, as `pc` says).
pub fn as_trained(spec: &ModelSpec, pc: &ParallelConfig) -> (ModelSpec, ParallelConfig) {
    let spec = ModelSpec {
        dropout: false,
        ..spec.clone()
    };
    let pc = ParallelConfig {
        dtype: exatrain_spec::Dtype::Fp32,
        ..*pc
    };
    (spec, pc)
}

/// The grid dimension sizes of a layout, for messages.
pub fn describe(pc: &ParallelConfig) -> String {
    format!(
        "{} (order {}), micro-batch {}, global batch {}, ZeRO-{}, recompute {}{}{}{}",
        pc.grid(),
        pc.order,
        pc.micro_batch,
        pc.global_batch,
        pc.zero,
        pc.recompute.as_str(),
        if pc.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        },
        if pc.virtual_stages > 1 {
            format!(", {} virtual stages", pc.virtual_stages)
        } else {
            String::new()
        },
        if pc.flash_attention { ", flash attention" } else { "" }
    )
}
