//! Data parallelism over any [`Communicator`]: each of the `dp` ranks runs the same model on its
//! share of every global batch, and the gradients are summed across ranks, so the run trains
//! exactly what one process would (up to the order of floating-point sums). With ZeRO-1 the
//! optimizer state is sharded: gradients are reduce-scattered, each rank updates its 1/dp slice
//! of the parameters with its slice of the Adam moments, and the parameters are all-gathered.
//! Gradient clipping uses the global norm across all ranks.

use exatrain_parallel::comm::{Communicator, Metered};
use exatrain_spec::{ModelSpec, SpecError};

use crate::data::{self, Dataset};
use crate::model::{Gpt, GptShape};
use crate::optim::{lr_at, AdamW, AdamWConfig};
use crate::train::TrainConfig;

/// What one data-parallel rank ends with.
#[derive(Debug, Clone)]
pub struct DpResult {
    /// Mean training loss of each step (the same on every rank).
    pub losses: Vec<f64>,
    /// Wall time of each step on this rank.
    pub step_seconds: Vec<f64>,
    pub params: Vec<f32>,
    /// Bytes of optimizer state this rank held.
    pub optimizer_bytes: usize,
    /// Per step: bytes this rank sent in the gradient/parameter collectives (ring count of the
    /// buffers passed, ZeRO-1's shard padding included) — the planner's `comm_bytes.dp`.
    pub dp_bytes_per_step: f64,
    /// Seconds in those collectives, all steps.
    pub dp_seconds: f64,
    /// Seconds of forward + backward + update, all steps.
    pub compute_seconds: f64,
}

fn comm_err(e: exatrain_parallel::comm::CommError) -> SpecError {
    SpecError::new(e.0)
}

/// Train `cfg.steps` steps on this rank of a data-parallel group. `zero` is 0 or 1.
pub fn train(
    spec: &ModelSpec,
    cfg: &TrainConfig,
    data_dir: &std::path::Path,
    comm: &dyn Communicator,
    zero: u8,
) -> Result<DpResult, SpecError> {
    cfg.check()?;
    let (dp, rank) = (comm.size(), comm.rank());
    if zero > 1 {
        return Err(SpecError::new(format!(
            "--zero {zero}: the data-parallel trainer implements ZeRO 0 and 1"
        )));
    }
    if cfg.global_batch % (cfg.micro_batch * dp) != 0 {
        return Err(SpecError::new(format!(
            "--global-batch {} is not divisible by --micro-batch {} × --dp {dp}",
            cfg.global_batch, cfg.micro_batch
        )));
    }
    let shape = GptShape::from_spec(spec)?;
    let data = Dataset::open(data_dir, shape.max_seq)?;
    let mut model = Gpt::<f32>::new(shape, cfg.seed);
    let n = model.params.len();
    // ZeRO-1: this rank owns params[lo..hi] (padded so every shard has the same length).
    let shard = n.div_ceil(dp);
    let (lo, hi) = if zero == 1 {
        (rank * shard, ((rank + 1) * shard).min(n))
    } else {
        (0, n)
    };
    let decay: Vec<_> = model
        .layout
        .blocks
        .iter()
        .flat_map(|b| [b.qkvw.clone(), b.projw.clone(), b.fcw.clone(), b.fcprojw.clone()])
        .chain([model.layout.wte.clone()])
        .filter_map(|r| {
            let (s, e) = (r.start.max(lo), r.end.min(hi));
            (s < e).then(|| s - lo..e - lo)
        })
        .collect();
    let mut opt = AdamW::<f32>::new(
        AdamWConfig {
            lr: cfg.lr,
            weight_decay: cfg.weight_decay,
            ..Default::default()
        },
        hi - lo,
        decay,
    );
    let t = shape.max_seq;
    let per_rank = cfg.global_batch / dp;
    let accum = per_rank / cfg.micro_batch;
    let (mut tokens, mut targets) = (Vec::new(), Vec::new());
    let mut losses = Vec::new();
    let mut step_seconds = Vec::new();
    let mut padded = vec![0.0f32; shard * dp];
    let mut mine = vec![0.0f32; shard];
    let metered = Metered::new(comm);
    let (mut dp_bytes, mut dp_seconds, mut compute_seconds) = (0.0, 0.0, 0.0);
    for step in 0..cfg.steps {
        let t_compute = std::time::Instant::now();
        let t_step = t_compute;
        model.zero_grad();
        let mut loss = 0.0f64;
        // This rank's share of the step's sequences: first + rank·per_rank ..
        let first = step * cfg.global_batch as u64 + (rank * per_rank) as u64;
        for k in 0..accum {
            data::train_batch(
                &data.train,
                cfg.seed,
                first + (k * cfg.micro_batch) as u64,
                cfg.micro_batch,
                t,
                &mut tokens,
                &mut targets,
            );
            loss += model.forward(&tokens, &targets, cfg.micro_batch, t) as f64 / (accum * dp) as f64;
            model.backward(1.0 / (accum * dp) as f32);
        }
        compute_seconds += t_compute.elapsed().as_secs_f64();
        let mut l = [loss as f32];
        comm.all_reduce(&mut l).map_err(comm_err)?;
        losses.push(l[0] as f64);
        let lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps);
        if zero == 0 {
            metered.all_reduce(&mut model.grads).map_err(comm_err)?;
            crate::optim::clip_grad_norm(&mut model.grads, cfg.grad_clip);
            opt.update(&mut model.params, &model.grads, lr);
        } else {
            padded[..n].copy_from_slice(&model.grads);
            metered.reduce_scatter(&padded, &mut mine).map_err(comm_err)?;
            let len = hi - lo;
            let mut sq = [mine[..len].iter().map(|g| (*g as f64) * (*g as f64)).sum::<f64>() as f32];
            comm.all_reduce(&mut sq).map_err(comm_err)?;
            let norm = (sq[0] as f64).sqrt();
            if norm > cfg.grad_clip && norm.is_finite() {
                let s = (cfg.grad_clip / norm) as f32;
                mine[..len].iter_mut().for_each(|g| *g *= s);
            }
            opt.update(&mut model.params[lo..hi], &mine[..len], lr);
            let mut out = vec![0.0f32; shard * dp];
            let mut send = vec![0.0f32; shard];
            send[..len].copy_from_slice(&model.params[lo..hi]);
            metered.all_gather(&send, &mut out).map_err(comm_err)?;
            model.params.copy_from_slice(&out[..n]);
        }
        let m = metered.take();
        dp_bytes += m.bytes;
        dp_seconds += m.seconds;
        step_seconds.push(t_step.elapsed().as_secs_f64());
    }
    Ok(DpResult {
        losses,
        step_seconds,
        params: model.params,
        optimizer_bytes: (opt.m.len() + opt.v.len()) * 4,
        dp_bytes_per_step: dp_bytes / cfg.steps as f64,
        dp_seconds,
        compute_seconds,
    })
}
