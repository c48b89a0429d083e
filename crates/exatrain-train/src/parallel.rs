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

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use exatrain_cost::Times;
use exatrain_parallel::comm::{CommError, Communicator, Meter, Metered, Started};
use exatrain_parallel::schedule::{self, Kind, Pass};
use exatrain_spec::{Dim, ModelSpec, ParallelConfig, SpecError};
use serde::{Deserialize, Serialize};

use crate::data::{self, Dataset};
use crate::guard::Guard;
use crate::model::{Gpt, GptShape, Part, TpGroup};
use crate::optim::{lr_at, AdamW, AdamWConfig};
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
    /// Data-parallel gradient buckets hold at least this many elements, cut at block boundaries
    /// (0: one bucket per chunk besides the embedding). With `overlap_dp` a bucket's reduction
    /// starts as soon as its last gradient is final, while backward goes on.
    pub bucket_elems: usize,
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

/// The communicators of one rank, split from the world by the rank grid.
struct Groups {
    tp: Box<dyn Communicator>,
    pp: Box<dyn Communicator>,
    dp: Box<dyn Communicator>,
    /// the first and the last pipeline stage of this (tp, dp) column, for the tied embedding
    embedding: Box<dyn Communicator>,
}

fn split_groups(world: &dyn Communicator, pc: &ParallelConfig) -> Result<Groups, CommError> {
    let (t, d, p) = pc.coords(world.rank() as u32);
    // colour = the rank with this group's own coordinate at 0: the same for all members
    let tp = world.split(pc.rank(0, d, p) as usize, t as usize)?;
    let dp = world.split(pc.rank(t, 0, p) as usize, d as usize)?;
    let pp = world.split(pc.rank(t, d, 0) as usize, p as usize)?;
    let ends = p == 0 || p == pc.pp - 1;
    let colour = if ends {
        pc.rank(t, d, 0) as usize
    } else {
        world.size() + world.rank()
    };
    let embedding = world.split(colour, p as usize)?;
    Ok(Groups { tp, pp, dp, embedding })
}

/// The tensor-parallel group as the model uses it: activation all-reduces metered, the
/// cross-entropy's small statistics not.
struct TpComm<'a> {
    act: &'a Metered<'a>,
    stats: &'a dyn Communicator,
}

impl TpGroup<f32> for TpComm<'_> {
    fn size(&self) -> usize {
        self.stats.size()
    }
    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.size() > 1 {
            self.act.all_reduce(buf)?;
        }
        Ok(())
    }
    fn all_gather(&self, mine: &[f32], full: &mut [f32]) -> Result<(), CommError> {
        self.act.all_gather(mine, full)
    }
    fn reduce_scatter(&self, full: &[f32], mine: &mut [f32]) -> Result<(), CommError> {
        self.act.reduce_scatter(full, mine)
    }
    fn max_stats(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let n = self.size();
        if n > 1 {
            let mut all = vec![0.0f32; n * buf.len()];
            self.stats.all_gather(buf, &mut all)?;
            let len = buf.len();
            for (i, x) in buf.iter_mut().enumerate() {
                *x = (0..n).map(|r| all[r * len + i]).fold(f32::NEG_INFINITY, f32::max);
            }
        }
        Ok(())
    }
    fn sum_stats(&self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.size() > 1 {
            self.stats.all_reduce(buf)?;
        }
        Ok(())
    }
}

/// A chunk's buffer cut into regions — the data-parallel gradient buckets — each reduced and
/// sharded separately over the data-parallel group: the tied embedding apart (so that the first
/// and the last stage shard it alike), the rest cut at block boundaries into buckets of at
/// least `bucket_elems`, counted from the end (the order backward finishes them).
struct Regions {
    /// (range in the chunk's buffer, shard length = ⌈len / dp⌉), in buffer order
    regions: Vec<(Range<usize>, usize)>,
}

