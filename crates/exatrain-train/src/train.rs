//! The training loop, top to bottom: for each step, draw `global_batch / micro_batch`
//! microbatches, forward and backward each (gradients accumulate), clip to the global norm, set
//! the warmup + cosine learning rate, update with AdamW; now and then evaluate, sample, checkpoint.

use std::path::{Path, PathBuf};
use std::time::Instant;

use exatrain_spec::{ModelSpec, SpecError};
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Cpu};
use crate::checkpoint::{self, State};
use crate::data::{self, Dataset};
use crate::guard::Guard;
use crate::model::{Gpt, GptShape, Model};
use crate::optim::{clip_grad_norm_on, lr_at, AdamW, AdamWConfig};

/// Everything a run is configured by (saved in each checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub steps: u64,
    /// Sequences per forward/backward.
    pub micro_batch: usize,
    /// Sequences per optimizer step (a multiple of micro_batch: gradient accumulation).
    pub global_batch: usize,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup: u64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    /// Evaluate the validation loss every this many steps (0: only at the end).
    pub eval_every: u64,
    pub eval_batches: usize,
    /// Checkpoint every this many steps (0: only at the end).
    pub ckpt_every: u64,
    pub seed: u64,
    pub sample_prompt: String,
    pub sample_tokens: usize,
    /// Stop when the loss exceeds this factor × the lowest loss so far (0: only NaN/inf stop).
    #[serde(default = "default_divergence")]
    pub divergence_factor: f64,
    /// Keep only the newest this many checkpoints (0: all).
    #[serde(default)]
    pub keep_last: usize,
}

fn default_divergence() -> f64 {
    3.0
}

/// The largest micro-batch and global batch (sequences) the trainer accepts.
pub const MAX_BATCH: usize = 1 << 20;
/// The most tokens a sample may ask for.
pub const MAX_SAMPLE_TOKENS: usize = 1 << 16;

/// `value` is finite and within `lo..=hi`, else the error names `flag` and what is allowed.
pub fn check_range(flag: &str, value: f64, lo: f64, hi: f64, allowed: &str) -> Result<(), SpecError> {
    if value.is_finite() && value >= lo && value <= hi {
        Ok(())
    } else {
        Err(SpecError::new(format!("{flag} {value}: must be {allowed}")))
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 200,
            micro_batch: 8,
            global_batch: 16,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 20,
            weight_decay: 0.1,
            grad_clip: 1.0,
            eval_every: 50,
            eval_batches: 8,
            ckpt_every: 100,
            seed: 1337,
            sample_prompt: "LOVE, n.".into(),
            sample_tokens: 40,
            divergence_factor: default_divergence(),
            keep_last: 0,
        }
    }
}

impl TrainConfig {
    pub fn check(&self) -> Result<(), SpecError> {
        if self.micro_batch == 0 || self.global_batch == 0 || self.steps == 0 {
            return Err(SpecError::new(
                "--steps, --micro-batch and --global-batch must be positive integers",
            ));
        }
        for (flag, v) in [
            ("--micro-batch", self.micro_batch),
            ("--global-batch", self.global_batch),
        ] {
            if v > MAX_BATCH {
                return Err(SpecError::new(format!("{flag} {v}: at most {MAX_BATCH} sequences")));
            }
        }
        if self.sample_tokens > MAX_SAMPLE_TOKENS {
            return Err(SpecError::new(format!(
                "sample tokens {}: at most {MAX_SAMPLE_TOKENS}",
                self.sample_tokens
            )));
        }
        check_range("--lr", self.lr, f64::MIN_POSITIVE, 10.0, "a learning rate in (0, 10]")?;
        check_range("--min-lr", self.min_lr, 0.0, self.lr, "in [0, --lr]")?;
        check_range("--weight-decay", self.weight_decay, 0.0, 10.0, "in [0, 10]")?;
        check_range(
            "--grad-clip",
            self.grad_clip,
            f64::MIN_POSITIVE,
            f64::MAX,
            "a positive norm",
        )?;
        if !(self.divergence_factor == 0.0 || (self.divergence_factor.is_finite() && self.divergence_factor > 1.0)) {
            return Err(SpecError::new(format!(
                "--divergence-factor {}: must be 0 (off) or a factor > 1",
                self.divergence_factor
            )));
        }
        if !self.global_batch.is_multiple_of(self.micro_batch) {
            return Err(SpecError::new(format!(
                "--global-batch {} is not divisible by --micro-batch {}",
                self.global_batch, self.micro_batch
            )));
        }
        Ok(())
    }
}

