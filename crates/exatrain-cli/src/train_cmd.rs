//! `exatrain train`: resolve the run (a new one from the flags, or a resumed one from its
//! checkpoint with the flags given on purpose applied), then run it on one process, on
//! in-process ranks, or as one rank of an MPI job.

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use exatrain_spec::{load, Dtype, ModelSpec, ParallelConfig, RankOrder, Recompute, SpecError};
use exatrain_train::checkpoint;
use exatrain_train::data;
use exatrain_train::parallel::{self, Schedule, Start};
use exatrain_train::train::{TrainConfig, Trainer};
use exatrain_train::Backend;
use serde::{Deserialize, Serialize};

use crate::calibrate_cmd::Device;
use crate::run_folder::{self, Progress};

const CORPUS: &str = include_str!("../../../data/corpus/devils-dictionary.txt");

#[derive(Args)]
pub struct TrainArgs {
    /// Model preset or file (GPT-2 architecture).
    #[arg(long, default_value = "gpt-mini")]
    pub model: String,
    /// Where to train: this machine's CPU, or one NVIDIA GPU (the all-fp32 mode, one rank;
    /// needs a build with `--features exatrain-cli/cuda`).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// With --device cuda: which GPU (CUDA ordinal).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// With --device cuda: multiply in full fp32 instead of TF32 on the tensor cores (TF32:
    /// 10-bit mantissa, fp32 accumulation, as llm.c's fp32 build; the default).
    #[arg(long)]
    pub no_tf32: bool,
    /// A text file to tokenize, or a folder made from one [default: the bundled public-domain corpus].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Optimizer steps in all (with --resume: the run's own total unless given; more extends it).
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// Sequences per forward/backward.
    #[arg(long, default_value_t = 8)]
    pub micro_batch: usize,
    /// Sequences per optimizer step (gradient accumulation = global / micro).
    #[arg(long, default_value_t = 16)]
    pub global_batch: usize,
    /// Peak learning rate (after warmup; cosine decay to --min-lr).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Final learning rate.
    #[arg(long, default_value_t = 1e-4)]
    pub min_lr: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 20)]
    pub warmup: u64,
    /// AdamW decoupled weight decay (on weight matrices and the embedding, not on biases, norms, positions).
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// Clip gradients to this global L2 norm.
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Validation loss and a sample every this many steps.
    #[arg(long, default_value_t = 50)]
    pub eval_every: u64,
    /// Checkpoint every this many steps (and at the end).
    #[arg(long, default_value_t = 100)]
    pub ckpt_every: u64,
    /// Write no checkpoint at all (a tuner's trial run).
    #[arg(long)]
    pub no_ckpt: bool,
    /// Seeds the initialization and the data sampler.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Prompt for the samples printed at each evaluation.
    #[arg(long, default_value = "LOVE, n.")]
    pub prompt: String,
    /// Run folder: checkpoints, metrics.jsonl, the tokenized data.
    #[arg(long, default_value = "runs/train")]
    pub out: PathBuf,
    /// Continue a run (its folder or a checkpoint) with its own steps, schedule, batch and
    /// layout; a flag given with it changes that setting on purpose (and is reported).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Start over in an --out folder that already holds a run (deletes its checkpoints and metrics).
    #[arg(long)]
    pub overwrite: bool,
    /// Stop when the loss exceeds this factor × the lowest loss so far (0: only NaN/inf stop);
    /// checkpoints written after the last good loss are renamed *.diverged.
    #[arg(long, default_value_t = 3.0)]
    pub divergence_factor: f64,
    /// Keep only the newest N checkpoints (0: all); the one `latest` names is never removed.
    #[arg(long, default_value_t = 0)]
    pub keep_last: usize,
    /// Seconds a collective may wait for the other ranks before the job ends with an error.
    #[arg(long, default_value_t = 300.0)]
    pub comm_timeout: f64,
    /// One JSON line per step on stdout instead of the progress bar.
    #[arg(long)]
    pub json: bool,
    /// Run N in-process ranks (threads) of the layout below instead of one process (at most 256).
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Tensor-parallel size (Megatron's column/row-parallel split, vocab-parallel embedding and loss).
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// Pipeline-parallel size (contiguous layers per stage).
    #[arg(long, default_value_t = 1)]
    pub pp: u32,
    /// Context-parallel size: each sequence split over this many ranks (two load-balanced
    /// chunks each, keys and values all-gathered for the attention); needs --flash-attention.
    #[arg(long, default_value_t = 1)]
    pub cp: u32,
    /// Data-parallel size [default: ranks / (tp·cp·pp)].
    #[arg(long)]
    pub dp: Option<u32>,
    /// Flash attention: keep each row's log-sum-exp instead of the T×T probabilities, and
    /// recompute them in backward (both devices; `--flash-attention`, or `--flash-attention 1|0`
    /// as a tuner template fills it).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub flash_attention: bool,
    /// ZeRO stage: 0 (replicated), 1 (optimizer state sharded), 2 (gradients sharded too).
    #[arg(long, default_value_t = 0)]
    pub zero: u8,
    /// Activation recomputation: none, selective (attention core) or full (per layer).
    #[arg(long, default_value = "none")]
    pub recompute: String,
    /// Megatron sequence parallelism: norms and residual stream sharded over the tp ranks' tokens
    /// (`--sequence-parallel`, or `--sequence-parallel 1|0` as a tuner template fills it).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub sequence_parallel: bool,
    /// Model chunks per pipeline stage (interleaved 1F1B).
    #[arg(long, default_value_t = 1)]
    pub virtual_stages: u32,
    /// Layers of the first pipeline stage (default: --pp need not divide the layers; they are
    /// spread as evenly as possible, the inner stages equal).
    #[arg(long)]
    pub first_stage_layers: Option<u32>,
    /// Layers of the last pipeline stage.
    #[arg(long)]
    pub last_stage_layers: Option<u32>,
    /// Pipeline schedule with one chunk per stage: 1f1b or gpipe.
    #[arg(long, default_value = "1f1b")]
    pub schedule: String,
    /// Rank order, innermost first (a permutation of tp, dp, pp).
    #[arg(long, default_value = "tp-dp-pp")]
    pub order: String,
    /// Reduce data-parallel gradients after backward instead of bucket by bucket during it.
    #[arg(long)]
    pub no_overlap_dp: bool,
    /// Data-parallel gradient bucket size in MB (fp32), cut at block boundaries (PyTorch DDP's
    /// default 25); 0: one bucket per model chunk besides the embedding.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Cluster whose planner prediction --report puts beside the measurement (bytes do not
    /// depend on it; for times pass the file `exatrain calibrate --out` wrote).
    #[arg(long, default_value = "frontier")]
    pub cluster: String,
    /// Write the measured per-rank and aggregate breakdown, the planner's numbers for the same
    /// layout (same names) and the measured tokens/s to this JSON file (runs the parallel
    /// engine, also on one rank).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Run as one rank of this MPI job (`mpirun -n N exatrain train --mpi --tp …`); needs a
    /// build with `--features mpi`.
    #[arg(long)]
    pub mpi: bool,
}