impl Regions {
    fn new(model: &Gpt<f32>, dp: usize, bucket_elems: usize) -> Regions {
        let layout = &model.layout;
        let wte = layout.wte.clone();
        let mut cuts = vec![model.params.len()];
        for b in layout.blocks.iter().skip(1).rev() {
            let start = b.ln1w.start;
            if bucket_elems > 0 && cuts.last().expect("end") - start >= bucket_elems {
                cuts.push(start);
            }
        }
        cuts.push(wte.end);
        cuts.reverse();
        let rest = cuts.windows(2).map(|w| w[0]..w[1]);
        let regions = std::iter::once(wte)
            .chain(rest)
            .filter(|r| !r.is_empty())
            .map(|r| {
                let s = r.len().div_ceil(dp);
                (r, s)
            })
            .collect();
        Regions { regions }
    }

    /// Elements a reduction of region k copies out while in flight: what it sends and receives.
    fn staged(&self, k: usize, zero: u8, dp: usize) -> usize {
        let (r, s) = &self.regions[k];
        if zero == 0 {
            2 * r.len()
        } else {
            s * dp + s
        }
    }

    /// This dp rank's piece of region k, in the chunk's buffer.
    fn piece(&self, k: usize, dp_rank: usize) -> Range<usize> {
        let (r, s) = &self.regions[k];
        let lo = (r.start + dp_rank * s).min(r.end);
        lo..(lo + s).min(r.end)
    }
}

/// The ranges of `decayed` inside `piece`, relative to its start.
fn decay_within(decayed: &[Range<usize>], piece: &Range<usize>) -> Vec<Range<usize>> {
    decayed
        .iter()
        .filter_map(|r| {
            let (s, e) = (r.start.max(piece.start), r.end.min(piece.end));
            (s < e).then(|| s - piece.start..e - piece.start)
        })
        .collect()
}

/// One model chunk of this rank with its optimizer and gradient shards.
struct Chunk {
    model: Gpt<f32>,
    /// virtual stage index
    stage: usize,
    regions: Regions,
    /// ZeRO ≥ 1: this rank's reduced gradient shard of each region (padded)
    shard_grads: Vec<Vec<f32>>,
    /// one AdamW per optimized piece: the whole buffer (ZeRO-0) or each region's piece
    opts: Vec<(Range<usize>, AdamW<f32>)>,
    /// which gradient elements this rank counts in the global norm
    counted: Vec<bool>,
    /// the embedding is tied to another rank's chunk (first and last stage differ)
    tied: bool,
    slots: usize,
}

impl Chunk {
    /// Which optimizer holds element `i` of the buffer, and at which index (None: another
    /// data-parallel rank's shard).
    fn opt_index(&self, i: usize) -> Option<(usize, usize)> {
        self.opts
            .iter()
            .position(|(p, _)| p.contains(&i))
            .map(|k| (k, i - self.opts[k].0.start))
    }

    /// Take this chunk's parameters and optimizer state from the whole model's.
    fn restore(&mut self, shape: &GptShape, st: &Start) {
        for (l, w, n) in self.model.layout.shard_runs(shape) {
            for j in 0..n {
                self.model.params[l + j] = st.params[w + j];
                if let Some((k, at)) = self.opt_index(l + j) {
                    self.opts[k].1.m[at] = st.m[w + j];
                    self.opts[k].1.v[at] = st.v[w + j];
                }
            }
        }
        for (_, o) in &mut self.opts {
            o.step = st.opt_step;
        }
    }
}

/// The whole model's state on every rank: each element is contributed by exactly one rank (the
/// one that counts it in the norm and holds its optimizer shard), the rest add zeros, and one
/// all-reduce over the world sums them.
fn gather_whole(
    shape: &GptShape,
    chunks: &[Chunk],
    zero: u8,
    dp_i: usize,
    step: u64,
    world: &dyn Communicator,
) -> Result<Start, CommError> {
    let n = crate::model::ParamLayout::new(shape).total;
    let mut all = vec![0.0f32; 3 * n];
    let mut opt_step = 0;
    for ch in chunks {
        for (l, w, len) in ch.model.layout.shard_runs(shape) {
            for j in 0..len {
                let i = l + j;
                let Some((k, at)) = ch.opt_index(i) else { continue };
                if !ch.counted[i] || (zero == 0 && dp_i != 0) {
                    continue;
                }
                let o = &ch.opts[k].1;
                all[w + j] = ch.model.params[i];
                all[n + w + j] = o.m[at];
                all[2 * n + w + j] = o.v[at];
            }
        }
        opt_step = ch.opts[0].1.step;
    }
    world.all_reduce(&mut all)?;
    let v = all.split_off(2 * n);
    let m = all.split_off(n);
    Ok(Start {
        step,
        opt_step,
        params: all,
        m,
        v,
        min_loss: None,
    })
}

