//! `exatrain train`, `exatrain sample`, `exatrain export-hf`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use exatrain_parallel::comm::Communicator;
use exatrain_spec::{load, Dtype, ModelSpec, ParallelConfig, RankOrder, Recompute, SpecError};
use exatrain_train::checkpoint;
use exatrain_train::data;
use exatrain_train::model::Gpt;
use exatrain_train::parallel::{self, Options, RankReport, RankResult, Schedule, Start};
use exatrain_train::train::{self, TrainConfig, Trainer};

const CORPUS: &str = include_str!("../../../data/corpus/devils-dictionary.txt");

#[derive(Args)]
pub struct TrainArgs {
    /// Model preset or file (GPT-2 architecture).
    #[arg(long, default_value = "gpt-mini")]
    pub model: String,
    /// A text file to tokenize, or a folder made from one [default: the bundled public-domain corpus].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Optimizer steps (with --resume: the total to reach).
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
    /// Continue a run (its folder or a checkpoint); --steps may extend it.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// One JSON line per step on stdout instead of the progress bar.
    #[arg(long)]
    pub json: bool,
    /// Run N in-process ranks (threads) of the layout below instead of one process.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Tensor-parallel size (Megatron's column/row-parallel split, vocab-parallel embedding and loss).
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// Pipeline-parallel size (contiguous layers per stage).
    #[arg(long, default_value_t = 1)]
    pub pp: u32,
    /// Data-parallel size [default: ranks / (tp·pp)].
    #[arg(long)]
    pub dp: Option<u32>,
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

fn data_dir(a: &TrainArgs, vocab: u32) -> Result<PathBuf, SpecError> {
    prepare_data(a.data.as_deref(), &a.out, vocab)
}

/// The tokenized data of a run in `out`: `data` if it is a prepared folder, else `data` (a text
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
                std::fs::write(&p, CORPUS).map_err(|e| SpecError::new(format!("--out {}: {e}", out.display())))?;
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
    }
}

/// The layout the flags describe for a job of `world` ranks (the trainer runs fp32).
fn layout(a: &TrainArgs, world: usize) -> Result<ParallelConfig, SpecError> {
    let cells = (a.tp as usize).max(1) * (a.pp as usize).max(1);
    let dp = match a.dp {
        Some(d) => d,
        None if world % cells == 0 => (world / cells) as u32,
        None => {
            return Err(SpecError::new(format!(
                "{world} ranks are not divisible by --tp {} × --pp {}",
                a.tp, a.pp
            )))
        }
    };
    Ok(ParallelConfig {
        tp: a.tp,
        pp: a.pp,
        dp,
        micro_batch: a.micro_batch as u32,
        global_batch: a.global_batch as u32,
        zero: a.zero,
        recompute: a.recompute.parse::<Recompute>()?,
        sequence_parallel: a.sequence_parallel,
        virtual_stages: a.virtual_stages,
        flash_attention: false,
        dtype: Dtype::Fp32,
        overlap_dp: !a.no_overlap_dp,
        order: a.order.parse::<RankOrder>()?,
    })
}

/// The measured breakdown of a parallel run beside the planner's prediction for its layout.
fn report_json(
    a: &TrainArgs,
    spec: &ModelSpec,
    pc: &ParallelConfig,
    reports: &[RankReport],
) -> Result<serde_json::Value, SpecError> {
    let cluster = load::cluster(&a.cluster)?;
    let (trained, layout) = parallel::as_trained(spec, pc);
    let planned = exatrain_cost::plan(&trained, &cluster, &layout)?;
    let measured = parallel::aggregate(reports);
    Ok(serde_json::json!({
        "tokens_per_s": (pc.global_batch as f64 * spec.seq_len as f64) / measured.step_s,
        "model": spec.name,
        "model_spec": spec,
        "layout": pc,
        "schedule": a.schedule,
        "cluster": cluster.name,
        "ranks": reports,
        "measured": measured,
        "planned": crate::reports::planned(&planned),
    }))
}

/// `--report FILE`, written atomically (its folder made if missing).
fn write_report(path: &Path, rep: &serde_json::Value) -> Result<(), SpecError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| SpecError::new(format!("--report {}: {e}", path.display())))?;
    }
    exatrain_tune::store::write_atomic(path, serde_json::to_string_pretty(rep).expect("json").as_bytes())
}

/// `--bucket-mb` as fp32 elements.
fn bucket_elems(mb: f64) -> Result<usize, SpecError> {
    if !(mb.is_finite() && mb >= 0.0) {
        return Err(SpecError::new(format!(
            "--bucket-mb {mb}: must be a size in MB ≥ 0 (0: one bucket per chunk)"
        )));
    }
    Ok((mb * 1e6 / 4.0) as usize)
}