/// Bytes held per category (the planner's `memory_bytes` names).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bytes {
    pub weights: usize,
    pub grads: usize,
    pub optimizer: usize,
    /// Kept from forward for backward.
    pub activations: usize,
    /// Activation gradients during backward (not counted by the planner).
    pub workspace: usize,
}

/// What one step reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepLog {
    pub step: u64,
    pub loss: f64,
    pub val_loss: Option<f64>,
    pub lr: f64,
    pub grad_norm: f64,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub model_tflops: f64,
    /// Against the sgemm peak measured on this machine at start-up.
    pub mfu: f64,
    pub bytes: Bytes,
    pub sample: Option<String>,
    pub checkpoint: Option<PathBuf>,
}

/// A training run in progress, on backend `B` (the CPU unless said otherwise).
pub struct Trainer<B: Backend<R = f32> = Cpu<f32>> {
    pub spec: ModelSpec,
    pub cfg: TrainConfig,
    pub model: Model<B>,
    pub opt: AdamW<B>,
    pub data: Dataset,
    tokenizer: tokenizers::Tokenizer,
    pub step: u64,
    sequences: u64,
    peak_flops: f64,
    out: PathBuf,
    tokens: Vec<u32>,
    targets: Vec<u32>,
    last_checkpoint: Option<PathBuf>,
    guard: Guard,
    /// The run's layout and engine settings, stored in each checkpoint.
    pub run: serde_json::Value,
}

/// sgemm throughput of this machine on 1024³ with the kernels' row split, FLOP/s (the
/// calibration's GEMM benchmark, best of 10).
pub fn measure_peak() -> f64 {
    crate::calibrate::time_gemm(1024, 1024, 1024, 10) * 1e9
}

impl Trainer {
    /// Start a run of `spec` on `data_dir` on the CPU, checkpointing into `out`.
    pub fn new(spec: ModelSpec, cfg: TrainConfig, data_dir: &Path, out: &Path) -> Result<Trainer, SpecError> {
        Trainer::on(Cpu::default(), measure_peak(), spec, cfg, data_dir, out)
    }

    /// Continue the run saved in `ckpt` on the CPU; see [`Trainer::resume_on`].
    pub fn resume(ckpt: &Path, cfg: Option<TrainConfig>) -> Result<Trainer, SpecError> {
        Trainer::resume_on(Cpu::default(), measure_peak(), ckpt, cfg)
    }
}

impl<B: Backend<R = f32>> Trainer<B> {
    /// Start a run of `spec` on `data_dir` on backend `be` (whose peak, in FLOP/s, the MFU is
    /// reported against), checkpointing into `out`.
    pub fn on(
        be: B,
        peak_flops: f64,
        spec: ModelSpec,
        cfg: TrainConfig,
        data_dir: &Path,
        out: &Path,
    ) -> Result<Trainer<B>, SpecError> {
        cfg.check()?;
        let (shape, data, tokenizer) = open_data(&spec, data_dir)?;
        std::fs::create_dir_all(out)
            .map_err(|e| SpecError::new(format!("--out {}: cannot create: {e}", out.display())))?;
        let model = Model::new_on(be, shape, cfg.seed);
        let opt = AdamW::new(
            &model.be,
            AdamWConfig {
                lr: cfg.lr,
                weight_decay: cfg.weight_decay,
                ..Default::default()
            },
            model.layout.total,
            model.layout.decayed(),
        );
        model.be.check().map_err(|e| SpecError::new(e.0))?;
        Ok(Trainer {
            spec,
            model,
            opt,
            data,
            tokenizer,
            step: 0,
            sequences: 0,
            peak_flops,
            out: out.to_path_buf(),
            tokens: Vec::new(),
            targets: Vec::new(),
            last_checkpoint: None,
            guard: Guard::new(cfg.divergence_factor, None),
            run: serde_json::Value::Null,
            cfg,
        })
    }

