//! A textbook step-time model with unknown machine constants, fitted to the trials: the Bayesian
//! search's mean function. Seconds per token are `Σ_k θ_k · φ_k(layout)`, where each term `φ_k`
//! is a quantity every practitioner writes down for a layout (Narayanan et al. 2021,
//! Korthikanti et al. 2022) — FLOPs per device, pipeline slots, bytes each collective moves
//! inside and across nodes, optimizer bytes — and each `θ_k ≥ 0` is a machine constant (seconds
//! per FLOP, per byte, per kernel) that the search does *not* know: it is fitted to the trials
//! so far by non-negative least squares on relative error. The model knows the shapes of the
//! model and the node size (from [`Encoding`]); it never sees the machine's speeds, nor the
//! objective's code. The GP then learns what the terms miss (GEMM efficiency by shape, overlap
//! of communication with compute, latencies) as the residual `ln(measured) − ln(trend)`.

use exatrain_spec::{Dim, ParallelConfig, Recompute};

use crate::bayes::Encoding;

/// Terms of [`terms`]: compute, kernel passes, TP bytes inside / across nodes, pipeline bytes,
/// DP bytes inside / across nodes, optimizer bytes.
pub const TERMS: usize = 8;

/// The terms of one layout, per token of the global batch (see the module doc).
pub fn terms(e: &Encoding, c: &ParallelConfig) -> [f64; TERMS] {
    // gradients are reduced, and ZeRO shards, over the dp · cp ranks that hold the same weights
    let (t, p, d) = (c.tp as f64, c.pp as f64, c.dp_cp() as f64);
    let m = c.microbatches() as f64;
    let v = c.virtual_stages as f64;
    // tokens per microbatch, layers per stage
    let tokens_mb = c.micro_batch as f64 * e.seq / c.cp as f64;
    let layers = e.layers / p;
    // microbatch slots on a stage's critical path: m of its own, (p − 1)/v of fill and drain
    let slots = m + (p - 1.0) / v;
    // One microbatch on one device: 6·N/(p·t) FLOPs per token for the weights, 12·s·h per layer
    // per token for attention scores; full recomputation repeats the forward (4/3), selective
    // recomputation or flash attention the attention core's forward.
    let (weights_x, core_x) = match (c.recompute, c.flash_attention) {
        (Recompute::Full, _) => (4.0 / 3.0, 4.0 / 3.0),
        (Recompute::Selective, _) | (_, true) => (1.0, 4.0 / 3.0),
        _ => (1.0, 1.0),
    };
    let flops_mb = tokens_mb * (6.0 * e.params / (p * t) * weights_x + 12.0 * e.seq * e.hidden * layers / t * core_x);
    // TP: per layer and microbatch 4 all-reduces (6 with full recomputation) of the activation,
    // each sending 2(t − 1)/t of it; sequence parallelism adds two all-gathers (1/t each).
    let act_bytes = tokens_mb * e.hidden * 2.0;
    let tp_bytes = if c.tp > 1 {
        let pairs = if c.recompute == Recompute::Full { 6.0 } else { 4.0 };
        let sp = if c.sequence_parallel { 2.0 * (t - 1.0) / t } else { 0.0 };
        slots * layers * act_bytes * (pairs * 2.0 * (t - 1.0) / t + sp)
    } else {
        0.0
    };
    // PP: each chunk sends each microbatch's activation forward and its gradient back (1/t of it).
    let pp_bytes = if c.pp > 1 { 2.0 * v * m * act_bytes / t } else { 0.0 };
    // DP: the gradient (2 bytes per parameter of the stage) reduced once per step; ZeRO-2 per
    // microbatch, ZeRO-3 also gathers the weights before forward and backward.
    let grad = 2.0 * e.params / (t * p);
    let ring = (d - 1.0) / d;
    let dp_bytes = ring
        * grad
        * match c.zero {
            0 | 1 => 2.0,
            2 => m + 1.0,
            _ => 3.0 * m,
        };
    // Adam in mixed precision reads and writes ~16 bytes per parameter it owns.
    let opt_bytes = 16.0 * e.params / (t * p) / if c.zero >= 1 { d } else { 1.0 };
    // A group inside a node talks over its links; one that spans nodes sends one ring edge per
    // node through the node's NICs, which every group with members on that node shares: the
    // bytes a NIC carries are the rank's bytes times the rings crossing it.
    let gpn = e.devices_per_node;
    let split = |bytes: f64, dim: Dim| {
        if e.inside_node(c, dim) {
            return (bytes, 0.0);
        }
        let (size, stride) = (c.size(dim), c.stride(dim));
        let per_node = if stride < gpn { (gpn / stride).clamp(1, size) } else { 1 };
        (0.0, bytes * (gpn / per_node).max(1) as f64)
    };
    let (tp_in, tp_out) = split(tp_bytes, Dim::Tp);
    let (dp_in, dp_out) = split(dp_bytes, Dim::Dp);
    let per_token = 1.0 / (c.global_batch as f64 * e.seq);
    [
        slots * flops_mb,
        slots * layers,
        tp_in,
        tp_out,
        pp_bytes,
        dp_in,
        dp_out,
        opt_bytes,
    ]
    .map(|x| x * per_token)
}

