//! AdamW with decoupled weight decay and bias correction, a warmup + cosine learning-rate
//! schedule, and global-norm gradient clipping. The update is a loop over a flat range, so a
//! ZeRO shard of the buffers runs the same code.

use std::ops::Range;

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

/// AdamW state over a flat parameter range.
#[derive(Debug, Clone)]
pub struct AdamW<R: Real> {
    pub config: AdamWConfig,
    /// First moment, one per parameter.
    pub m: Vec<R>,
    /// Second moment, one per parameter.
    pub v: Vec<R>,
    /// Updates taken (for bias correction).
    pub step: u64,
    /// Ranges that get weight decay (the weight matrices; not biases, norms or positions).
    decay: Vec<Range<usize>>,
}

impl<R: Real> AdamW<R> {
    pub fn new(config: AdamWConfig, n: usize, decay: Vec<Range<usize>>) -> Self {
        AdamW {
            config,
            m: vec![R::zero(); n],
            v: vec![R::zero(); n],
            step: 0,
            decay,
        }
    }

    /// One update with learning rate `lr`.
    pub fn update(&mut self, params: &mut [R], grads: &[R], lr: f64) {
        self.step += 1;
        let c = self.config;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2 = 1.0 - c.beta2.powi(self.step as i32);
        let (b1, b2) = (R::of(c.beta1), R::of(c.beta2));
        let (ob1, ob2) = (R::of(1.0 - c.beta1), R::of(1.0 - c.beta2));
        let (lr_r, eps) = (R::of(lr), R::of(c.eps));
        let (ibc1, ibc2) = (R::of(1.0 / bc1), R::of(1.0 / bc2));
        let mut segments: Vec<(Range<usize>, f64)> = Vec::new();
        let mut at = 0;
        let mut decay = self.decay.clone();
        decay.sort_by_key(|r| r.start);
        for r in decay {
            if r.start > at {
                segments.push((at..r.start, 0.0));
            }
            at = r.end;
            segments.push((r, c.weight_decay));
        }
        if at < params.len() {
            segments.push((at..params.len(), 0.0));
        }
        for (r, wd) in segments {
            let wd = R::of(wd);
            for i in r {
                let g = grads[i];
                let m = b1 * self.m[i] + ob1 * g;
                let v = b2 * self.v[i] + ob2 * g * g;
                self.m[i] = m;
                self.v[i] = v;
                let mhat = m * ibc1;
                let vhat = v * ibc2;
                params[i] = params[i] - lr_r * (mhat / (vhat.sqrt() + eps) + wd * params[i]);
            }
        }
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
    let norm = grads
        .iter()
        .map(|g| g.to_f64().unwrap_or(0.0).powi(2))
        .sum::<f64>()
        .sqrt();
    if norm > max_norm && norm.is_finite() {
        let s = R::of(max_norm / norm);
        grads.iter_mut().for_each(|g| *g = *g * s);
    }
    norm
}