    /// Continue the run saved in `ckpt` (a checkpoint or its run folder) with its own config,
    /// or `cfg` (the caller's deliberate changes to it), on backend `be`.
    pub fn resume_on(be: B, peak_flops: f64, ckpt: &Path, cfg: Option<TrainConfig>) -> Result<Trainer<B>, SpecError> {
        let dir = checkpoint::resolve(ckpt)?;
        let (state, params, opt) = checkpoint::load(&dir, true)?;
        let cfg = match cfg {
            Some(c) => c,
            None => stored_config(&state, &dir)?,
        };
        if cfg.steps <= state.step {
            return Err(SpecError::new(format!(
                "--steps {}: the run has already completed {} steps; pass more to extend it",
                cfg.steps, state.step
            )));
        }
        let out = dir.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut t = Trainer::on(be, peak_flops, state.model.clone(), cfg, &state.data_dir, &out)?;
        t.model.params = t.model.be.upload(params);
        let (m, v) = opt.expect("asked for the optimizer");
        t.opt.m = t.model.be.upload(m);
        t.opt.v = t.model.be.upload(v);
        t.model.be.check().map_err(|e| SpecError::new(e.0))?;
        t.opt.step = state.opt_step;
        t.step = state.step;
        t.sequences = state.sequences;
        t.last_checkpoint = Some(dir);
        t.guard.min_loss = state.min_loss;
        t.run = state.run;
        Ok(t)
    }

    pub fn bytes(&self) -> Bytes {
        Bytes {
            weights: self.model.layout.total * 4,
            grads: self.model.layout.total * 4,
            optimizer: 2 * self.opt.len() * 4,
            activations: self.model.activation_bytes(),
            workspace: self.model.workspace_bytes(),
        }
    }

    /// Mean validation loss over `eval_batches` fixed batches.
    pub fn eval(&mut self) -> Result<f64, SpecError> {
        val_loss(
            &mut self.model,
            &self.data,
            &self.cfg,
            &mut self.tokens,
            &mut self.targets,
        )
    }

    /// Continue `prompt` by `n` tokens (temperature 0.8, seeded by the step).
    pub fn sample(&mut self, prompt: &str, n: usize) -> Result<String, SpecError> {
        sample(&mut self.model, &self.tokenizer, prompt, n, 0.8, self.step)
    }