/// Fitted constants: predicted seconds per token are `θ · φ`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trend {
    pub theta: [f64; TERMS],
}

impl Trend {
    /// Fit θ ≥ 0 to rows of terms and measured seconds per token, minimizing the squared
    /// relative error `Σ_i (θ·φ_i / y_i − 1)²` (coordinate descent on the normal equations, the
    /// columns scaled to unit norm). None with no rows.
    pub fn fit(rows: &[[f64; TERMS]], seconds: &[f64]) -> Option<Trend> {
        if rows.is_empty() {
            return None;
        }
        // a_ik = φ_ik / y_i, target 1
        let a: Vec<[f64; TERMS]> = rows.iter().zip(seconds).map(|(r, y)| r.map(|x| x / y)).collect();
        let norm: [f64; TERMS] = std::array::from_fn(|k| a.iter().map(|r| r[k] * r[k]).sum::<f64>().sqrt());
        let scale = |k: usize| if norm[k] > 0.0 { 1.0 / norm[k] } else { 0.0 };
        let mut gram = [[0.0; TERMS]; TERMS];
        let mut rhs = [0.0; TERMS];
        for r in &a {
            for j in 0..TERMS {
                rhs[j] += r[j] * scale(j);
                for k in 0..TERMS {
                    gram[j][k] += r[j] * scale(j) * r[k] * scale(k);
                }
            }
        }
        let mut w = [0.0; TERMS];
        for _ in 0..2000 {
            let mut moved = 0.0f64;
            for j in 0..TERMS {
                if gram[j][j] <= 0.0 {
                    continue;
                }
                let g: f64 = (0..TERMS).map(|k| gram[j][k] * w[k]).sum::<f64>() - rhs[j];
                let new = (w[j] - g / gram[j][j]).max(0.0);
                moved = moved.max((new - w[j]).abs());
                w[j] = new;
            }
            if moved < 1e-12 {
                break;
            }
        }
        Some(Trend {
            theta: std::array::from_fn(|k| w[k] * scale(k)),
        })
    }

    /// ln(tokens per second) predicted for a layout's terms; None where the fitted terms are all
    /// zero for it.
    pub fn ln_throughput(&self, phi: &[f64; TERMS]) -> Option<f64> {
        let s: f64 = self.theta.iter().zip(phi).map(|(a, b)| a * b).sum();
        (s > 0.0).then(|| -s.ln())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_nonnegative_constants_exactly() {
        let theta = [2e-12, 0.0, 3e-10, 1e-9, 0.0, 5e-10, 2e-9, 1e-11];
        // a typical size of each term
        let unit = [1e12, 1.0, 1e9, 1e9, 1e8, 1e9, 1e9, 1e10];
        let mut rng = fastrand::Rng::with_seed(7);
        let rows: Vec<[f64; TERMS]> = (0..20).map(|_| std::array::from_fn(|k| rng.f64() * unit[k])).collect();
        let y: Vec<f64> = rows
            .iter()
            .map(|r| r.iter().zip(&theta).map(|(a, b)| a * b).sum())
            .collect();
        let fit = Trend::fit(&rows, &y).unwrap();
        for k in 0..TERMS {
            // compare in the units of each column (θ_k times its typical term)
            assert!(
                ((fit.theta[k] - theta[k]) * unit[k]).abs() < 1e-6,
                "theta[{k}] = {} not {}",
                fit.theta[k],
                theta[k]
            );
        }
        for (r, y) in rows.iter().zip(&y) {
            let pred = (-fit.ln_throughput(r).unwrap()).exp();
            assert!((pred / y - 1.0).abs() < 1e-6);
        }
    }
}
