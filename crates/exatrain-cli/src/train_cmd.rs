//! `exatrain train`, `exatrain sample`, `exatrain export-hf`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use exatrain_spec::{load, SpecError};
use exatrain_train::checkpoint;
use exatrain_train::data;
use exatrain_train::model::Gpt;
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
    /// Run N data-parallel in-process ranks (threads) instead of one process.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// ZeRO stage for --ranks > 1 or --mpi: 0 (replicated optimizer) or 1 (sharded optimizer state).
    #[arg(long, default_value_t = 0)]
    pub zero: u8,
    /// With --ranks/--mpi: write the measured per-rank breakdown (and the planner's numbers for
    /// the same layout, with the planner's names) to this JSON file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Data parallelism over the MPI ranks of this job (`mpirun -n N exatrain train --mpi`);
    /// needs a build with `--features mpi`.
    #[arg(long)]
    pub mpi: bool,
}

fn data_dir(a: &TrainArgs, vocab: u32) -> Result<PathBuf, SpecError> {
    let dir = a.out.join("data");
    let source = match &a.data {
        Some(p) if p.is_dir() => return Ok(p.clone()),
        Some(p) if p.is_file() => p.clone(),
        Some(p) => {
            return Err(SpecError::new(format!(
                "--data {}: no such file or folder",
                p.display()
            )))
        }
        None => {
            std::fs::create_dir_all(&a.out)
                .map_err(|e| SpecError::new(format!("--out {}: cannot create: {e}", a.out.display())))?;
            let p = a.out.join("devils-dictionary.txt");
            if !p.is_file() {
                std::fs::write(&p, CORPUS).map_err(|e| SpecError::new(format!("--out {}: {e}", a.out.display())))?;
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

/// The measured breakdown of a data-parallel run beside the planner's prediction for the layout.
fn dp_report(
    spec: &exatrain_spec::ModelSpec,
    cfg: &TrainConfig,
    zero: u8,
    results: &[exatrain_train::dp::DpResult],
) -> Result<serde_json::Value, SpecError> {
    let dp = results.len() as u32;
    let layout = exatrain_spec::ParallelConfig {
        zero,
        dtype: exatrain_spec::Dtype::Fp32,
        ..exatrain_spec::ParallelConfig::new(1, 1, dp, cfg.micro_batch as u32, cfg.global_batch as u32)
    };
    let cluster = exatrain_spec::presets::cluster("frontier")?; // bytes do not depend on the machine
    let planned = exatrain_cost::plan(spec, &cluster, &layout)?;
    let steps = cfg.steps as f64;
    let ranks: Vec<serde_json::Value> = results
        .iter()
        .enumerate()
        .map(|(r, x)| {
            serde_json::json!({
                "rank": r,
                "time_s": {"compute": x.compute_seconds / steps, "dp_comm": x.dp_seconds / steps},
                "comm_bytes": {"dp": x.dp_bytes_per_step},
                "memory_bytes": {"weights": x.params.len() * 4, "optimizer": x.optimizer_bytes},
            })
        })
        .collect();
    Ok(serde_json::json!({
        "layout": layout,
        "ranks": ranks,
        "planned": {"comm_bytes": planned.comm_bytes, "memory_bytes": {"weights": planned.memory_bytes.weights, "optimizer": planned.memory_bytes.optimizer}},
    }))
}

/// `--ranks N`: data parallelism over in-process ranks; prints one JSON line per step.
fn run_data_parallel(a: &TrainArgs) -> Result<(), SpecError> {
    if a.resume.is_some() {
        return Err(SpecError::new("--resume is not supported with --ranks > 1 yet"));
    }
    let spec = load::model(&a.model)?;
    let cfg = config(a);
    cfg.check()?;
    if cfg.global_batch % (cfg.micro_batch * a.ranks) != 0 {
        return Err(SpecError::new(format!(
            "--global-batch {} is not divisible by --micro-batch {} × --ranks {}",
            cfg.global_batch, cfg.micro_batch, a.ranks
        )));
    }
    let dir = data_dir(a, spec.vocab)?;
    let comms = exatrain_parallel::comm::in_process(a.ranks, std::time::Duration::from_secs(30));
    let t0 = std::time::Instant::now();
    let results: Vec<Result<exatrain_train::dp::DpResult, SpecError>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (spec, cfg, dir) = (&spec, &cfg, &dir);
                s.spawn(move || {
                    let r = exatrain_train::dp::train(spec, cfg, dir, &comm, a.zero);
                    if let Err(e) = &r {
                        use exatrain_parallel::comm::Communicator;
                        comm.abort(&e.0);
                    }
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let results: Vec<exatrain_train::dp::DpResult> = results.into_iter().collect::<Result<_, _>>()?;
    if let Some(path) = &a.report {
        let rep = dp_report(&spec, &cfg, a.zero, &results)?;
        exatrain_tune::store::write_atomic(path, serde_json::to_string_pretty(&rep).expect("json").as_bytes())?;
    }
    let r = &results[0];
    let seconds = t0.elapsed().as_secs_f64();
    let tokens = (cfg.global_batch * spec.seq_len as usize) as f64;
    for (i, (l, sec)) in r.losses.iter().zip(&r.step_seconds).enumerate() {
        let line = serde_json::json!({"step": i + 1, "loss": l, "seconds": sec, "tokens_per_s": tokens / sec, "ranks": a.ranks, "zero": a.zero});
        println!("{line}");
    }
    eprintln!(
        "{} data-parallel ranks (ZeRO-{}): {} steps in {:.1} s ({:.0} tokens/s); optimizer state per rank {:.1} MiB",
        a.ranks,
        a.zero,
        r.losses.len(),
        seconds,
        (cfg.global_batch * spec.seq_len as usize * r.losses.len()) as f64 / seconds,
        r.optimizer_bytes as f64 / 1048576.0
    );
    Ok(())
}

/// `--mpi`: one data-parallel rank per MPI process; rank 0 prepares the data and prints.
#[cfg(feature = "mpi")]
fn run_mpi(a: &TrainArgs) -> Result<(), SpecError> {
    use exatrain_parallel::comm::Communicator;
    let (_universe, comm) = exatrain_parallel::mpi_comm::Mpi::world().map_err(|e| SpecError::new(e.0))?;
    let spec = load::model(&a.model)?;
    let cfg = config(a);
    cfg.check()?;
    // Rank 0 tokenizes (once); the others wait for it, then open the same folder.
    let dir = if comm.rank() == 0 {
        let d = data_dir(a, spec.vocab);
        if let Err(e) = &d {
            comm.abort(&e.0);
        }
        d?
    } else {
        match &a.data {
            Some(p) if p.is_dir() => p.clone(),
            _ => a.out.join("data"),
        }
    };
    comm.barrier().map_err(|e| SpecError::new(e.0))?;
    let t0 = std::time::Instant::now();
    let r = match exatrain_train::dp::train(&spec, &cfg, &dir, &comm, a.zero) {
        Ok(r) => r,
        Err(e) => {
            comm.abort(&e.0);
            return Err(e);
        }
    };
    if comm.rank() == 0 {
        let seconds = t0.elapsed().as_secs_f64();
        let tokens = (cfg.global_batch * spec.seq_len as usize) as f64;
        for (i, (l, sec)) in r.losses.iter().zip(&r.step_seconds).enumerate() {
            let line = serde_json::json!({"step": i + 1, "loss": l, "seconds": sec, "tokens_per_s": tokens / sec, "ranks": comm.size(), "zero": a.zero});
            println!("{line}");
        }
        eprintln!(
            "{} MPI ranks (ZeRO-{}): {} steps in {:.1} s ({:.0} tokens/s)",
            comm.size(),
            a.zero,
            r.losses.len(),
            seconds,
            (cfg.global_batch * spec.seq_len as usize * r.losses.len()) as f64 / seconds
        );
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
    if a.ranks > 1 {
        return run_data_parallel(&a);
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