fn one() -> u32 {
    1
}

/// The most in-process ranks (threads) `--ranks` starts.
const MAX_RANKS: usize = 256;

/// The layout and engine flags of a run, stored in each checkpoint so a resume keeps them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunLayout {
    pub ranks: usize,
    pub tp: u32,
    pub pp: u32,
    #[serde(default = "one")]
    pub cp: u32,
    /// None: ranks / (tp·cp·pp)
    pub dp: Option<u32>,
    #[serde(default)]
    pub flash_attention: bool,
    pub zero: u8,
    pub recompute: String,
    pub sequence_parallel: bool,
    pub virtual_stages: u32,
    #[serde(default)]
    pub first_stage_layers: Option<u32>,
    #[serde(default)]
    pub last_stage_layers: Option<u32>,
    pub schedule: String,
    pub order: String,
    pub no_overlap_dp: bool,
    pub bucket_mb: f64,
}

impl RunLayout {
    fn of(a: &TrainArgs) -> RunLayout {
        RunLayout {
            ranks: a.ranks,
            tp: a.tp,
            pp: a.pp,
            cp: a.cp,
            dp: a.dp,
            flash_attention: a.flash_attention,
            zero: a.zero,
            recompute: a.recompute.clone(),
            sequence_parallel: a.sequence_parallel,
            virtual_stages: a.virtual_stages,
            first_stage_layers: a.first_stage_layers,
            last_stage_layers: a.last_stage_layers,
            schedule: a.schedule.clone(),
            order: a.order.clone(),
            no_overlap_dp: a.no_overlap_dp,
            bucket_mb: a.bucket_mb,
        }
    }

