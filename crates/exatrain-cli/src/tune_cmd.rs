//! `exatrain tune`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use exatrain_cost::plan;
use exatrain_spec::{ClusterSpec, ModelSpec, ParallelConfig, RankOrder, Recompute, SpecError};
use exatrain_tune::bayes::{self, Settings, Strategy};
use exatrain_tune::eval::{CommandEval, CostModel, Evaluator, Metric};
use exatrain_tune::exhaustive::Ranked;
use exatrain_tune::space::{self, SpaceSpec};
use exatrain_tune::store::{Store, Trial};
use serde::{Deserialize, Serialize};

use crate::args::SpecArgs;
use crate::tune_exhaustive::{exhaustive_cmd, print_table, row};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StrategyArg {
    Exhaustive,
    Bayes,
    Random,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvaluatorArg {
    /// The cost model (instant; for exhaustive search, or to test the Bayesian search).
    Model,
    /// An external command per trial (--eval-cmd).
    Command,
    /// A short run of exatrain's own trainer per trial (--launcher, --trial-steps); the
    /// throughput is read from the run's --report.
    Train,
    /// Megatron-LM: each trial is the exported job (`export --format megatron-lm`) run for
    /// --trial-steps iterations; throughput and out-of-memory from its log.
    MegatronLm,
    /// Megatron-DeepSpeed, as megatron-lm.
    MegatronDeepspeed,
    /// torchtitan, as megatron-lm.
    Torchtitan,
}

impl EvaluatorArg {
    /// The framework a framework evaluator runs.
    pub fn framework(self) -> Option<exatrain_spec::Framework> {
        match self {
            EvaluatorArg::MegatronLm => Some(exatrain_spec::Framework::MegatronLm),
            EvaluatorArg::MegatronDeepspeed => Some(exatrain_spec::Framework::MegatronDeepspeed),
            EvaluatorArg::Torchtitan => Some(exatrain_spec::Framework::Torchtitan),
            _ => None,
        }
    }
}

#[derive(Args, Clone)]
pub struct TuneArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Devices: N, or a range A..B (every multiple of the node size in it) or A..B:STEP.
    #[arg(long, default_value = "1024")]
    pub gpus: String,
    /// Global batch in sequences; a comma-separated list searches over several.
    #[arg(long, default_value = "1024")]
    pub global_batch: String,
    #[arg(long, value_enum, default_value_t = StrategyArg::Exhaustive)]
    pub strategy: StrategyArg,
    /// Trials for bayes/random [default: 50; with --resume, the stored budget unless a larger one is given].
    #[arg(long)]
    pub budget: Option<usize>,
    /// Random trials before the surrogate takes over (bayes).
    #[arg(long, default_value_t = 10)]
    pub initial: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Configs to show.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
    /// Folder for the results store (bayes/random) or the result (exhaustive).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the search stored in this folder; its settings come from the folder.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = EvaluatorArg::Model)]
    pub evaluator: EvaluatorArg,
    /// Command template for --evaluator command, e.g. 'srun -N {nodes} ./pretrain.sh --tp {tp} --pp {pp} --mbs {micro_batch}'
    /// (without `{cp}` only layouts of context-parallel size 1 are tried).
    #[arg(long)]
    pub eval_cmd: Option<String>,
    /// Seconds before a trial is killed.
    #[arg(long, default_value_t = 3600.0)]
    pub timeout: f64,
    /// Read the throughput from the last JSON line with this key.
    #[arg(long, default_value = "tokens_per_s")]
    pub metric_key: String,
    /// Read the throughput from the last match of this regex instead (first group), e.g. 'TFLOPs: ([0-9.]+)'.
    #[arg(long)]
    pub metric_regex: Option<String>,
    /// Trials run at once.
    #[arg(long, default_value_t = 1)]
    pub parallel_trials: usize,
    /// With --evaluator train: how to start a trial's ranks, e.g. 'mpirun -n {gpus}
    /// --oversubscribe' (the trainer then runs with --mpi); empty: in-process ranks (--ranks {gpus}).
    #[arg(long, default_value = "")]
    pub launcher: String,
    /// With --evaluator train: optimizer steps per trial (the first is warm-up, not timed); with
    /// a framework evaluator: iterations per trial (the first 2 are warm-up) [default: 3 / 10].
    #[arg(long)]
    pub trial_steps: Option<u64>,
    /// With a framework evaluator: how each trial's job starts: torchrun (launch.sh, on this
    /// node) or slurm (job.sbatch run with bash inside your allocation: srun places the ranks).
    #[arg(long, default_value = "torchrun")]
    pub job_launcher: String,
    /// With --strategy bayes: seed the search with the cost model on this cluster (a preset,
    /// or the file `exatrain calibrate --fit` wrote): the model's best layouts are the initial
    /// design, and the surrogate learns how far the measurements are from the model.
    #[arg(long)]
    pub prior: Option<String>,
    /// With --strategy bayes: a constant mean for the surrogate instead of the textbook
    /// step-time trend whose machine constants are fitted to the trials (an ablation; with
    /// --prior the cost model is the mean and the trend is not used).
    #[arg(long)]
    pub no_trend: bool,
    /// Largest micro-batch considered.
    #[arg(long, default_value_t = 16)]
    pub max_micro_batch: u32,
    /// Largest tensor-parallel size considered.
    #[arg(long)]
    pub max_tp: Option<u32>,
    /// Largest pipeline-parallel size considered.
    #[arg(long)]
    pub max_pp: Option<u32>,
    /// Largest context-parallel size considered (1: none). Default: every size that leaves each
    /// rank at least 4096 tokens of a sequence (none at seq_len 4096 or below), flash attention only.
    #[arg(long)]
    pub max_cp: Option<u32>,
    /// ZeRO stages to consider (comma-separated).
    #[arg(long, default_value = "0,1,2,3")]
    pub zero: String,
    /// Recompute modes to consider (comma-separated).
    #[arg(long, default_value = "none,selective,full")]
    pub recompute: String,
    /// Only the default rank order tp-dp-pp.
    #[arg(long)]
    pub default_order: bool,
    /// Search only layouts this framework runs (megatron-lm, megatron-deepspeed, torchtitan), so
    /// that the best can be exported to it (`export --from tune.json --format NAME`).
    #[arg(long)]
    pub framework: Option<String>,
    /// Also consider --pp sizes that do not divide the layers (stages spread as evenly as
    /// possible: 126 layers on 16 stages as 7, 14 × 8, 7).
    #[arg(long)]
    pub uneven_stages: bool,
    /// Do not consider flash attention.
    #[arg(long)]
    pub no_flash: bool,
    /// Do not consider interleaved schedules.
    #[arg(long)]
    pub no_interleave: bool,
    /// Do not consider sequence parallelism.
    #[arg(long)]
    pub no_sp: bool,
    /// Search layouts whose transformer blocks' linear layers run in FP8 (as `plan --fp8`;
    /// needs a device with an FP8 peak, and only Megatron-LM is exported with it).
    #[arg(long)]
    pub fp8: bool,
}