/// Everything a parallel job's ranks share: the run, the layout, where it starts.
struct Job {
    spec: ModelSpec,
    cfg: TrainConfig,
    pc: ParallelConfig,
    schedule: Schedule,
    bucket_elems: usize,
    data: PathBuf,
    start: Option<Start>,
    out: PathBuf,
    checkpoints: bool,
}

/// The run to start or resume, checked against a world of `world` ranks before any work.
fn job(a: &TrainArgs, world: usize, prepare_data: bool) -> Result<Job, SpecError> {
    let schedule: Schedule = a.schedule.parse()?;
    let (spec, cfg, data, start, out) = match &a.resume {
        Some(r) => {
            let dir = checkpoint::resolve(r)?;
            let (state, params, opt) = checkpoint::load(&dir, true)?;
            let mut cfg: TrainConfig = serde_json::from_value(state.config.clone())
                .map_err(|e| SpecError::new(format!("{}: corrupt checkpoint config: {e}", dir.display())))?;
            cfg.steps = a.steps;
            let (m, v) = opt.expect("asked for the optimizer");
            let start = Start {
                step: state.step,
                opt_step: state.opt_step,
                params,
                m,
                v,
            };
            let out = dir.parent().unwrap_or(Path::new(".")).to_path_buf();
            (state.model, cfg, state.data_dir, Some(start), out)
        }
        None => {
            let spec = load::model(&a.model)?;
            let cfg = config(a);
            // the layout is checked before the data is touched
            parallel::check(&spec, &cfg, &layout(a, world)?, world)?;
            let data = if prepare_data {
                data_dir(a, spec.vocab)?
            } else {
                match &a.data {
                    Some(p) if p.is_dir() => p.clone(),
                    _ => a.out.join("data"),
                }
            };
            (spec, cfg, data, None, a.out.clone())
        }
    };
    let pc = layout(a, world)?;
    parallel::check(&spec, &cfg, &pc, world)?;
    Ok(Job {
        spec,
        cfg,
        pc,
        schedule,
        bucket_elems: bucket_elems(a.bucket_mb)?,
        data,
        start,
        out,
        checkpoints: !a.no_ckpt,
    })
}

/// Run this rank of the job: world rank 0 prints a JSON line per step and writes checkpoints
/// (the whole model, so any layout can resume them).
fn run_rank(j: &Job, world: &dyn Communicator) -> Result<RankResult, SpecError> {
    let print = |l: &parallel::StepLine| {
        let line = serde_json::json!({
            "step": l.step, "loss": l.loss, "grad_norm": l.grad_norm, "lr": l.lr, "seconds": l.seconds,
            "tokens_per_s": l.tokens_per_s, "ranks": j.pc.gpus(), "tp": j.pc.tp, "pp": j.pc.pp, "dp": j.pc.dp, "zero": j.pc.zero,
        });
        println!("{line}");
    };
    let save = |st: &Start| -> Result<(), SpecError> {
        let shape = exatrain_train::GptShape::from_spec(&j.spec)?;
        let state = checkpoint::State {
            format: "exatrain-ckpt-v1".into(),
            step: st.step,
            opt_step: st.opt_step,
            sequences: st.step * j.cfg.global_batch as u64,
            seed: j.cfg.seed,
            model: j.spec.clone(),
            config: serde_json::to_value(&j.cfg).expect("json"),
            data_dir: j.data.clone(),
        };
        let layout = exatrain_train::model::ParamLayout::new(&shape);
        let dir = checkpoint::save(
            &j.out,
            &state,
            &layout,
            &st.params,
            &st.m,
            &st.v,
            &j.data.join("tokenizer.json"),
        )?;
        eprintln!("checkpoint {}", dir.display());
        Ok(())
    };
    let opts = Options {
        schedule: j.schedule,
        bucket_elems: j.bucket_elems,
        start: j.start.clone(),
        on_checkpoint: if j.checkpoints { Some(&save) } else { None },
        on_step: Some(&print),
    };
    parallel::train(&j.spec, &j.cfg, &j.pc, &opts, &j.data, world)
}

fn summary(j: &Job, r: &RankResult, seconds: f64) {
    let steps = r.losses.len();
    let tokens = (j.cfg.global_batch * j.spec.seq_len as usize * steps) as f64;
    let m = &r.report.memory_bytes;
    eprintln!(
        "{} ranks ({}): {steps} steps in {seconds:.1} s ({:.0} tokens/s); rank 0 holds MiB: weights {:.2}, grads {:.2}, optimizer {:.2}, activations {:.2}",
        j.pc.gpus(),
        parallel::describe(&j.pc),
        tokens / seconds,
        m.weights as f64 / 1048576.0,
        m.grads as f64 / 1048576.0,
        m.optimizer as f64 / 1048576.0,
        m.activations as f64 / 1048576.0,
    );
}