    /// The planner's layout for this run's batch (the trainer runs fp32).
    fn config(&self, cfg: &TrainConfig) -> Result<ParallelConfig, SpecError> {
        let cells = (self.tp as usize).max(1) * (self.cp as usize).max(1) * (self.pp as usize).max(1);
        let dp = match self.dp {
            Some(d) => d,
            None if self.ranks.is_multiple_of(cells) => (self.ranks / cells) as u32,
            None => {
                let cp = if self.cp > 1 {
                    format!(" × --cp {}", self.cp)
                } else {
                    String::new()
                };
                return Err(SpecError::new(format!(
                    "{} ranks are not divisible by --tp {}{cp} × --pp {}",
                    self.ranks, self.tp, self.pp
                )));
            }
        };
        Ok(ParallelConfig {
            tp: self.tp,
            pp: self.pp,
            dp,
            cp: self.cp,
            micro_batch: cfg.micro_batch as u32,
            global_batch: cfg.global_batch as u32,
            zero: self.zero,
            recompute: self.recompute.parse::<Recompute>()?,
            sequence_parallel: self.sequence_parallel,
            virtual_stages: self.virtual_stages,
            flash_attention: self.flash_attention,
            dtype: Dtype::Fp32,
            // the trainer's GEMMs run in the backend's precision, never FP8
            fp8: false,
            overlap_dp: !self.no_overlap_dp,
            // the trainer does not overlap its TP collectives
            overlap_tp: false,
            order: self.order.parse::<RankOrder>()?,
            first_stage_layers: self.first_stage_layers,
            last_stage_layers: self.last_stage_layers,
            // the buckets this run cuts (`--bucket-mb` in fp32 elements), for the planner
            dp_bucket: Some(crate::train_ranks::bucket_elems(self.bucket_mb)? as u64),
        })
    }

    /// One process with nothing to report runs the single-process trainer.
    fn is_single(&self) -> bool {
        self.ranks == 1
            && self.tp == 1
            && self.pp == 1
            && self.dp.unwrap_or(1) == 1
            && self.cp == 1
            && !self.flash_attention
    }
}

/// Which flags were given on the command line (not defaults).
pub struct Given<'a>(pub Option<&'a ArgMatches>);

impl Given<'_> {
    fn has(&self, id: &str) -> bool {
        self.0
            .is_some_and(|m| matches!(m.value_source(id), Some(ValueSource::CommandLine)))
    }
}

fn config(a: &TrainArgs) -> TrainConfig {
    TrainConfig {
        steps: a.steps,
        micro_batch: a.micro_batch,
        global_batch: a.global_batch,
        lr: a.lr,
        min_lr: a.min_lr,
        warmup: a.warmup,
        weight_decay: a.weight_decay,
        grad_clip: a.grad_clip,
        eval_every: a.eval_every,
        eval_batches: 8,
        ckpt_every: a.ckpt_every,
        seed: a.seed,
        sample_prompt: a.prompt.clone(),
        sample_tokens: 40,
        divergence_factor: a.divergence_factor,
        keep_last: a.keep_last,
    }
}