/// Everything a stored search needs to resume.
#[derive(Serialize, Deserialize)]
struct Meta {
    model: ModelSpec,
    cluster: ClusterSpec,
    space: SpaceSpec,
    strategy: StrategyArg,
    budget: usize,
    initial: usize,
    seed: u64,
    parallel_trials: usize,
    evaluator: EvaluatorArg,
    eval_cmd: Option<String>,
    timeout: f64,
    metric_key: String,
    metric_regex: Option<String>,
    #[serde(default)]
    launcher: String,
    #[serde(default)]
    trial_steps: u64,
    #[serde(default)]
    job_launcher: String,
    #[serde(default)]
    prior: Option<ClusterSpec>,
    #[serde(default)]
    no_trend: bool,
}

fn parse_list<T>(s: &str, flag: &str, f: impl Fn(&str) -> Result<T, SpecError>) -> Result<Vec<T>, SpecError> {
    let v: Vec<T> = s.split(',').map(|x| f(x.trim())).collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err(SpecError::new(format!("--{flag} needs at least one value")));
    }
    Ok(v)
}

/// `--zero 0,1`: the ZeRO stages to search, each 0..=3, at least one, each once (for `tune` and
/// `study`).
pub fn zero_stages(s: &str) -> Result<Vec<u8>, SpecError> {
    let mut v = parse_list(s, "zero", |x| match x.parse::<u8>() {
        Ok(z) if z <= 3 => Ok(z),
        _ => Err(SpecError::new(format!(
            "--zero {x} is not a ZeRO stage (allowed: 0, 1, 2, 3)"
        ))),
    })?;
    v.sort();
    v.dedup();
    Ok(v)
}