/// `--ranks N`: the layout over in-process ranks (threads).
fn run_in_process(a: &TrainArgs) -> Result<(), SpecError> {
    let j = job(a, a.ranks, true)?;
    let comms = exatrain_parallel::comm::in_process(a.ranks, std::time::Duration::from_secs(30));
    let t0 = std::time::Instant::now();
    let results: Vec<Result<RankResult, SpecError>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let j = &j;
                s.spawn(move || run_rank(j, &comm))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    // the first error that is not another rank's echo of it
    let mut firsts: Vec<&SpecError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    firsts.sort_by_key(|e| e.0.contains("was aborted"));
    if let Some(e) = firsts.first() {
        return Err((*e).clone());
    }
    let results: Vec<RankResult> = results.into_iter().map(|r| r.expect("checked")).collect();
    if let Some(path) = &a.report {
        let reports: Vec<RankReport> = results.iter().map(|r| r.report.clone()).collect();
        let rep = report_json(a, &j.spec, &j.pc, &reports)?;
        write_report(path, &rep)?;
    }
    summary(&j, &results[0], t0.elapsed().as_secs_f64());
    Ok(())
}

/// Every rank's report on every rank (JSON text carried as one f32 per byte).
#[cfg(feature = "mpi")]
fn gather_reports(world: &dyn Communicator, mine: &RankReport) -> Result<Vec<RankReport>, SpecError> {
    let text = serde_json::to_vec(mine).expect("json");
    let n = world.size();
    let mut lens = vec![0.0f32; n];
    world
        .all_gather(&[text.len() as f32], &mut lens)
        .map_err(|e| SpecError::new(e.0))?;
    let max = lens.iter().fold(0.0f32, |a, b| a.max(*b)) as usize;
    let mut mine_f = vec![0.0f32; max];
    for (d, b) in mine_f.iter_mut().zip(&text) {
        *d = *b as f32;
    }
    let mut all = vec![0.0f32; max * n];
    world.all_gather(&mine_f, &mut all).map_err(|e| SpecError::new(e.0))?;
    (0..n)
        .map(|r| {
            let bytes: Vec<u8> = all[r * max..r * max + lens[r] as usize]
                .iter()
                .map(|x| *x as u8)
                .collect();
            serde_json::from_slice(&bytes).map_err(|e| SpecError::new(format!("rank {r}'s report: {e}")))
        })
        .collect()
}

