//! A Gaussian process with an exponential (Laplace) kernel on the layout encoding,
//! `k(x, x') = exp(-Σ_d |x_d - x'_d| / ℓ_d)`: log2 sizes are ordinal, switches and rank-order
//! positions categorical (0/1 apart). Its variance grows with distance from what has been
//! observed, which is what lets a search over a discrete space reach knob values it has not yet
//! tried. Targets are standardized; the length scales are fitted by maximizing the marginal
//! likelihood over a coarse grid, one dimension at a time ([`Gp::fit_ard`]), so knobs that do not
//! matter get long scales and stop drawing trials. Written out here because the few-hundred-point dense
//! Cholesky it needs is twenty lines, where a linear-algebra crate would dominate the build.

#[derive(Debug, Clone)]
pub struct Gp {
    x: Vec<Vec<f64>>,
    inv_len: Vec<f64>,
    /// Lower Cholesky factor of K + σ²I, row-major n×n.
    l: Vec<f64>,
    /// (K + σ²I)⁻¹ (y - mean) / scale
    alpha: Vec<f64>,
    mean: f64,
    scale: f64,
}

impl Gp {
    fn kernel(&self, a: &[f64], b: &[f64]) -> f64 {
        kernel(&self.inv_len, a, b)
    }

    /// Fit to rows `x` and targets `y` with per-dimension length scales and noise variance
    /// (on the standardized scale).
    pub fn fit(x: &[Vec<f64>], y: &[f64], lengths: &[f64], noise: f64) -> Gp {
        let n = x.len();
        assert!(n > 0 && n == y.len(), "one target per row, at least one row");
        let inv_len: Vec<f64> = lengths.iter().map(|l| 1.0 / l).collect();
        let mean = y.iter().sum::<f64>() / n as f64;
        let var = y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let scale = if var > 1e-18 { var.sqrt() } else { 1.0 };
        let mut l = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let mut s = kernel(&inv_len, &x[i], &x[j]) + if i == j { noise } else { 0.0 };
                for k in 0..j {
                    s -= l[i * n + k] * l[j * n + k];
                }
                l[i * n + j] = if i == j { s.max(1e-12).sqrt() } else { s / l[j * n + j] };
            }
        }
        let z: Vec<f64> = y.iter().map(|v| (v - mean) / scale).collect();
        let fwd = forward(&l, n, &z);
        let alpha = backward(&l, n, &fwd);
        Gp {
            x: x.to_vec(),
            inv_len,
            l,
            alpha,
            mean,
            scale,
        }
    }

    /// Log marginal likelihood of the standardized targets (up to a constant).
    pub fn log_likelihood(&self) -> f64 {
        let n = self.x.len();
        let mean = self.mean;
        let _ = mean;
        // -½ zᵀα - Σ ln L_ii ; zᵀα = αᵀ K α, recomputed from α and L: z = L Lᵀ α
        let mut lt_alpha = vec![0.0; n];
        for i in 0..n {
            lt_alpha[i] = (i..n).map(|k| self.l[k * n + i] * self.alpha[k]).sum();
        }
        let quad: f64 = lt_alpha.iter().map(|v| v * v).sum();
        let logdet: f64 = (0..n).map(|i| self.l[i * n + i].ln()).sum();
        -0.5 * quad - logdet
    }

    /// Fit with per-dimension length scales chosen by marginal likelihood: starting from
    /// `lengths`, each dimension in turn tries a grid of scales and keeps the best (two sweeps).
    pub fn fit_ard(x: &[Vec<f64>], y: &[f64], lengths: &[f64], noise: f64) -> Gp {
        const GRID: [f64; 6] = [0.5, 1.0, 2.0, 4.0, 8.0, 32.0];
        let mut best_len = lengths.to_vec();
        let mut best = Gp::fit(x, y, &best_len, noise);
        let mut best_ll = best.log_likelihood();
        for _ in 0..2 {
            for d in 0..best_len.len() {
                for g in GRID {
                    if g == best_len[d] {
                        continue;
                    }
                    let mut trial = best_len.clone();
                    trial[d] = g;
                    let gp = Gp::fit(x, y, &trial, noise);
                    let ll = gp.log_likelihood();
                    if ll > best_ll + 1e-9 {
                        (best, best_ll, best_len) = (gp, ll, trial);
                    }
                }
            }
        }
        best
    }

    /// Posterior mean and standard deviation at `x`, on the scale of the targets.
    pub fn predict(&self, x: &[f64]) -> (f64, f64) {
        let n = self.x.len();
        let k: Vec<f64> = self.x.iter().map(|xi| self.kernel(xi, x)).collect();
        let mu = k.iter().zip(&self.alpha).map(|(a, b)| a * b).sum::<f64>();
        let v = forward(&self.l, n, &k);
        let var = (1.0 - v.iter().map(|a| a * a).sum::<f64>()).max(0.0);
        (self.mean + self.scale * mu, self.scale * var.sqrt())
    }
}

fn kernel(inv_len: &[f64], a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).zip(inv_len).map(|((x, y), w)| (x - y).abs() * w).sum();
    (-d).exp()
}

/// Solve L v = b.
fn forward(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut v = vec![0.0; n];
    for i in 0..n {
        let s: f64 = (0..i).map(|k| l[i * n + k] * v[k]).sum();
        v[i] = (b[i] - s) / l[i * n + i];
    }
    v
}

/// Solve Lᵀ v = b.
fn backward(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut v = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| l[k * n + i] * v[k]).sum();
        v[i] = (b[i] - s) / l[i * n + i];
    }
    v
}
