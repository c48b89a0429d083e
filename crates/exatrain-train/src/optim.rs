//! AdamW with decoupled weight decay and bias correction, a warmup + cosine learning-rate
//! schedule, and global-norm gradient clipping. The update is a loop over a flat range, so a
//! ZeRO shard of the buffers runs the same code.

use std::ops::Range;

use crate::backend::{Backend, Cpu};
use crate::Real;

/// Optimizer hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// AdamW state over a flat parameter range, on backend `B` (the moments live where the
/// parameters do).
pub struct AdamW<B: Backend = Cpu<f32>> {
    pub config: AdamWConfig,
    /// First moment, one per parameter.
    pub m: B::Buf,
    /// Second moment, one per parameter.
    pub v: B::Buf,
    /// Updates taken (for bias correction).
    pub step: u64,
    /// Ranges that get weight decay (the weight matrices; not biases, norms or positions).
    decay: Vec<Range<usize>>,
}

impl<B: Backend> AdamW<B> {
    pub fn new(be: &B, config: AdamWConfig, n: usize, decay: Vec<Range<usize>>) -> Self {
        AdamW {
            config,
            m: be.alloc(n),
            v: be.alloc(n),
            step: 0,
            decay,
        }
    }

    /// The moments' length: the number of parameters this optimizer updates.
    pub fn len(&self) -> usize {
        B::len(&self.m)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `0..len` cut into runs with and without weight decay, in order.
    fn segments(&self) -> Vec<(Range<usize>, f64)> {
        let (n, wd) = (self.len(), self.config.weight_decay);
        let mut segments = Vec::new();
        let mut at = 0;
        let mut decay = self.decay.clone();
        decay.sort_by_key(|r| r.start);
        for r in decay {
            if r.start > at {
                segments.push((at..r.start, 0.0));
            }
            at = r.end;
            segments.push((r, wd));
        }
        if at < n {
            segments.push((at..n, 0.0));
        }
        segments
    }

    /// One update with learning rate `lr` of `params` (as long as the moments) from `grads`.
    pub fn update(&mut self, be: &B, mut params: B::Mut<'_>, grads: B::Ref<'_>, lr: f64) {
        self.step += 1;
        for (r, wd) in self.segments() {
            let p = B::sub_mut(&mut params, &r);
            let [m] = B::parts(&mut self.m, [&r]);
            let [v] = B::parts(&mut self.v, [&r]);
            be.adamw(p, B::sub(grads, &r), m, v, &self.config, lr, wd, self.step);
        }
    }
}

/// One AdamW update (decoupled decay `wd`, bias correction at `step` ≥ 1) of a run of
/// parameters on the host: the CPU backend's `adamw`.
#[allow(clippy::too_many_arguments)]
pub fn adamw_update<R: Real>(
    params: &mut [R],
    grads: &[R],
    m: &mut [R],
    v: &mut [R],
    c: &AdamWConfig,
    lr: f64,
    wd: f64,
    step: u64,
) {
    let bc1 = 1.0 - c.beta1.powi(step as i32);
    let bc2 = 1.0 - c.beta2.powi(step as i32);
    let (b1, b2) = (R::of(c.beta1), R::of(c.beta2));
    let (ob1, ob2) = (R::of(1.0 - c.beta1), R::of(1.0 - c.beta2));
    let (lr_r, eps) = (R::of(lr), R::of(c.eps));
    let (ibc1, ibc2) = (R::of(1.0 / bc1), R::of(1.0 / bc2));
    let wd = R::of(wd);
    for i in 0..params.len() {
        let g = grads[i];
        let mi = b1 * m[i] + ob1 * g;
        let vi = b2 * v[i] + ob2 * g * g;
        m[i] = mi;
        v[i] = vi;
        let mhat = mi * ibc1;
        let vhat = vi * ibc2;
        params[i] = params[i] - lr_r * (mhat / (vhat.sqrt() + eps) + wd * params[i]);
    }
}

/// Linear warmup to `max_lr` over `warmup` steps, then cosine decay to `min_lr` at `total`.
pub fn lr_at(step: u64, max_lr: f64, min_lr: f64, warmup: u64, total: u64) -> f64 {
    if step < warmup {
        return max_lr * (step + 1) as f64 / warmup as f64;
    }
    if step >= total {
        return min_lr;
    }
    let ratio = (step - warmup) as f64 / (total - warmup).max(1) as f64;
    min_lr + 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos()) * (max_lr - min_lr)
}

/// Scale `grads` so their global L2 norm is at most `max_norm`; returns the norm before clipping.
pub fn clip_grad_norm<R: Real>(grads: &mut [R], max_norm: f64) -> f64 {
    clip_grad_norm_on(&Cpu::<R>::default(), grads, max_norm)
}

/// [`clip_grad_norm`] on backend `B`.
pub fn clip_grad_norm_on<B: Backend>(be: &B, mut grads: B::Mut<'_>, max_norm: f64) -> f64 {
    let norm = be.sum_squares(B::read(&grads)).sqrt();
    if norm > max_norm && norm.is_finite() {
        be.scale(B::reborrow(&mut grads), B::R::of(max_norm / norm));
    }
    norm
}