/// `--mpi`: this process is one rank of the MPI job; rank 0 prepares the data and prints.
#[cfg(feature = "mpi")]
fn run_mpi(a: &TrainArgs) -> Result<(), SpecError> {
    let (_universe, comm) = exatrain_parallel::mpi_comm::Mpi::world().map_err(|e| SpecError::new(e.0))?;
    let fail = |e: SpecError| -> SpecError {
        comm.abort(&e.0);
        e
    };
    // Rank 0 tokenizes (once); the others wait for it, then open the same folder.
    let j = job(a, comm.size(), comm.rank() == 0).map_err(fail)?;
    comm.barrier().map_err(|e| SpecError::new(e.0))?;
    let t0 = std::time::Instant::now();
    let r = run_rank(&j, &comm)?;
    let reports = gather_reports(&comm, &r.report)?;
    if comm.rank() == 0 {
        if let Some(path) = &a.report {
            let rep = report_json(a, &j.spec, &j.pc, &reports)?;
            write_report(path, &rep)?;
        }
        summary(&j, &r, t0.elapsed().as_secs_f64());
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_a: &TrainArgs) -> Result<(), SpecError> {
    Err(SpecError::new(
        "--mpi: this exatrain was built without MPI (build with `cargo build --release --features mpi`; needs libopenmpi-dev and libclang-dev)",
    ))
}

pub fn run_train(a: TrainArgs) -> Result<(), SpecError> {
    if a.mpi {
        return run_mpi(&a);
    }
    if a.ranks == 0 {
        return Err(SpecError::new("--ranks must be a positive integer"));
    }
    // a report (or a run without checkpoints) comes from the parallel engine, even on one rank
    let parallel = a.ranks > 1 || a.tp > 1 || a.pp > 1 || a.dp.is_some_and(|d| d > 1);
    if parallel || a.report.is_some() || a.no_ckpt {
        return run_in_process(&a);
    }
    let mut trainer = match &a.resume {
        Some(r) => Trainer::resume(r, Some(a.steps))?,
        None => {
            let spec = load::model(&a.model)?;
            let cfg = config(&a);
            cfg.check()?;
            let dir = data_dir(&a, spec.vocab)?;
            Trainer::new(spec, cfg, &dir, &a.out)?
        }
    };
    let metrics_path = a.resume.as_ref().map_or(a.out.clone(), |r| {
        checkpoint::resolve(r)
            .ok()
            .and_then(|d| d.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| a.out.clone())
    });
    let mut metrics = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(metrics_path.join("metrics.jsonl"))
        .map_err(|e| SpecError::new(format!("{}: {e}", metrics_path.display())))?;
    let meta = trainer.data.meta.clone();
    if !a.json {
        let b = trainer.bytes();
        let mib = |x: usize| x as f64 / 1048576.0;
        eprintln!(
            "{}: {:.2} M params, {} train / {} val tokens (unigram entropy {:.2} nats), step {} → {}; memory MiB: weights {:.1}, grads {:.1}, optimizer {:.1}, activations {:.1} (+ backward workspace, allocated at the first step)",
            trainer.spec.name,
            trainer.model.params.len() as f64 / 1e6,
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
    let pb = indicatif::ProgressBar::new(trainer.cfg.steps);
    pb.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("template"));
    pb.set_position(trainer.step);
    if a.json {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    // Progress lines go above the bar on a terminal, to stderr otherwise.
    let say = |pb: &indicatif::ProgressBar, s: String| {
        if pb.is_hidden() {
            eprintln!("{s}")
        } else {
            pb.println(s)
        }
    };
    while trainer.step < trainer.cfg.steps {
        let log = trainer.train_step()?;
        let line = serde_json::to_string(&log).expect("json");
        writeln!(metrics, "{line}").map_err(|e| SpecError::new(format!("metrics.jsonl: {e}")))?;
        if a.json {
            println!("{line}");
        } else {
            pb.set_position(log.step);
            pb.set_message(format!(
                "loss {:.3} | lr {:.2e} | {:.0} tok/s | {:.3} TFLOP/s | MFU {:.1}%",
                log.loss,
                log.lr,
                log.tokens_per_s,
                log.model_tflops,
                100.0 * log.mfu
            ));
            if let Some(v) = log.val_loss {
                say(
                    &pb,
                    format!(
                    "step {:>5}: train {:.3} | val {:.3} | unigram {:.3} | {:.0} tok/s | {:.3} TFLOP/s | MFU {:.1}%",
                    log.step, log.loss, v, meta.unigram_entropy, log.tokens_per_s, log.model_tflops, 100.0 * log.mfu
                ),
                );
            }
            if let Some(s) = &log.sample {
                say(
                    &pb,
                    format!("  sample: {}{}", trainer.cfg.sample_prompt, s.replace('\n', " ")),
                );
            }
            if let Some(c) = &log.checkpoint {
                say(&pb, format!("  checkpoint {}", c.display()));
            }
        }
    }
    pb.finish_and_clear();
    Ok(())
}

#[derive(Args)]
pub struct SampleArgs {
    /// A checkpoint or a run folder.
    pub ckpt: PathBuf,
    #[arg(long, default_value = "LOVE, n.")]
    pub prompt: String,
    #[arg(long, default_value_t = 60)]
    pub tokens: usize,
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn load_model(ckpt: &Path) -> Result<(PathBuf, Gpt<f32>, checkpoint::State), SpecError> {
    let dir = checkpoint::resolve(ckpt)?;
    let (state, params, _) = checkpoint::load(&dir, false)?;
    let shape = exatrain_train::GptShape::from_spec(&state.model)?;
    let mut m = Gpt::<f32>::new(shape, 0);
    m.params = params;
    Ok((dir, m, state))
}

pub fn run_sample(a: SampleArgs) -> Result<(), SpecError> {
    let (dir, mut m, _) = load_model(&a.ckpt)?;
    let tk = data::load_tokenizer(&dir)?;
    let text = train::sample(&mut m, &tk, &a.prompt, a.tokens, a.temperature, a.seed)?;
    println!("{}{}", a.prompt, text);
    Ok(())
}

#[derive(Args)]
pub struct ExportHfArgs {
    /// A checkpoint or a run folder.
    pub ckpt: PathBuf,
    /// Output folder for config.json, model.safetensors and tokenizer.json.
    pub dir: PathBuf,
}

pub fn run_export_hf(a: ExportHfArgs) -> Result<(), SpecError> {
    let (dir, m, _) = load_model(&a.ckpt)?;
    let tk = data::load_tokenizer(&dir)?;
    exatrain_train::hf::export(&m.shape, &m.params, tk.token_to_id("<|endoftext|>"), &a.dir)?;
    std::fs::copy(dir.join("tokenizer.json"), a.dir.join("tokenizer.json"))
        .map_err(|e| SpecError::new(format!("{}: {e}", a.dir.display())))?;
    println!(
        "wrote {}/config.json, model.safetensors, tokenizer.json",
        a.dir.display()
    );
    Ok(())
}