    /// One optimizer step.
    pub fn train_step(&mut self) -> Result<StepLog, SpecError> {
        let t0 = Instant::now();
        let (b, t) = (self.cfg.micro_batch, self.model.shape.max_seq);
        let accum = self.cfg.global_batch / b;
        self.model.zero_grad();
        let mut loss = 0.0;
        for _ in 0..accum {
            data::train_batch(
                &self.data.train,
                self.cfg.seed,
                self.sequences,
                b,
                t,
                &mut self.tokens,
                &mut self.targets,
            );
            self.sequences += b as u64;
            let l = self
                .model
                .forward(&self.tokens, &self.targets, b, t)
                .map_err(|e| SpecError::new(e.0))?;
            loss += l as f64 / accum as f64;
            self.model
                .backward(1.0 / accum as f32)
                .map_err(|e| SpecError::new(e.0))?;
        }
        let all = 0..self.model.layout.total;
        let m = &mut self.model;
        let [grads] = B::parts(&mut m.grads, [&all]);
        let grad_norm = clip_grad_norm_on(&m.be, grads, self.cfg.grad_clip);
        if let Err(d) = self.guard.check(self.step + 1, loss, grad_norm) {
            // the parameters after step `self.step` gave this loss: take back their checkpoint
            let good = checkpoint::retract(&self.out, self.step)?;
            return Err(SpecError::new(d.message(good.as_deref())));
        }
        let lr = lr_at(self.step, self.cfg.lr, self.cfg.min_lr, self.cfg.warmup, self.cfg.steps);
        let m = &mut self.model;
        let [params] = B::parts(&mut m.params, [&all]);
        self.opt.update(&m.be, params, B::view(&m.grads, &all), lr);
        m.be.check().map_err(|e| SpecError::new(e.0))?;
        self.step += 1;
        let seconds = t0.elapsed().as_secs_f64();
        let flops = exatrain_cost::flops::model_step(&self.spec, self.cfg.global_batch as u32);
        let last = self.step == self.cfg.steps;
        let step = self.step;
        let every = |k: u64| k > 0 && step.is_multiple_of(k);
        let evaluate = every(self.cfg.eval_every) || last;
        let val_loss = if evaluate { Some(self.eval()?) } else { None };
        let sample = if evaluate && self.cfg.sample_tokens > 0 {
            let p = self.cfg.sample_prompt.clone();
            Some(self.sample(&p, self.cfg.sample_tokens)?)
        } else {
            None
        };
        let checkpoint = if every(self.cfg.ckpt_every) || last {
            Some(self.save()?)
        } else {
            None
        };
        Ok(StepLog {
            step: self.step,
            loss,
            val_loss,
            lr,
            grad_norm,
            seconds,
            tokens_per_s: (self.cfg.global_batch * t) as f64 / seconds,
            model_tflops: flops / seconds / 1e12,
            mfu: flops / seconds / self.peak_flops,
            bytes: self.bytes(),
            sample,
            checkpoint,
        })
    }

    /// Write a checkpoint now.
    pub fn save(&mut self) -> Result<PathBuf, SpecError> {
        let state = State {
            format: "exatrain-ckpt-v1".into(),
            step: self.step,
            opt_step: self.opt.step,
            sequences: self.sequences,
            seed: self.cfg.seed,
            model: self.spec.clone(),
            config: serde_json::to_value(&self.cfg).expect("json"),
            data_dir: self.data.dir.clone(),
            run: self.run.clone(),
            min_loss: self.guard.min_loss,
        };
        let (be, all) = (&self.model.be, 0..self.model.layout.total);
        let tokenizer = self.data.dir.join("tokenizer.json");
        // the host's own memory on the CPU; a copy from a device
        let dir = be.with_host(B::view(&self.model.params, &all), |params| {
            be.with_host(B::view(&self.opt.m, &all), |m| {
                be.with_host(B::view(&self.opt.v, &all), |v| {
                    checkpoint::save(&self.out, &state, &self.model.layout, params, m, v, &tokenizer)
                })
            })
        })?;
        checkpoint::prune(&self.out, self.cfg.keep_last)?;
        self.last_checkpoint = Some(dir.clone());
        Ok(dir)
    }
}

/// The config a checkpoint was written with.
pub fn stored_config(state: &State, dir: &Path) -> Result<TrainConfig, SpecError> {
    serde_json::from_value(state.config.clone())
        .map_err(|e| SpecError::new(format!("{}: corrupt checkpoint config: {e}", dir.display())))
}

/// Autoregressive sampling with temperature, from a model and its tokenizer.
/// The model's shape, its tokenized data (checked against its vocabulary) and the tokenizer.
fn open_data(spec: &ModelSpec, data_dir: &Path) -> Result<(GptShape, Dataset, tokenizers::Tokenizer), SpecError> {
    let shape = GptShape::from_spec(spec)?;
    let data = Dataset::open(data_dir, shape.max_seq)?;
    data.check_vocab(shape.vocab, &spec.name)?;
    Ok((shape, data, data::load_tokenizer(data_dir)?))
}