fn positive(x: &str, flag: &str) -> Result<u32, SpecError> {
    match x.parse::<u32>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(SpecError::new(format!("--{flag} {x} is not a positive integer"))),
    }
}

/// The largest device count `--gpus` takes, and the most counts one range may list.
const MAX_GPUS: u32 = 1 << 20;
const MAX_GPU_COUNTS: usize = 4096;

/// `N`, `A..B` (multiples of `step` in [A, B]) or `A..B:STEP`.
pub fn parse_gpus(s: &str, node: u32) -> Result<Vec<u32>, SpecError> {
    let Some((a, rest)) = s.split_once("..") else {
        let g = positive(s, "gpus")?;
        if g > MAX_GPUS {
            return Err(SpecError::new(format!("--gpus {s}: at most {MAX_GPUS} GPUs")));
        }
        return Ok(vec![g]);
    };
    let (b, step) = match rest.split_once(':') {
        Some((b, st)) => (b, positive(st, "gpus step")?),
        None => (rest, node),
    };
    let (a, b) = (positive(a, "gpus")?, positive(b, "gpus")?);
    if a > b {
        return Err(SpecError::new(format!("--gpus {s}: the range is empty ({a} > {b})")));
    }
    if b > MAX_GPUS {
        return Err(SpecError::new(format!("--gpus {s}: at most {MAX_GPUS} GPUs")));
    }
    let v: Vec<u32> = (a..=b).filter(|g| g % step == 0 || *g == a).collect();
    if v.len() > MAX_GPU_COUNTS {
        return Err(SpecError::new(format!(
            "--gpus {s}: {} device counts; at most {MAX_GPU_COUNTS} (use a larger step, A..B:STEP)",
            v.len()
        )));
    }
    Ok(v)
}

/// The layouts the tuner tries on exatrain's trainer: fp32, ZeRO 0-2, the kept-probabilities
/// attention and no context parallelism (the trainer runs both, `train --flash-attention --cp`,
/// but its host flash kernel recomputes the scores, and context parallelism pays only where
/// ranks keep thousands of tokens, which the space asks for).
fn trainer_space(s: &mut SpaceSpec) -> Result<(), SpecError> {
    s.max_cp = 1;
    if s.fp8 {
        return Err(SpecError::new(
            "--fp8: the trainer runs fp32 (allowed with --evaluator train: no --fp8)",
        ));
    }
    s.dtype = exatrain_spec::Dtype::Fp32;
    s.flash_attention = vec![false];
    s.zero.retain(|z| *z <= 2);
    if s.zero.is_empty() {
        return Err(SpecError::new(
            "--zero: the trainer implements ZeRO 0, 1 and 2 (allowed with --evaluator train: 0,1,2)",
        ));
    }
    Ok(())
}