/// Where a resumed run starts.
pub(crate) struct Resumed {
    pub(crate) ckpt: PathBuf,
    pub(crate) state: checkpoint::State,
    pub(crate) start: Start,
}

/// A run resolved from the flags (and its checkpoint when resumed), before any side effect.
pub(crate) struct Run {
    pub(crate) spec: ModelSpec,
    pub(crate) cfg: TrainConfig,
    pub(crate) layout: RunLayout,
    pub(crate) pc: ParallelConfig,
    /// the tokenized data folder (prepared later for a new run from a text file)
    pub(crate) data: PathBuf,
    pub(crate) out: PathBuf,
    pub(crate) resumed: Option<Resumed>,
}

/// Apply each flag given on purpose to a resumed run's setting, noting what changed.
macro_rules! keep_or_change {
    ($given:expr, $changes:expr, $dst:expr, $src:expr, $id:literal) => {
        if $given.has($id) && $dst != $src {
            $changes.push(format!("--{} {:?} → {:?}", $id.replace('_', "-"), $dst, $src));
            $dst = $src.clone();
        }
    };
}

/// Resolve the run for a job of `world` ranks (None: `--ranks`). No side effects.
pub(crate) fn resolve(a: &TrainArgs, given: &Given, world: Option<usize>) -> Result<Run, SpecError> {
    if a.ranks == 0 || a.ranks > MAX_RANKS {
        return Err(SpecError::new(format!(
            "--ranks {}: must be in 1..={MAX_RANKS}",
            a.ranks
        )));
    }
    if a.dp == Some(0) || a.tp == 0 || a.pp == 0 || a.cp == 0 || a.virtual_stages == 0 {
        return Err(SpecError::new(
            "--tp, --cp, --pp, --dp and --virtual-stages must be positive integers",
        ));
    }
    if !(a.comm_timeout.is_finite() && a.comm_timeout > 0.0) {
        return Err(SpecError::new(format!(
            "--comm-timeout {}: must be a positive number of seconds",
            a.comm_timeout
        )));
    }
    crate::train_ranks::bucket_elems(a.bucket_mb)?;
    let (spec, mut cfg, mut layout, data, out, resumed) = match &a.resume {
        None => {
            let mut layout = RunLayout::of(a);
            layout.ranks = world.unwrap_or(a.ranks);
            let data = match &a.data {
                Some(p) if p.is_dir() => p.clone(),
                _ => a.out.join("data"),
            };
            let spec = load::model(&a.model)?;
            (spec, config(a), layout, data, a.out.clone(), None)
        }
        Some(r) => {
            let ckpt = checkpoint::resolve(r)?;
            let (state, params, opt) = checkpoint::load(&ckpt, true)?;
            let (m, v) = opt.expect("asked for the optimizer");
            let cfg = exatrain_train::train::stored_config(&state, &ckpt)?;
            // checkpoints from before layouts were stored ran the flags' defaults
            let layout: RunLayout = match &state.run {
                serde_json::Value::Null => RunLayout::of(&TrainArgs::defaults()),
                v => serde_json::from_value(v.clone())
                    .map_err(|e| SpecError::new(format!("{}: corrupt run layout: {e}", ckpt.display())))?,
            };
            let run_dir = ckpt.parent().unwrap_or(Path::new(".")).to_path_buf();
            if given.has("model") && load::model(&a.model)? != state.model {
                return Err(SpecError::new(format!(
                    "--model {}: the run {} trains {}; a resumed run keeps its model",
                    a.model,
                    run_dir.display(),
                    state.model.name
                )));
            }
            let same = |p: &Path| std::fs::canonicalize(p).ok() == std::fs::canonicalize(&run_dir).ok();
            if given.has("out") && !same(&a.out) {
                return Err(SpecError::new(format!(
                    "--out {}: --resume continues the run in its own folder {}",
                    a.out.display(),
                    run_dir.display()
                )));
            }
            let start = Start {
                step: state.step,
                opt_step: state.opt_step,
                params,
                m,
                v,
                min_loss: state.min_loss,
            };
            let data = state.data_dir.clone();
            let spec = state.model.clone();
            let resumed = Resumed { ckpt, state, start };
            (spec, cfg, layout, data, run_dir, Some(resumed))
        }
    };
    if let Some(r) = &resumed {
        let mut changes: Vec<String> = Vec::new();
        let c = &mut changes;
        keep_or_change!(given, c, cfg.steps, a.steps, "steps");
        keep_or_change!(given, c, cfg.micro_batch, a.micro_batch, "micro_batch");
        keep_or_change!(given, c, cfg.global_batch, a.global_batch, "global_batch");
        keep_or_change!(given, c, cfg.lr, a.lr, "lr");
        keep_or_change!(given, c, cfg.min_lr, a.min_lr, "min_lr");
        keep_or_change!(given, c, cfg.warmup, a.warmup, "warmup");
        keep_or_change!(given, c, cfg.weight_decay, a.weight_decay, "weight_decay");
        keep_or_change!(given, c, cfg.grad_clip, a.grad_clip, "grad_clip");
        keep_or_change!(given, c, cfg.eval_every, a.eval_every, "eval_every");
        keep_or_change!(given, c, cfg.ckpt_every, a.ckpt_every, "ckpt_every");
        keep_or_change!(given, c, cfg.seed, a.seed, "seed");
        keep_or_change!(given, c, cfg.sample_prompt, a.prompt, "prompt");
        keep_or_change!(
            given,
            c,
            cfg.divergence_factor,
            a.divergence_factor,
            "divergence_factor"
        );
        keep_or_change!(given, c, cfg.keep_last, a.keep_last, "keep_last");
        let before = (layout.ranks, layout.tp, layout.pp, layout.cp);
        let ranks = world.unwrap_or(a.ranks);
        if (given.has("ranks") || world.is_some()) && layout.ranks != ranks {
            c.push(format!("ranks {} → {ranks}", layout.ranks));
            layout.ranks = ranks;
        }
        keep_or_change!(given, c, layout.tp, a.tp, "tp");
        keep_or_change!(given, c, layout.pp, a.pp, "pp");
        keep_or_change!(given, c, layout.cp, a.cp, "cp");
        keep_or_change!(given, c, layout.dp, a.dp, "dp");
        keep_or_change!(given, c, layout.flash_attention, a.flash_attention, "flash_attention");
        if before != (layout.ranks, layout.tp, layout.pp, layout.cp) && !given.has("dp") {
            layout.dp = None;
        }
        keep_or_change!(given, c, layout.zero, a.zero, "zero");
        keep_or_change!(given, c, layout.recompute, a.recompute, "recompute");
        keep_or_change!(
            given,
            c,
            layout.sequence_parallel,
            a.sequence_parallel,
            "sequence_parallel"
        );
        keep_or_change!(given, c, layout.virtual_stages, a.virtual_stages, "virtual_stages");
        keep_or_change!(
            given,
            c,
            layout.first_stage_layers,
            a.first_stage_layers,
            "first_stage_layers"
        );
        keep_or_change!(
            given,
            c,
            layout.last_stage_layers,
            a.last_stage_layers,
            "last_stage_layers"
        );
        keep_or_change!(given, c, layout.schedule, a.schedule, "schedule");
        keep_or_change!(given, c, layout.order, a.order, "order");
        keep_or_change!(given, c, layout.no_overlap_dp, a.no_overlap_dp, "no_overlap_dp");
        keep_or_change!(given, c, layout.bucket_mb, a.bucket_mb, "bucket_mb");
        if cfg.steps <= r.state.step {
            return Err(SpecError::new(format!(
                "--steps {}: the run {} has already completed {} steps; pass more to extend it",
                cfg.steps,
                out.display(),
                r.state.step
            )));
        }
        if given.has("data") {
            changes.push(format!("--data ignored: the run keeps its data {}", data.display()));
        }
        if !changes.is_empty() {
            eprintln!("resume {}: {}", r.ckpt.display(), changes.join(", "));
        }
    }
    let pc = layout.config(&cfg)?;
    parallel::check(&spec, &cfg, &pc, layout.ranks)?;
    layout.schedule.parse::<Schedule>()?;
    let v = spec.vocab;
    let tokenizes = resumed.is_none() && !matches!(&a.data, Some(p) if p.is_dir());
    if tokenizes && !(data::MIN_VOCAB..=65535).contains(&v) {
        return Err(SpecError::new(format!(
            "model vocab {v}: the trainer's byte-level tokenizer needs {}..=65535 tokens (256 bytes + <|endoftext|>; u16 shards)",
            data::MIN_VOCAB
        )));
    }
    Ok(Run {
        spec,
        cfg,
        layout,
        pc,
        data,
        out,
        resumed,
    })
}