/// How many microbatches of each chunk are in flight at most in `steps`.
fn slots_needed(steps: &[schedule::Step], chunks: usize) -> Vec<usize> {
    let (mut now, mut peak) = (vec![0usize; chunks], vec![0usize; chunks]);
    for s in steps {
        let c = s.chunk as usize;
        match s.pass {
            Pass::Forward => {
                now[c] += 1;
                peak[c] = peak[c].max(now[c]);
            }
            Pass::Backward => now[c] -= 1,
        }
    }
    peak
}

/// Check a layout against the model, the world and the batch before any work starts.
pub fn check(spec: &ModelSpec, cfg: &TrainConfig, pc: &ParallelConfig, world_size: usize) -> Result<(), SpecError> {
    cfg.check()?;
    if pc.gpus() as usize != world_size {
        return Err(SpecError::new(format!(
            "--tp {} × --pp {} × --dp {} = {} ranks, but the job has {world_size}",
            pc.tp,
            pc.pp,
            pc.dp,
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
    let mut part = Part::whole(&shape);
    part.tp = pc.tp as usize;
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
    match run(spec, cfg, pc, opts, data_dir, world) {
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

fn run(
    spec: &ModelSpec,
    cfg: &TrainConfig,
    pc: &ParallelConfig,
    opts: &Options,
    data_dir: &Path,
    world: &dyn Communicator,
) -> Result<RankResult, Stop> {
    check(spec, cfg, pc, world.size())?;
    let sched = opts.schedule;
    let shape = GptShape::from_spec(spec)?;
    let data = Dataset::open(data_dir, shape.max_seq)?;
    data.check_vocab(shape.vocab, &spec.name)?;
    let g = split_groups(world, pc).map_err(comm_err)?;
    let (tp_i, dp_i, pp_i) = pc.coords(world.rank() as u32);
    let (tp_i, dp_i, pp_i) = (tp_i as usize, dp_i as usize, pp_i as usize);
    let (pp, dp, v) = (pc.pp as usize, pc.dp as usize, pc.virtual_stages as usize);
    let stages = pp * v;
    // uneven stages (plain 1F1B / GPipe only) as the planner splits them; interleaving is even
    let split = pc.stage_layers(spec).map_err(|e| SpecError::new(e.to_string()))?;
    let per_stage = shape.layers / stages;
    let m = pc.microbatches() as usize;
    let kind = match (v, sched) {
        (1, Schedule::GPipe) => Kind::GPipe,
        (1, Schedule::OneFOneB) => Kind::OneFOneB,
        _ => Kind::Interleaved { chunks: v as u32 },
    };
    let all_steps = schedule::schedule(kind, pp as u32, m as u32);
    schedule::simulate(&all_steps, pp as u32, v as u32)
        .map_err(|e| SpecError::new(format!("pipeline schedule {kind:?}: {e}")))?;
    let steps = &all_steps[pp_i];
    let slots = slots_needed(steps, v);
    // the step at which each chunk runs its last backward: ZeRO 0 and 1 reduce its gradients then
    let last_backward: Vec<usize> = (0..v)
        .map(|c| {
            steps
                .iter()
                .rposition(|s| s.pass == Pass::Backward && s.chunk as usize == c)
                .expect("every chunk runs backward")
        })
        .collect();

    // --- this rank's chunks
    let (zero, overlap) = (pc.zero, pc.overlap_dp);
    let adam = AdamWConfig {
        lr: cfg.lr,
        weight_decay: cfg.weight_decay,
        ..Default::default()
    };
    let mut chunks: Vec<Chunk> = (0..v)
        .map(|c| {
            let stage = c * pp + pp_i;
            let layers = if v == 1 {
                let r = split.range(stage as u32);
                r.start as usize..r.end as usize
            } else {
                stage * per_stage..(stage + 1) * per_stage
            };
            let part = Part {
                layers,
                embed: stage == 0,
                head: stage == stages - 1,
                tp: pc.tp as usize,
                tp_rank: tp_i,
                sp: pc.sequence_parallel,
                recompute: pc.recompute,
            };
            let mut model = Gpt::<f32>::new_part(shape, &part, cfg.seed);
            model.prepare(cfg.micro_batch, shape.max_seq, slots[c]);
            let regions = Regions::new(&model, dp, opts.bucket_elems);
            let decayed = model.layout.decayed();
            let pieces: Vec<Range<usize>> = if zero == 0 {
                vec![0..model.params.len()]
            } else {
                (0..regions.regions.len()).map(|k| regions.piece(k, dp_i)).collect()
            };
            let opts = pieces
                .into_iter()
                .map(|p| {
                    let o = AdamW::new(adam, p.len(), decay_within(&decayed, &p));
                    (p, o)
                })
                .collect();
            let tied = (part.embed || part.head) && !(part.embed && part.head);
            let mut counted = vec![true; model.params.len()];
            if tp_i > 0 {
                for r in model.layout.tp_replicated() {
                    counted[r].iter_mut().for_each(|x| *x = false);
                }
            }
            if tied && part.head {
                counted[model.layout.wte.clone()].iter_mut().for_each(|x| *x = false);
            }
            let shard_grads = if zero == 0 {
                Vec::new()
            } else {
                regions.regions.iter().map(|(_, s)| vec![0.0f32; *s]).collect()
            };
            Chunk {
                model,
                stage,
                regions,
                shard_grads,
                opts,
                counted,
                tied,
                slots: slots[c],
            }
        })
        .collect();

    let first_step = match &opts.start {
        Some(st) => {
            let whole = crate::model::ParamLayout::new(&shape).total;
            if st.params.len() != whole || st.m.len() != whole || st.v.len() != whole {
                return Err(SpecError::new(format!(
                    "resume: the checkpoint holds {} parameters, model {} has {whole}",
                    st.params.len(),
                    spec.name
                ))
                .into());
            }
            for ch in &mut chunks {
                ch.restore(&shape, st);
            }
            st.step
        }
        None => 0,
    };
    let mut guard = Guard::new(cfg.divergence_factor, opts.start.as_ref().and_then(|s| s.min_loss));

    // --- meters: what passes through each group
    let tp_act = Metered::new(&*g.tp);
    let tpc = TpComm {
        act: &tp_act,
        stats: &*g.tp,
    };
    let pp_send = Metered::new(&*g.pp);
    let pp_recv = Metered::new(&*g.pp);
    let gather = Metered::new(&*g.tp);
    let dpm = Metered::new(&*g.dp);
    let embm = Metered::new(&*g.embedding);

    let t = shape.max_seq;
    let n_act = cfg.micro_batch * t * shape.channels;
    let per_rank = cfg.global_batch / dp;
    let scale = 1.0 / (m * dp) as f32;
    let (mut tokens, mut targets) = (Vec::new(), Vec::new());
    // Megatron's scatter-gather: each tp rank sends its 1/tp slice of the activations across
    // stages, the receiving stage all-gathers them over its tp group.
    // Under sequence parallelism the boundary tensor already is this rank's rows: sent as is.
    let (tp, sp) = (pc.tp as usize, pc.sequence_parallel);
    let n_act = if sp { n_act / tp } else { n_act };
    let mut buf = vec![0.0f32; n_act];
    let mut part_buf = vec![0.0f32; if sp { n_act } else { n_act / tp }];
    let slice_n = if sp { 1 } else { tp };
    let gather_n = (slice_n > 1).then_some(&gather);
    let (mut losses, mut grad_norms, mut step_seconds) = (Vec::new(), Vec::new(), Vec::new());
    let mut sums: Vec<(Times, CommBytes)> = Vec::new();
    // the most gradient elements copied out for reductions in flight at once (workspace)
    let mut staged_peak = 0usize;
    for step in first_step..cfg.steps {
        let t_step = Instant::now();
        let mut times = Times::default();
        let mut bytes = CommBytes::default();
        for c in &mut chunks {
            c.model.zero_grad();
            c.shard_grads
                .iter_mut()
                .for_each(|s| s.iter_mut().for_each(|x| *x = 0.0));
        }
        let mut loss = 0.0f64;
        let mut slot_of: HashMap<(u32, u32), usize> = HashMap::new();
        let mut free: Vec<Vec<usize>> = chunks.iter().map(|c| (0..c.slots).rev().collect()).collect();
        let first = step * cfg.global_batch as u64 + (dp_i * per_rank) as u64;
        // data-parallel reductions in flight: (chunk, bucket, collective)
        let mut pending: Vec<(usize, usize, Started)> = Vec::new();
        for (si, st) in steps.iter().enumerate() {
            let ci = st.chunk as usize;
            let ch = &mut chunks[ci];
            let s = ch.stage;
            let prev = (pp_i + pp - 1) % pp;
            let next = (pp_i + 1) % pp;
            match st.pass {
                Pass::Forward => {
                    let mb = st.microbatch as u64;
                    data::train_batch(
                        &data.train,
                        cfg.seed,
                        first + mb * cfg.micro_batch as u64,
                        cfg.micro_batch,
                        t,
                        &mut tokens,
                        &mut targets,
                    );
                    let input = if s > 0 {
                        recv_activation(&pp_recv, gather_n, prev, 2 * s as u32, &mut part_buf, &mut buf)
                            .map_err(comm_err)?;
                        Some(&buf[..])
                    } else {
                        None
                    };
                    let slot = free[ci].pop().expect("slots sized from the schedule");
                    slot_of.insert((st.microbatch, st.chunk), slot);
                    let t0 = Instant::now();
                    let l = ch
                        .model
                        .forward_part(slot, &tpc, &tokens, &targets, input)
                        .map_err(comm_err)?;
                    times.compute += t0.elapsed().as_secs_f64();
                    if let Some(l) = l {
                        loss += l as f64 / m as f64;
                    }
                    if s + 1 < stages {
                        let out = ch.model.output(slot);
                        pp_send
                            .send(next, 2 * (s + 1) as u32, slice_of(out, slice_n, tp_i % slice_n))
                            .map_err(comm_err)?;
                    }
                }
                Pass::Backward => {
                    let slot = slot_of.remove(&(st.microbatch, st.chunk)).expect("forward ran first");
                    let dout = if s + 1 < stages {
                        recv_activation(&pp_recv, gather_n, next, 2 * s as u32 + 1, &mut part_buf, &mut buf)
                            .map_err(comm_err)?;
                        Some(&buf[..])
                    } else {
                        None
                    };
                    if zero == 2 {
                        // this chunk's previous microbatch reductions end before new ones start
                        finish(&mut pending, Some(ci), &mut chunks, &dpm, zero).map_err(comm_err)?;
                    }
                    let ch = &mut chunks[ci];
                    // (one data-parallel rank and ZeRO-0: nothing to reduce)
                    let reduce = (zero == 2 || si == last_backward[ci]) && (dp > 1 || zero > 0);
                    let (model, regions) = (&mut ch.model, &ch.regions);
                    let mut next = regions.regions.len(); // buckets ≥ next are started
                    let mut start = |g: &[f32], from: usize| -> Result<(), CommError> {
                        while reduce && next > 0 && regions.regions[next - 1].0.start >= from {
                            next -= 1;
                            pending.push((ci, next, start_bucket(regions, next, g, zero, &dpm)?));
                        }
                        Ok(())
                    };
                    let t0 = Instant::now();
                    if overlap {
                        model.backward_part(slot, &tpc, dout, scale, &mut start)
                    } else {
                        model.backward_part(slot, &tpc, dout, scale, &mut |_, _| Ok(()))
                    }
                    .map_err(comm_err)?;
                    times.compute += t0.elapsed().as_secs_f64();
                    if !overlap {
                        start(&model.grads, 0).map_err(comm_err)?;
                    }
                    let staged = |p: &(usize, usize, Started)| chunks[p.0].regions.staged(p.1, zero, dp);
                    staged_peak = staged_peak.max(pending.iter().map(staged).sum());
                    if !overlap {
                        finish(&mut pending, None, &mut chunks, &dpm, zero).map_err(comm_err)?;
                    }
                    let ch = &mut chunks[ci];
                    free[ci].push(slot);
                    if s > 0 {
                        let din = ch.model.input_grad();
                        pp_send
                            .send(prev, 2 * (s - 1) as u32 + 1, slice_of(din, slice_n, tp_i % slice_n))
                            .map_err(comm_err)?;
                    }
                    if zero == 2 {
                        // ZeRO-2: this microbatch's gradients went to the reduce-scatters
                        ch.model.zero_grad();
                    }
                }
            }
        }
        // --- the data-parallel reductions still in flight, then the tied embedding
        finish(&mut pending, None, &mut chunks, &dpm, zero).map_err(comm_err)?;
        let mut tie_wait = 0.0;
        for ch in &mut chunks {
            if ch.tied {
                // first meet the other end of the pipeline (waiting for its last backward is
                // pipeline idle time), then the all-reduce itself
                let t0 = Instant::now();
                g.embedding.barrier().map_err(comm_err)?;
                tie_wait += t0.elapsed().as_secs_f64();
                let wte = if zero == 0 {
                    &mut ch.model.grads[ch.model.layout.wte.clone()]
                } else {
                    &mut ch.shard_grads[0][..] // region 0 is the embedding
                };
                embm.all_reduce(wte).map_err(comm_err)?;
            }
        }
        // --- the global gradient norm over every rank, each element counted once
        let t_opt = Instant::now();
        let mut sq = 0.0f64;
        for ch in &chunks {
            if zero == 0 {
                if dp_i == 0 {
                    sq += ch
                        .model
                        .grads
                        .iter()
                        .zip(&ch.counted)
                        .filter(|(_, c)| **c)
                        .map(|(g, _)| (*g as f64).powi(2))
                        .sum::<f64>();
                }
            } else {
                for k in 0..ch.regions.regions.len() {
                    let p = ch.regions.piece(k, dp_i);
                    sq += ch.shard_grads[k][..p.len()]
                        .iter()
                        .zip(&ch.counted[p])
                        .filter(|(_, c)| **c)
                        .map(|(g, _)| (*g as f64).powi(2))
                        .sum::<f64>();
                }
            }
        }
        // loss from the last stage's tp rank 0 of each dp rank, averaged over dp
        let head_here = chunks.iter().any(|c| c.model.part().head) && tp_i == 0;
        let mut red = [sq as f32, if head_here { (loss / dp as f64) as f32 } else { 0.0 }];
        let t_red = Instant::now();
        world.all_reduce(&mut red).map_err(comm_err)?;
        let red_s = t_red.elapsed().as_secs_f64();
        let norm = (red[0] as f64).sqrt();
        if let Err(d) = guard.check(step + 1, red[1] as f64, norm) {
            // the parameters after `step` steps gave this loss: take back their checkpoint
            let mut good = None;
            if world.rank() == 0 {
                if let Some(f) = opts.on_diverge {
                    good = f(step).map_err(Stop::Failed)?;
                }
            }
            return Err(Stop::Agreed(SpecError::new(d.message(good.as_deref()))));
        }
        losses.push(red[1] as f64);
        grad_norms.push(norm);
        let clip = if norm > cfg.grad_clip && norm.is_finite() {
            (cfg.grad_clip / norm) as f32
        } else {
            1.0
        };
        let lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps);
        for ch in &mut chunks {
            if zero == 0 {
                ch.model.grads.iter_mut().for_each(|x| *x *= clip);
                let (p, o) = &mut ch.opts[0];
                o.update(&mut ch.model.params[p.clone()], &ch.model.grads[p.clone()], lr);
            } else {
                for (k, (p, o)) in ch.opts.iter_mut().enumerate() {
                    let gk = &mut ch.shard_grads[k][..p.len()];
                    gk.iter_mut().for_each(|x| *x *= clip);
                    o.update(&mut ch.model.params[p.clone()], gk, lr);
                }
            }
        }
        times.optimizer += t_opt.elapsed().as_secs_f64() - red_s;
        // ZeRO ≥ 1: every rank gets the updated parameters back
        if zero >= 1 {
            for ch in &mut chunks {
                for k in 0..ch.regions.regions.len() {
                    let (r, s) = ch.regions.regions[k].clone();
                    let p = ch.regions.piece(k, dp_i);
                    let mut send = vec![0.0f32; s];
                    send[..p.len()].copy_from_slice(&ch.model.params[p]);
                    let mut out = vec![0.0f32; s * dp];
                    dpm.all_gather(&send, &mut out).map_err(comm_err)?;
                    ch.model.params[r.clone()].copy_from_slice(&out[..r.len()]);
                }
            }
        }
        let (mt, ms, mr, md, me, mg): (Meter, Meter, Meter, Meter, Meter, Meter) = (
            tp_act.take(),
            pp_send.take(),
            pp_recv.take(),
            dpm.take(),
            embm.take(),
            gather.take(),
        );
        times.compute -= mt.seconds;
        times.tp_comm = mt.seconds;
        times.pp_comm = ms.seconds + mg.seconds;
        times.bubble = mr.seconds + tie_wait;
        times.dp_comm = md.seconds + me.seconds;
        bytes.tp = mt.bytes;
        bytes.pp = ms.bytes;
        bytes.dp = md.bytes;
        bytes.embedding = me.bytes;
        bytes.pp_gather = mg.bytes;
        sums.push((times, bytes));
        let seconds = t_step.elapsed().as_secs_f64();
        step_seconds.push(seconds);
        let done = step + 1;
        let every = |k: u64| (k > 0 && done % k == 0) || done == cfg.steps;
        let evaluate = opts.on_eval.is_some() && every(cfg.eval_every);
        let save = opts.on_checkpoint.is_some() && every(cfg.ckpt_every);
        // one gather serves the evaluation and the checkpoint
        let whole = if evaluate || save {
            let mut w = gather_whole(&shape, &chunks, zero, dp_i, done, world).map_err(comm_err)?;
            w.min_loss = guard.min_loss;
            Some(w)
        } else {
            None
        };
        if world.rank() == 0 {
            let (val_loss, sample) = match (opts.on_eval, &whole) {
                (Some(f), Some(w)) if evaluate => {
                    let (v, s) = f(w)?;
                    (Some(v), s)
                }
                _ => (None, None),
            };
            if let Some(f) = opts.on_step {
                f(&StepLine {
                    step: done,
                    loss: red[1] as f64,
                    grad_norm: norm,
                    lr,
                    seconds,
                    tokens_per_s: (cfg.global_batch * t) as f64 / seconds,
                    val_loss,
                    sample,
                });
            }
        }
        if let (Some(f), Some(w)) = (opts.on_checkpoint, &whole) {
            if save && world.rank() == 0 {
                f(w)?;
            }
        }
    }
    if sums.is_empty() {
        return Err(Stop::Failed(SpecError::new(format!(
            "--steps {}: the run already completed {first_step} steps",
            cfg.steps
        ))));
    }

    // --- the report: means over the steps after the first
    let skip = usize::from(sums.len() > 1);
    let k = (sums.len() - skip) as f64;
    let mut time_s = Times::default();
    let mut comm_bytes = CommBytes::default();
    for (t, b) in &sums[skip..] {
        time_s.compute += t.compute / k;
        time_s.tp_comm += t.tp_comm / k;
        time_s.pp_comm += t.pp_comm / k;
        time_s.dp_comm += t.dp_comm / k;
        time_s.bubble += t.bubble / k;
        time_s.optimizer += t.optimizer / k;
        comm_bytes.tp += b.tp / k;
        comm_bytes.pp += b.pp / k;
        comm_bytes.dp += b.dp / k;
        comm_bytes.embedding += b.embedding / k;
        comm_bytes.pp_gather += b.pp_gather / k;
    }
    let f = std::mem::size_of::<f32>();
    let mut mem = MemoryBytes {
        workspace: staged_peak * f,
        ..Default::default()
    };
    for c in &chunks {
        mem.weights += c.model.params.len() * f;
        mem.optimizer += c.opts.iter().map(|(_, o)| (o.m.len() + o.v.len()) * f).sum::<usize>();
        mem.activations += c.model.activation_bytes();
        mem.workspace += c.model.workspace_bytes();
        if zero == 2 {
            mem.grads += c.shard_grads.iter().map(|s| s.len() * f).sum::<usize>();
            mem.workspace += c.model.grads.len() * f;
        } else {
            mem.grads += c.model.grads.len() * f;
        }
    }
    let report = RankReport {
        rank: world.rank(),
        tp: tp_i as u32,
        dp: dp_i as u32,
        pp: pp_i as u32,
        step_s: step_seconds[skip..].iter().sum::<f64>() / k,
        time_s,
        comm_bytes,
        memory_bytes: mem,
    };
    Ok(RankResult {
        losses,
        grad_norms,
        step_seconds,
        report,
        chunks: chunks
            .into_iter()
            .map(|c| (c.model.part().clone(), c.model.params))
            .collect(),
    })
}

/// Rank `i`'s 1/n slice of `x`.
fn slice_of(x: &[f32], n: usize, i: usize) -> &[f32] {
    let k = x.len() / n;
    &x[i * k..(i + 1) * k]
}

/// Receive one activation (or gradient) tensor: whole, or (given the tp group to gather over)
/// in 1/tp slices, one from each tp rank of the sending stage, all-gathered here.
fn recv_activation(
    recv: &Metered,
    gather: Option<&Metered>,
    from: usize,
    tag: u32,
    slice: &mut [f32],
    whole: &mut [f32],
) -> Result<(), CommError> {
    match gather {
        None => recv.recv(from, tag, whole),
        Some(g) => {
            recv.recv(from, tag, slice)?;
            g.all_gather(slice, whole)
        }
    }
}

/// Start the data-parallel reduction of bucket `k` of gradients `g`: an all-reduce (ZeRO 0) or
/// a reduce-scatter of the bucket padded to dp equal shards (ZeRO ≥ 1).
fn start_bucket(regions: &Regions, k: usize, g: &[f32], zero: u8, dpm: &Metered) -> Result<Started, CommError> {
    let (r, s) = regions.regions[k].clone();
    if zero == 0 {
        dpm.start_all_reduce(g[r].to_vec())
    } else {
        let mut full = vec![0.0f32; s * dpm.size()];
        full[..r.len()].copy_from_slice(&g[r]);
        dpm.start_reduce_scatter(full)
    }
}

/// Wait for the pending reductions (of chunk `only`, or all) in the order started, and put
/// each result in place: the reduced bucket back into the gradients (ZeRO 0), or added to the
/// rank's shard (ZeRO ≥ 1).
fn finish(
    pending: &mut Vec<(usize, usize, Started)>,
    only: Option<usize>,
    chunks: &mut [Chunk],
    dpm: &Metered,
    zero: u8,
) -> Result<(), CommError> {
    let (now, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|p| only.is_none_or(|c| p.0 == c));
    *pending = later;
    for (c, k, started) in now {
        let got = dpm.wait(started)?;
        let ch = &mut chunks[c];
        if zero == 0 {
            let r = ch.regions.regions[k].0.clone();
            ch.model.grads[r].copy_from_slice(&got);
        } else {
            for (a, b) in ch.shard_grads[k].iter_mut().zip(&got) {
                *a += *b;
            }
        }
    }
    Ok(())
}

/// The whole model's parameters from the chunks of ranks that together hold every part (e.g.
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
    }
    let held = |m: &MemoryBytes| m.weights + m.grads + m.optimizer + m.activations;
    if let Some(r) = reports.iter().max_by_key(|r| held(&r.memory_bytes)) {
        a.memory_bytes = r.memory_bytes;
    }
    a
}

/// The model and layout the planner should be asked about to compare with this trainer: it
/// trains in fp32 without dropout (and overlaps the data-parallel reduction as `pc` says).
pub fn as_trained(spec: &ModelSpec, pc: &ParallelConfig) -> (ModelSpec, ParallelConfig) {
    let spec = ModelSpec {
        dropout: false,
        ..spec.clone()
    };
    let pc = ParallelConfig {
        dtype: exatrain_spec::Dtype::Fp32,
        flash_attention: false,
        ..*pc
    };
    (spec, pc)
}

/// The grid dimension sizes of a layout, for messages.
pub fn describe(pc: &ParallelConfig) -> String {
    format!(
        "tp {} × pp {} × dp {} (order {}), micro-batch {}, global batch {}, ZeRO-{}, recompute {}{}{}",
        pc.size(Dim::Tp),
        pc.size(Dim::Pp),
        pc.size(Dim::Dp),
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
        }
    )
}