/// Single-quoted for `sh -c`.
fn quote(p: &std::path::Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// `--evaluator train`: the command template of a trial run and where its throughput is. The
/// model, the cluster and the tokenized corpus are written into `dir` once, so every trial
/// trains the same spec on the same data.
fn train_eval(meta: &Meta, dir: &std::path::Path) -> Result<(String, Metric), SpecError> {
    let exe = std::env::current_exe().map_err(|e| SpecError::new(format!("cannot find the exatrain binary: {e}")))?;
    let write = |name: &str, v: String| -> Result<std::path::PathBuf, SpecError> {
        let p = dir.join(name);
        exatrain_tune::store::write_atomic(&p, v.as_bytes())?;
        Ok(p)
    };
    let model = write("model.json", serde_json::to_string_pretty(&meta.model).expect("json"))?;
    let cluster = write(
        "cluster.json",
        serde_json::to_string_pretty(&meta.cluster).expect("json"),
    )?;
    let data = crate::train_cmd::prepare_data(None, dir, meta.model.vocab)?;
    let trials = dir.join("trials");
    let ranks = if meta.launcher.trim().is_empty() {
        "--ranks {gpus}"
    } else {
        "--mpi"
    };
    let template = format!(
        "{launcher} {exe} train --model {model} --data {data} --cluster {cluster} --tp {{tp}} --pp {{pp}} --dp {{dp}} \
         --micro-batch {{micro_batch}} --global-batch {{global_batch}} --zero {{zero}} --recompute {{recompute}} \
         --sequence-parallel {{sequence_parallel}} --virtual-stages {{virtual_stages}} --order {{order}} --cp {{cp}} \
         --flash-attention {{flash_attention}} \
         --steps {steps} --warmup 0 --eval-every {never} --no-ckpt --overwrite --json {ranks} \
         --out {trials}/{{trial}} --report {trials}/{{trial}}/report.json",
        launcher = meta.launcher,
        exe = quote(&exe),
        model = quote(&model),
        data = quote(&data),
        cluster = quote(&cluster),
        steps = meta.trial_steps,
        never = meta.trial_steps + 1,
        trials = quote(&trials),
    );
    let metric = Metric::JsonFile {
        path: format!("{}/{{trial}}/report.json", trials.display()),
        pointer: "/tokens_per_s".into(),
    };
    Ok((template, metric))
}

/// ln(predicted tokens/s) of every layout on the `prior` cluster, NaN where it does not fit.
fn prior_of(meta: &Meta, space: &[ParallelConfig], prior: &ClusterSpec) -> Vec<f64> {
    let trainer = prior.for_trainer();
    space
        .iter()
        .map(|c| {
            let (m, l, prior) = match meta.evaluator {
                EvaluatorArg::Train => {
                    let (m, l) = exatrain_train::parallel::as_trained(&meta.model, c);
                    (m, l, &trainer)
                }
                _ => (meta.model.clone(), *c, prior),
            };
            match plan(&m, prior, &l) {
                Ok(p) if p.fits => p.tokens_per_s.ln(),
                _ => f64::NAN,
            }
        })
        .collect()
}

pub(crate) fn space_spec(a: &TuneArgs, gpus: u32) -> Result<SpaceSpec, SpecError> {
    let mut s = SpaceSpec::new(gpus, 1);
    s.global_batches = parse_list(&a.global_batch, "global-batch", |x| positive(x, "global-batch"))?;
    for (flag, v) in [
        ("--max-micro-batch", Some(a.max_micro_batch)),
        ("--max-tp", a.max_tp),
        ("--max-pp", a.max_pp),
        ("--max-cp", a.max_cp),
    ] {
        if v == Some(0) {
            return Err(SpecError::new(format!("{flag} 0: must be a positive integer")));
        }
    }
    s.max_micro_batch = a.max_micro_batch;
    s.max_tp = a.max_tp.unwrap_or(u32::MAX);
    s.max_pp = a.max_pp.unwrap_or(u32::MAX);
    s.max_cp = a.max_cp.unwrap_or(u32::MAX);
    s.zero = zero_stages(&a.zero)?;
    s.recompute = parse_list(&a.recompute, "recompute", |x| x.parse::<Recompute>())?;
    s.framework = a.framework.as_deref().map(str::parse).transpose()?;
    s.uneven = a.uneven_stages;
    if a.default_order {
        s.orders = vec![RankOrder::default()];
    }
    if a.no_flash {
        s.flash_attention = vec![false];
    }
    if a.no_sp {
        s.sequence_parallel = vec![false];
    }
    s.interleave = !a.no_interleave;
    s.fp8 = a.fp8;
    if a.evaluator == EvaluatorArg::Train {
        trainer_space(&mut s)?;
    }
    // a command that cannot be told the context-parallel size runs every layout at cp 1
    if a.evaluator == EvaluatorArg::Command && !a.eval_cmd.as_deref().is_some_and(|t| t.contains("{cp}")) {
        s.max_cp = 1;
    }
    if let Some(f) = a.evaluator.framework() {
        if s.framework.is_some_and(|g| g != f) {
            return Err(SpecError::new(format!(
                "--framework {} and --evaluator {f} disagree",
                s.framework.map_or("", |g| g.name())
            )));
        }
        s.framework = Some(f);
    }
    Ok(s)
}

pub(crate) fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

pub fn run(a: TuneArgs) -> Result<(), SpecError> {
    if let Some(dir) = a.resume.clone() {
        return resume(a, dir);
    }
    let (model, cluster) = a.spec.load()?;
    let gpu_list = parse_gpus(&a.gpus, cluster.node.devices)?;
    if a.fp8 {
        cluster.device.require_fp8()?;
    }
    match a.strategy {
        StrategyArg::Exhaustive => {
            if a.evaluator != EvaluatorArg::Model {
                return Err(SpecError::new("--strategy exhaustive runs on the cost model; use --strategy bayes or random with --evaluator command, train or a framework"));
            }
            exhaustive_cmd(&a, &model, &cluster, &gpu_list)
        }
        _ => {
            let [gpus] = gpu_list[..] else {
                return Err(SpecError::new(
                    "--strategy bayes/random takes one --gpus count, not a range",
                ));
            };
            let meta = Meta {
                model,
                cluster,
                space: space_spec(&a, gpus)?,
                strategy: a.strategy,
                budget: a.budget.unwrap_or(50),
                initial: a.initial,
                seed: a.seed,
                parallel_trials: a.parallel_trials.max(1),
                evaluator: a.evaluator,
                eval_cmd: a.eval_cmd.clone(),
                timeout: a.timeout,
                metric_key: a.metric_key.clone(),
                metric_regex: a.metric_regex.clone(),
                launcher: a.launcher.clone(),
                trial_steps: a
                    .trial_steps
                    .unwrap_or(if a.evaluator.framework().is_some() { 10 } else { 3 }),
                job_launcher: a.job_launcher.clone(),
                prior: a.prior.as_deref().map(exatrain_spec::load::cluster).transpose()?,
                no_trend: a.no_trend,
            };
            if meta.prior.is_some() && meta.strategy != StrategyArg::Bayes {
                return Err(SpecError::new(
                    "--prior seeds the Bayesian search: use it with --strategy bayes",
                ));
            }
            if meta.no_trend && meta.strategy != StrategyArg::Bayes {
                return Err(SpecError::new(
                    "--no-trend sets the Bayesian surrogate's mean: use it with --strategy bayes",
                ));
            }
            // evaluators that run jobs keep them, and the results store, in --out
            let keeps = match meta.evaluator {
                EvaluatorArg::Train => Some("the trial runs and the results store go there"),
                e if e.framework().is_some() => Some("the trial jobs, their logs and the results store go there"),
                _ => None,
            };
            if let (Some(what), None) = (keeps, &a.out) {
                let name = meta.evaluator.to_possible_value().expect("a value");
                return Err(SpecError::new(format!(
                    "--evaluator {} needs --out DIR ({what})",
                    name.get_name()
                )));
            }
            preflight(&meta)?;
            let store = match &a.out {
                Some(dir) => Some(Store::create(dir, &meta)?),
                None => None,
            };
            black_box_search(&a, &meta, store, a.out.as_deref(), Vec::new())
        }
    }
}

/// The most trials a search runs, and trials at once.
const MAX_BUDGET: usize = 100_000;
const MAX_PARALLEL_TRIALS: usize = 256;

/// Every flag of a black-box search checked before its store is created, so a typo leaves no
/// folder behind that would block both a rerun and `--resume`.
fn preflight(meta: &Meta) -> Result<(), SpecError> {
    if let Some(why) = space::why_empty(&meta.model, &meta.space) {
        return Err(SpecError::new(why));
    }
    if !(1..=MAX_BUDGET).contains(&meta.budget) {
        return Err(SpecError::new(format!(
            "--budget {}: must be in 1..={MAX_BUDGET}",
            meta.budget
        )));
    }
    if !(1..=MAX_PARALLEL_TRIALS).contains(&meta.parallel_trials) {
        return Err(SpecError::new(format!(
            "--parallel-trials {}: must be in 1..={MAX_PARALLEL_TRIALS}",
            meta.parallel_trials
        )));
    }
    if !(meta.timeout > 0.0 && meta.timeout.is_finite()) {
        return Err(SpecError::new(format!(
            "--timeout {} must be a positive number of seconds",
            meta.timeout
        )));
    }
    if let Some(r) = &meta.metric_regex {
        regex::Regex::new(r).map_err(|e| SpecError::new(format!("--metric-regex: {e}")))?;
    }
    match meta.evaluator {
        EvaluatorArg::Command => {
            let Some(t) = &meta.eval_cmd else {
                return Err(SpecError::new("--evaluator command needs --eval-cmd 'TEMPLATE'"));
            };
            let metric = Metric::JsonKey(meta.metric_key.clone());
            CommandEval::new(t, 1, Duration::from_secs(1), metric)?;
        }
        EvaluatorArg::Train => {
            let v = meta.model.vocab;
            if !(exatrain_train::data::MIN_VOCAB..=65535).contains(&v) {
                return Err(SpecError::new(format!(
                    "--evaluator train: model vocab {v} must be in {}..=65535 (the trainer's byte-level tokenizer and u16 shards)",
                    exatrain_train::data::MIN_VOCAB
                )));
            }
            if meta.trial_steps < 2 {
                return Err(SpecError::new(format!(
                    "--trial-steps {}: at least 2 (the first step is warm-up and not timed)",
                    meta.trial_steps
                )));
            }
            if meta.trial_steps > 1_000_000 {
                return Err(SpecError::new(format!(
                    "--trial-steps {}: at most 1000000",
                    meta.trial_steps
                )));
            }
        }
        EvaluatorArg::Model => {}
        EvaluatorArg::MegatronLm | EvaluatorArg::MegatronDeepspeed | EvaluatorArg::Torchtitan => {
            meta.job_launcher.parse::<exatrain_export::Launcher>().map_err(|_| {
                SpecError::new(format!(
                    "--job-launcher {} is not known (allowed: torchrun, slurm)",
                    meta.job_launcher
                ))
            })?;
            if !(exatrain_tune::framework_eval::WARMUP as u64 + 1..=100_000).contains(&meta.trial_steps) {
                return Err(SpecError::new(format!(
                    "--trial-steps {}: must be in {}..=100000 (the first {} iterations are warm-up)",
                    meta.trial_steps,
                    exatrain_tune::framework_eval::WARMUP + 1,
                    exatrain_tune::framework_eval::WARMUP
                )));
            }
        }
    }
    Ok(())
}

fn resume(a: TuneArgs, dir: PathBuf) -> Result<(), SpecError> {
    let (store, mut meta, history): (Store, Meta, Vec<Trial>) = Store::open(&dir)?;
    // A larger --budget may extend a finished search.
    if let Some(b) = a.budget.filter(|b| *b > meta.budget) {
        meta.budget = b;
    }
    if !a.json {
        eprintln!("resuming {}: {} trials already done", dir.display(), history.len());
    }
    black_box_search(&a, &meta, Some(store), Some(&dir), history)
}

/// `--out DIR`: the result as `DIR/tune.json`, written atomically.
pub(crate) fn write_result(a: &TuneArgs, out: &serde_json::Value) -> Result<(), SpecError> {
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).map_err(|e| SpecError::new(format!("--out {}: {e}", dir.display())))?;
        exatrain_tune::store::write_atomic(&dir.join("tune.json"), out.to_string().as_bytes())?;
    }
    Ok(())
}