impl TrainArgs {
    /// The flags' defaults (what a checkpoint without a stored layout ran).
    fn defaults() -> TrainArgs {
        use clap::FromArgMatches;
        let cmd = <TrainArgs as Args>::augment_args(clap::Command::new("train"));
        TrainArgs::from_arg_matches(&cmd.get_matches_from(["train"])).expect("defaults parse")
    }
}

/// The tokenized data of a new run: `data` if it is a prepared folder, else `data` (a text
/// file, or the bundled corpus when None) tokenized into `out/data` unless already there.
pub fn prepare_data(data: Option<&Path>, out: &Path, vocab: u32) -> Result<PathBuf, SpecError> {
    let dir = out.join("data");
    let source = match data {
        Some(p) if p.is_dir() => return Ok(p.to_path_buf()),
        Some(p) if p.is_file() => p.to_path_buf(),
        Some(p) => {
            return Err(SpecError::new(format!(
                "--data {}: no such file or folder",
                p.display()
            )))
        }
        None => {
            std::fs::create_dir_all(out)
                .map_err(|e| SpecError::new(format!("--out {}: cannot create: {e}", out.display())))?;
            let p = out.join("devils-dictionary.txt");
            if !p.is_file() {
                exatrain_tune::store::write_atomic(&p, CORPUS.as_bytes())?;
            }
            p
        }
    };
    if let Ok(d) = data::Dataset::open(&dir, 1) {
        let bytes = std::fs::metadata(&source).map(|m| m.len()).unwrap_or(0);
        if d.meta.source_bytes == bytes && d.meta.vocab_size <= vocab {
            return Ok(dir);
        }
    }
    data::prepare(&source, vocab, &dir)?;
    Ok(dir)
}