/// Mean validation loss of `model` over `cfg.eval_batches` fixed batches of micro-batch size.
fn val_loss<B: Backend<R = f32>>(
    model: &mut Model<B>,
    data: &Dataset,
    cfg: &TrainConfig,
    tokens: &mut Vec<u32>,
    targets: &mut Vec<u32>,
) -> Result<f64, SpecError> {
    let (b, t) = (cfg.micro_batch, model.shape.max_seq);
    let mut sum = 0.0;
    for k in 0..cfg.eval_batches.max(1) {
        data::val_batch(&data.val, k, b, t, tokens, targets);
        sum += model.forward(tokens, targets, b, t).map_err(|e| SpecError::new(e.0))? as f64;
    }
    Ok(sum / cfg.eval_batches.max(1) as f64)
}

/// The evaluation of a whole model held outside a [`Trainer`]: the multi-rank engine gathers
/// its parameters to rank 0 at each evaluation step, and this gives the validation loss and
/// sample one process would (same batches, same sampler seed).
pub struct Evaluation {
    model: Gpt<f32>,
    data: Dataset,
    tokenizer: tokenizers::Tokenizer,
    cfg: TrainConfig,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

impl Evaluation {
    pub fn new(spec: &ModelSpec, cfg: &TrainConfig, data_dir: &Path) -> Result<Evaluation, SpecError> {
        let (shape, data, tokenizer) = open_data(spec, data_dir)?;
        Ok(Evaluation {
            model: Gpt::<f32>::new(shape, cfg.seed),
            data,
            tokenizer,
            cfg: cfg.clone(),
            tokens: Vec::new(),
            targets: Vec::new(),
        })
    }

    /// Validation loss of `params` after `step` steps, and a sample when the config asks for one.
    pub fn run(&mut self, params: &[f32], step: u64) -> Result<(f64, Option<String>), SpecError> {
        if params.len() != self.model.params.len() {
            return Err(SpecError::new(format!(
                "evaluation: {} parameters given, the model has {}",
                params.len(),
                self.model.params.len()
            )));
        }
        self.model.params.copy_from_slice(params);
        let loss = val_loss(
            &mut self.model,
            &self.data,
            &self.cfg,
            &mut self.tokens,
            &mut self.targets,
        )?;
        let text = if self.cfg.sample_tokens > 0 {
            let prompt = self.cfg.sample_prompt.clone();
            Some(sample(
                &mut self.model,
                &self.tokenizer,
                &prompt,
                self.cfg.sample_tokens,
                0.8,
                step,
            )?)
        } else {
            None
        };
        Ok((loss, text))
    }
}

pub fn sample<B: Backend<R = f32>>(
    model: &mut Model<B>,
    tk: &tokenizers::Tokenizer,
    prompt: &str,
    n: usize,
    temperature: f64,
    seed: u64,
) -> Result<String, SpecError> {
    let mut ids: Vec<u32> = tk
        .encode(prompt, false)
        .map_err(|e| SpecError::new(format!("--prompt: {e}")))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        ids.push(0);
    }
    let (tmax, vp, v) = (model.shape.max_seq, model.shape.padded_vocab, model.shape.vocab);
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = ids.len();
    for _ in 0..n {
        let ctx: Vec<u32> = ids[ids.len().saturating_sub(tmax)..].to_vec();
        let t = ctx.len();
        let dummy = vec![0u32; t];
        model.forward(&ctx, &dummy, 1, t).map_err(|e| SpecError::new(e.0))?;
        let row = model
            .be
            .with_host(B::sub(model.logits(), &((t - 1) * vp..(t - 1) * vp + v)), |r| {
                r.to_vec()
            });
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let w: Vec<f64> = row
            .iter()
            .map(|&x| ((x as f64 - max) / temperature.max(1e-6)).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let mut u = rng.f64() * total;
        let mut pick = v - 1;
        for (j, &wj) in w.iter().enumerate() {
            if u < wj {
                pick = j;
                break;
            }
            u -= wj;
        }
        ids.push(pick as u32);
    }
    tk.decode(&ids[start..], true)
        .map_err(|e| SpecError::new(format!("decoding: {e}")))
}