fn black_box_search(
    a: &TuneArgs,
    meta: &Meta,
    mut store: Option<Store>,
    dir: Option<&std::path::Path>,
    history: Vec<Trial>,
) -> Result<(), SpecError> {
    let (model, cluster, s) = (&meta.model, &meta.cluster, &meta.space);
    if let Some(why) = space::why_empty(model, s) {
        return Err(SpecError::new(why));
    }
    let space: Vec<ParallelConfig> = space::configs(model, s).collect();
    let cost = CostModel { model, cluster };
    let command;
    let framework;
    let eval: &dyn Evaluator = match meta.evaluator {
        EvaluatorArg::Model => &cost,
        EvaluatorArg::Command => {
            let Some(t) = &meta.eval_cmd else {
                return Err(SpecError::new("--evaluator command needs --eval-cmd 'TEMPLATE'"));
            };
            let metric = match &meta.metric_regex {
                Some(r) => {
                    Metric::Regex(regex::Regex::new(r).map_err(|e| SpecError::new(format!("--metric-regex: {e}")))?)
                }
                None => Metric::JsonKey(meta.metric_key.clone()),
            };
            if !(meta.timeout > 0.0 && meta.timeout.is_finite()) {
                return Err(SpecError::new(format!(
                    "--timeout {} must be a positive number of seconds",
                    meta.timeout
                )));
            }
            command = CommandEval::new(t, cluster.node.devices, Duration::from_secs_f64(meta.timeout), metric)?;
            &command
        }
        EvaluatorArg::Train => {
            let dir = dir.ok_or_else(|| SpecError::new("--evaluator train needs --out DIR"))?;
            let (t, metric) = train_eval(meta, dir)?;
            command = CommandEval::new(&t, cluster.node.devices, Duration::from_secs_f64(meta.timeout), metric)?;
            &command
        }
        EvaluatorArg::MegatronLm | EvaluatorArg::MegatronDeepspeed | EvaluatorArg::Torchtitan => {
            let dir = dir.ok_or_else(|| SpecError::new("a framework evaluator needs --out DIR"))?;
            framework = exatrain_tune::framework_eval::FrameworkEval {
                framework: meta.evaluator.framework().expect("framework evaluator"),
                launcher: meta.job_launcher.parse()?,
                model: model.clone(),
                cluster: cluster.clone(),
                dir: dir.join("trials"),
                trial_steps: meta.trial_steps,
                timeout: Duration::from_secs_f64(meta.timeout),
            };
            &framework
        }
    };
    let strategy = if meta.strategy == StrategyArg::Random {
        Strategy::Random
    } else {
        Strategy::Bayes
    };
    let mut settings = Settings::new(strategy, meta.budget, meta.seed);
    settings.initial = meta.initial;
    settings.parallel = meta.parallel_trials;
    settings.prior = meta.prior.as_ref().map(|p| prior_of(meta, &space, p));
    settings.encoding = Some(bayes::Encoding::new(model, cluster));
    settings.trend = !meta.no_trend;
    let done = history.len() as u64;
    let pb = progress_bar(meta.budget.min(space.len()) as u64, "trials");
    pb.set_position(done);
    let trials = bayes::run(&space, eval, &settings, history, &mut |t| {
        pb.inc(1);
        match &mut store {
            Some(st) => st.append(t),
            None => Ok(()),
        }
    })?;
    pb.finish_and_clear();
    let mut ok: Vec<(&Trial, f64)> = trials
        .iter()
        .filter_map(|t| t.outcome.value().map(|v| (t, v)))
        .collect();
    ok.sort_by(|x, y| y.1.total_cmp(&x.1));
    let rows: Vec<(Ranked, Option<f64>)> = ok
        .iter()
        .take(a.top.max(1))
        .filter_map(|(t, v)| {
            plan(model, cluster, &t.config)
                .ok()
                .map(|p| (Ranked { cfg: t.config, plan: p }, Some(*v)))
        })
        .collect();
    let failed = trials.len() - ok.len();
    // trials until the best was first seen (the count to compare with and without --prior)
    let best_at = ok
        .first()
        .and_then(|(b, _)| trials.iter().position(|t| t.id == b.id))
        .map(|i| i + 1);
    if a.json {
        let out = serde_json::json!({
            "model": model.name,
            "cluster": cluster.name,
            "evaluated": trials.len(),
            "feasible": ok.len(),
            "failed": failed,
            "space": space.len(),
            "prior": meta.prior.as_ref().map(|p| p.name.clone()),
            "best_at_trial": best_at,
            "best": rows.iter().map(|(r, v)| row(r, *v)).collect::<Vec<_>>(),
        });
        println!("{out}");
        return all_failed(&trials);
    }
    println!(
        "{} on {} GPUs: {} trials ({} failed or out of memory) over a space of {} layouts{}; best found at trial {}",
        model.name,
        s.gpus,
        trials.len(),
        failed,
        space.len(),
        meta.prior
            .as_ref()
            .map_or(String::new(), |p| format!(", seeded by the cost model on {}", p.name)),
        best_at.map_or("-".into(), |n| n.to_string())
    );
    print_table(&rows);
    all_failed(&trials)
}

/// A search none of whose trials gave a number is an error naming the first failure.
fn all_failed(trials: &[Trial]) -> Result<(), SpecError> {
    if trials.is_empty() || trials.iter().any(|t| t.outcome.value().is_some()) {
        return Ok(());
    }
    let t = &trials[0];
    Err(SpecError::new(format!(
        "all {} trials failed; the first (trial {}, tp {} pp {} dp {} mbs {}): {}",
        trials.len(),
        t.id,
        t.config.tp,
        t.config.pp,
        t.config.dp,
        t.config.micro_batch,
        serde_json::to_string(&t.outcome).unwrap_or_default()
    )))
}