/// The side effects of starting: a new run claims its folder and tokenizes its data.
pub(crate) fn start(a: &TrainArgs, run: &Run) -> Result<(), SpecError> {
    if run.resumed.is_none() {
        run_folder::claim(&run.out, a.overwrite)?;
        prepare_data(a.data.as_deref(), &run.out, run.spec.vocab)?;
    }
    Ok(())
}

/// The one-line summary of a step on the progress bar.
pub(crate) fn summary_line(loss: f64, lr: f64, tokens_per_s: f64) -> String {
    format!("loss {loss:.3} | lr {lr:.2e} | {tokens_per_s:.0} tok/s")
}

pub fn run_train(a: TrainArgs, given: Given) -> Result<(), SpecError> {
    match a.device {
        Device::Cpu if a.gpu != 0 || a.no_tf32 => {
            return Err(SpecError::new("--gpu and --no-tf32 go with --device cuda"))
        }
        Device::Cuda if a.mpi => {
            return Err(SpecError::new(
                "--device cuda trains one rank on one GPU: --mpi goes with --device cpu for now",
            ))
        }
        _ => {}
    }
    if a.mpi {
        return crate::train_ranks::run_mpi(&a, &given);
    }
    let run = resolve(&a, &given, None)?;
    if a.device == Device::Cuda {
        if !run.layout.is_single() || a.report.is_some() || a.no_ckpt {
            return crate::train_gpu::run_ranks(&a, &run);
        }
        return crate::train_gpu::run(&a, &run);
    }
    // a report (or a run without checkpoints) comes from the parallel engine, even on one rank
    if !run.layout.is_single() || a.report.is_some() || a.no_ckpt {
        return crate::train_ranks::run_in_process(&a, &run);
    }
    run_folder::check_memory(&run.spec, &run.pc, 1)?;
    start(&a, &run)?;
    let trainer = match &run.resumed {
        Some(r) => Trainer::resume(&r.ckpt, Some(run.cfg.clone()))?,
        None => Trainer::new(run.spec.clone(), run.cfg.clone(), &run.data, &run.out)?,
    };
    drive(&a, &run, trainer)
}

/// The one-process training loop on any backend: steps, progress, evaluations, samples,
/// checkpoints.
pub(crate) fn drive<B: Backend<R = f32>>(a: &TrainArgs, run: &Run, mut trainer: Trainer<B>) -> Result<(), SpecError> {
    trainer.run = serde_json::to_value(&run.layout).expect("json");
    let meta = trainer.data.meta.clone();
    if !a.json {
        let b = trainer.bytes();
        let mib = |x: usize| x as f64 / 1048576.0;
        eprintln!(
            "{}: {:.2} M params, {} train / {} val tokens (unigram entropy {:.2} nats), step {} → {}; memory MiB: weights {:.1}, grads {:.1}, optimizer {:.1}, activations {:.1} (+ backward workspace, allocated at the first step)",
            trainer.spec.name,
            trainer.model.layout.total as f64 / 1e6,
            meta.train_tokens,
            meta.val_tokens,
            meta.unigram_entropy,
            trainer.step,
            trainer.cfg.steps,
            mib(b.weights),
            mib(b.grads),
            mib(b.optimizer),
            mib(b.activations)
        );
    }
    let progress = Progress::new(&run.out, trainer.step, trainer.cfg.steps, a.json)?;
    while trainer.step < trainer.cfg.steps {
        let log = match trainer.train_step() {
            Ok(l) => l,
            Err(e) => {
                progress.finish();
                return Err(e);
            }
        };
        let line = serde_json::to_value(&log).expect("json");
        let msg = format!(
            "{} | {:.3} TFLOP/s | MFU {:.1}%",
            summary_line(log.loss, log.lr, log.tokens_per_s),
            log.model_tflops,
            100.0 * log.mfu
        );
        progress.step(log.step, &line, msg)?;
        if !a.json {
            if let Some(v) = log.val_loss {
                progress.say(format!(
                    "step {:>5}: train {:.3} | val {:.3} | unigram {:.3} | {:.0} tok/s | {:.3} TFLOP/s | MFU {:.1}%",
                    log.step,
                    log.loss,
                    v,
                    meta.unigram_entropy,
                    log.tokens_per_s,
                    log.model_tflops,
                    100.0 * log.mfu
                ));
            }
            if let Some(s) = &log.sample {
                progress.say(format!(
                    "  sample: {}{}",
                    trainer.cfg.sample_prompt,
                    s.replace('\n', " ")
                ));
            }
            if let Some(c) = &log.checkpoint {
                progress.say(format!("  checkpoint {}", c.display()));
            }
        }
    }
    progress.finish();
    Ok(())
}
