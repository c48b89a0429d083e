//! The CUDA backend's matmul and attention as data: the cuBLASLt GEMMs (column-major, with
//! transposes, leading dimensions, strided batches, `alpha` and `beta`) and the causal-softmax
//! kernels between them, over device addresses. Pure, so the mapping from the CPU kernels'
//! row-major products to cuBLASLt's terms — the easiest part of a GPU port to get wrong — is
//! tested here without a GPU: [`execute_host`] runs a plan with cuBLASLt's and the softmax
//! kernels' semantics on a host arena, and the tests compare it with `crate::kernels`.
//!
//! Row-major `X[r, c]` with row stride `L` is column-major `Xᵀ` with leading dimension `L`, so
//! every row-major product `C = A·B` is issued as the column-major `Cᵀ = Bᵀ·Aᵀ`.

/// Bytes per element (the all-fp32 mode).
pub const ELEM: u64 = 4;

/// One cuBLASLt call: `C = alpha·op(A)·op(B) + beta·C` in column-major terms, `batch` times
/// with element strides; `a`, `b`, `c` are device addresses (bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transa: bool,
    pub transb: bool,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub alpha: f32,
    pub a: u64,
    pub b: u64,
    pub beta: f32,
    pub c: u64,
}

/// One step of a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    Gemm(Gemm),
    /// In place over `rows` rows of `t`: the causal softmax (row r keeps columns ≤ r mod t).
    SoftmaxForward {
        att: u64,
        rows: usize,
        t: usize,
    },
    /// In place: `datt` becomes the gradient at the softmax's input.
    SoftmaxBackward {
        datt: u64,
        att: u64,
        rows: usize,
        t: usize,
    },
}

/// The address `off` elements past `p`.
pub fn at(p: u64, off: usize) -> u64 {
    p + off as u64 * ELEM
}

fn gemm(m: usize, n: usize, k: usize, (ta, tb): (bool, bool), (lda, ldb, ldc): (usize, usize, usize)) -> Gemm {
    Gemm {
        m,
        n,
        k,
        transa: ta,
        transb: tb,
        lda,
        ldb,
        ldc,
        batch: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
        alpha: 1.0,
        a: 0,
        b: 0,
        beta: 0.0,
        c: 0,
    }
}

impl Gemm {
    fn batched(self, batch: usize, (sa, sb, sc): (usize, usize, usize)) -> Gemm {
        Gemm {
            batch,
            stride_a: sa,
            stride_b: sb,
            stride_c: sc,
            ..self
        }
    }
    fn call(self, alpha: f32, a: u64, b: u64, beta: f32, c: u64) -> Step {
        Step::Gemm(Gemm {
            alpha,
            a,
            b,
            beta,
            c,
            ..self
        })
    }
}

/// `out[N, OC] = inp[N, C]·wᵀ (+ bias)`, w being [OC, C]: the bias first as the rank-1 product
/// `bias ⊗ 1` (`ones` holds N ones), then the GEMM accumulating onto it.
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward(
    out: u64,
    inp: u64,
    w: u64,
    bias: Option<u64>,
    ones: u64,
    n: usize,
    c: usize,
    oc: usize,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let beta = match bias {
        Some(bias) => {
            // outᵀ[OC, N] = bias[OC, 1] · 1[1, N]
            steps.push(gemm(oc, n, 1, (false, false), (oc, 1, oc)).call(1.0, bias, ones, 0.0, out));
            1.0
        }
        None => 0.0,
    };
    // outᵀ[OC, N] = (wᵀ stored [C, OC])ᵀ · inpᵀ[C, N]
    steps.push(gemm(oc, n, c, (true, false), (c, c, oc)).call(1.0, w, inp, beta, out));
    steps
}

/// `dinp += dout·w`, `dw += doutᵀ·inp`, `dbias += Σ_rows dout` (`ones` holds N ones).
#[allow(clippy::too_many_arguments)]
pub fn matmul_backward(
    dinp: u64,
    dw: u64,
    dbias: Option<u64>,
    dout: u64,
    inp: u64,
    w: u64,
    ones: u64,
    n: usize,
    c: usize,
    oc: usize,
) -> Vec<Step> {
    let mut steps = vec![
        // dinpᵀ[C, N] += wᵀ[C, OC] · doutᵀ[OC, N]
        gemm(c, n, oc, (false, false), (c, oc, c)).call(1.0, w, dout, 1.0, dinp),
        // dwᵀ[C, OC] += inpᵀ[C, N] · dout[N, OC]
        gemm(c, oc, n, (false, true), (c, oc, c)).call(1.0, inp, dout, 1.0, dw),
    ];
    if let Some(db) = dbias {
        // dbias[OC] += doutᵀ[OC, N] · 1[N]
        steps.push(gemm(oc, 1, n, (false, false), (oc, n, oc)).call(1.0, dout, ones, 1.0, db));
    }
    steps
}

/// What `kernels::attention_forward` computes, per sequence: att_h = softmax(scale·Q_h·K_hᵀ)
/// causal into `att` [B, NH, T, T], then y_h = att_h·V_h into `out` [B, T, C]; Q, K and V of
/// head h are the HS columns at h·HS, C + h·HS, 2C + h·HS of each row of `qkv` [B, T, 3C].
pub fn attention_forward(out: u64, att: u64, qkv: u64, b: usize, t: usize, c: usize, nh: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for bi in 0..b {
        let q = at(qkv, bi * t * 3 * c);
        let a = at(att, bi * nh * t * t);
        steps.extend(probabilities(a, q, t, c, nh));
        steps.push(values(at(out, bi * t * c), a, q, t, c, nh));
    }
    steps
}

/// One sequence's y_h = P_h·V_h into `out` [T, C], from the probabilities `a` [NH, T, T] and its
/// `q` [T, 3C] (V at 2C).
fn values(out: u64, a: u64, q: u64, t: usize, c: usize, nh: usize) -> Step {
    let hs = c / nh;
    // y_hᵀ[HS, T] = V_hᵀ[HS, T] · att_hᵀ[T, T]
    let g = gemm(hs, t, t, (false, false), (3 * c, t, c)).batched(nh, (hs, t * t, hs));
    g.call(1.0, at(q, 2 * c), a, 0.0, out)
}

/// One sequence's causal softmax(scale·Q_h·K_hᵀ) into `a` [NH, T, T], from its `q` [T, 3C].
fn probabilities(a: u64, q: u64, t: usize, c: usize, nh: usize) -> [Step; 2] {
    let hs = c / nh;
    let scale = 1.0 / (hs as f32).sqrt();
    // att_hᵀ[T, T] = (K_hᵀ [HS, T], ld 3C)ᵀ · Q_hᵀ[HS, T]
    let scores = gemm(t, t, hs, (true, false), (3 * c, 3 * c, t)).batched(nh, (hs, hs, t * t));
    [
        scores.call(scale, at(q, c), q, 0.0, a),
        Step::SoftmaxForward {
            att: a,
            rows: nh * t,
            t,
        },
    ]
}

/// What `flash::flash_attention_forward` computes over the qkv buffer itself, as the CUDA
/// backend runs it: each sequence's probabilities in `scratch` [NH, T, T] (reused by the next
/// sequence, so nothing T×T is kept), then y = P·V into `out`. Its backward recomputes them.
pub fn flash_attention_forward(out: u64, scratch: u64, qkv: u64, b: usize, t: usize, c: usize, nh: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for bi in 0..b {
        let q = at(qkv, bi * t * 3 * c);
        steps.extend(probabilities(scratch, q, t, c, nh));
        steps.push(values(at(out, bi * t * c), scratch, q, t, c, nh));
    }
    steps
}

/// `dqkv += ∂L/∂qkv` through [`flash_attention_forward`]: each sequence's probabilities
/// recomputed into `scratch` [NH, T, T], then [`attention_backward`]'s steps over them.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    dqkv: u64,
    dout: u64,
    qkv: u64,
    scratch: u64,
    datt: u64,
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for bi in 0..b {
        let q = at(qkv, bi * t * 3 * c);
        steps.extend(probabilities(scratch, q, t, c, nh));
        steps.extend(sequence_backward(bi, dqkv, dout, qkv, scratch, datt, t, c, nh));
    }
    steps
}

/// `dqkv += ∂L/∂qkv` through [`attention_forward`], from `dout` [B, T, C] and the kept `att`;
/// `datt` is scratch for one sequence's [NH, T, T].
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dqkv: u64,
    dout: u64,
    qkv: u64,
    att: u64,
    datt: u64,
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) -> Vec<Step> {
    (0..b)
        .flat_map(|bi| sequence_backward(bi, dqkv, dout, qkv, at(att, bi * nh * t * t), datt, t, c, nh))
        .collect()
}

/// [`attention_backward`]'s steps for sequence `bi`, whose probabilities are at `a` [NH, T, T].
#[allow(clippy::too_many_arguments)]
fn sequence_backward(
    bi: usize,
    dqkv: u64,
    dout: u64,
    qkv: u64,
    a: u64,
    datt: u64,
    t: usize,
    c: usize,
    nh: usize,
) -> Vec<Step> {
    let hs = c / nh;
    let scale = 1.0 / (hs as f32).sqrt();
    let mut steps = Vec::new();
    {
        let (q, dq) = (at(qkv, bi * t * 3 * c), at(dqkv, bi * t * 3 * c));
        let dy = at(dout, bi * t * c);
        // datt_hᵀ[T, T] = (V_hᵀ [HS, T], ld 3C)ᵀ · dY_hᵀ[HS, T]
        let g = gemm(t, t, hs, (true, false), (3 * c, c, t)).batched(nh, (hs, hs, t * t));
        steps.push(g.call(1.0, at(q, 2 * c), dy, 0.0, datt));
        // dV_hᵀ[HS, T] += dY_hᵀ[HS, T] · (att_hᵀ stored [T, T])ᵀ
        let g = gemm(hs, t, t, (false, true), (c, t, 3 * c)).batched(nh, (hs, t * t, hs));
        steps.push(g.call(1.0, dy, a, 1.0, at(dq, 2 * c)));
        steps.push(Step::SoftmaxBackward {
            datt,
            att: a,
            rows: nh * t,
            t,
        });
        // dQ_hᵀ[HS, T] += scale · K_hᵀ[HS, T] · dS_hᵀ[T, T]
        let g = gemm(hs, t, t, (false, false), (3 * c, t, 3 * c)).batched(nh, (hs, t * t, hs));
        steps.push(g.call(scale, at(q, c), datt, 1.0, dq));
        // dK_hᵀ[HS, T] += scale · Q_hᵀ[HS, T] · (dS_hᵀ stored)ᵀ
        let g = gemm(hs, t, t, (false, true), (3 * c, t, 3 * c)).batched(nh, (hs, t * t, hs));
        steps.push(g.call(scale, q, datt, 1.0, at(dq, c)));
    }
    steps
}

/// Run `steps` on a host arena with cuBLASLt's column-major GEMM semantics and the softmax
/// kernels' (addresses are `ELEM × index` into `mem`): the reference the plans are tested
/// against.
pub fn execute_host(steps: &[Step], mem: &mut [f64]) {
    let ix = |p: u64| (p / ELEM) as usize;
    for s in steps {
        match *s {
            Step::Gemm(g) => {
                for bi in 0..g.batch {
                    let (a, b, c) = (
                        ix(g.a) + bi * g.stride_a,
                        ix(g.b) + bi * g.stride_b,
                        ix(g.c) + bi * g.stride_c,
                    );
                    for j in 0..g.n {
                        for i in 0..g.m {
                            let mut sum = 0.0;
                            for l in 0..g.k {
                                let x = if g.transa {
                                    mem[a + l + i * g.lda]
                                } else {
                                    mem[a + i + l * g.lda]
                                };
                                let y = if g.transb {
                                    mem[b + j + l * g.ldb]
                                } else {
                                    mem[b + l + j * g.ldb]
                                };
                                sum += x * y;
                            }
                            let o = c + i + j * g.ldc;
                            mem[o] = g.alpha as f64 * sum + if g.beta == 0.0 { 0.0 } else { g.beta as f64 * mem[o] };
                        }
                    }
                }
            }
            Step::SoftmaxForward { att, rows, t } => {
                for r in 0..rows {
                    let (row, i) = (ix(att) + r * t, r % t);
                    let max = (0..=i).map(|j| mem[row + j]).fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = (0..=i).map(|j| (mem[row + j] - max).exp()).sum();
                    for j in 0..t {
                        mem[row + j] = if j <= i { (mem[row + j] - max).exp() / sum } else { 0.0 };
                    }
                }
            }
            Step::SoftmaxBackward { datt, att, rows, t } => {
                for r in 0..rows {
                    let (d, a, i) = (ix(datt) + r * t, ix(att) + r * t, r % t);
                    let s: f64 = (0..=i).map(|j| mem[a + j] * mem[d + j]).sum();
                    for j in 0..t {
                        mem[d + j] = if j <= i { mem[a + j] * (mem[d + j] - s) } else { 0.0 };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;

    fn rand(n: usize, seed: u64) -> Vec<f64> {
        let mut r = fastrand::Rng::with_seed(seed);
        (0..n).map(|_| r.f64() - 0.5).collect()
    }

    /// Buffers laid out one after another in one arena, as device allocations would be.
    struct Arena {
        mem: Vec<f64>,
    }

    impl Arena {
        fn new() -> Arena {
            // start past 0 so a wrong offset of 0 cannot pass by chance
            Arena { mem: vec![f64::NAN; 7] }
        }
        fn put(&mut self, x: &[f64]) -> u64 {
            let p = self.mem.len() as u64 * ELEM;
            self.mem.extend_from_slice(x);
            self.mem.push(f64::NAN); // a guard between buffers
            p
        }
        fn get(&self, p: u64, n: usize) -> &[f64] {
            let i = (p / ELEM) as usize;
            &self.mem[i..i + n]
        }
    }

    fn close(what: &str, got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{what}");
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-9 * scale, "{what}[{i}]: {g} vs {w}");
        }
    }

    #[test]
    fn the_matmul_plans_compute_what_the_cpu_kernels_compute() {
        let (n, c, oc) = (5, 4, 6);
        let (inp, w, bias, dout) = (rand(n * c, 1), rand(oc * c, 2), rand(oc, 3), rand(n * oc, 4));
        let (dinp0, dw0, db0) = (rand(n * c, 5), rand(oc * c, 6), rand(oc, 7));
        for with_bias in [true, false] {
            let mut want = vec![0.0; n * oc];
            kernels::matmul_forward(&mut want, &inp, &w, with_bias.then_some(&bias[..]), c, oc);
            let mut ar = Arena::new();
            let (pi, pw, pb, po) = (ar.put(&inp), ar.put(&w), ar.put(&bias), ar.put(&vec![f64::NAN; n * oc]));
            let ones = ar.put(&vec![1.0; n]);
            execute_host(
                &matmul_forward(po, pi, pw, with_bias.then_some(pb), ones, n, c, oc),
                &mut ar.mem,
            );
            close("out", ar.get(po, n * oc), &want);
            // backward accumulates onto what the gradients held
            let (mut di, mut dw, mut db) = (dinp0.clone(), dw0.clone(), db0.clone());
            let dbias = if with_bias { Some(&mut db[..]) } else { None };
            kernels::matmul_backward(&mut di, &mut dw, dbias, &dout, &inp, &w, c, oc);
            let (pdi, pdw, pdb, pd) = (ar.put(&dinp0), ar.put(&dw0), ar.put(&db0), ar.put(&dout));
            let steps = matmul_backward(pdi, pdw, with_bias.then_some(pdb), pd, pi, pw, ones, n, c, oc);
            execute_host(&steps, &mut ar.mem);
            close("dinp", ar.get(pdi, n * c), &di);
            close("dw", ar.get(pdw, oc * c), &dw);
            close("dbias", ar.get(pdb, oc), &db);
        }
    }

    #[test]
    fn the_attention_plans_compute_what_the_cpu_kernels_compute() {
        let (b, t, c, nh) = (2, 5, 12, 3);
        let qkv = rand(b * t * 3 * c, 11);
        let mut y = vec![0.0; b * t * c];
        let mut att = vec![0.0; b * nh * t * t];
        kernels::attention_forward(&mut y, &mut att, &qkv, b, t, c, nh);
        let mut ar = Arena::new();
        let pq = ar.put(&qkv);
        let (py, pa) = (
            ar.put(&vec![f64::NAN; b * t * c]),
            ar.put(&vec![f64::NAN; b * nh * t * t]),
        );
        execute_host(&attention_forward(py, pa, pq, b, t, c, nh), &mut ar.mem);
        close("att", ar.get(pa, b * nh * t * t), &att);
        close("out", ar.get(py, b * t * c), &y);
        let (dout, dqkv0) = (rand(b * t * c, 12), rand(b * t * 3 * c, 13));
        let mut dqkv = dqkv0.clone();
        kernels::attention_backward(&mut dqkv, &dout, &qkv, &att, b, t, c, nh);
        let (pdq, pd) = (ar.put(&dqkv0), ar.put(&dout));
        let scratch = ar.put(&vec![f64::NAN; nh * t * t]);
        execute_host(&attention_backward(pdq, pd, pq, pa, scratch, b, t, c, nh), &mut ar.mem);
        close("dqkv", ar.get(pdq, b * t * 3 * c), &dqkv);
    }

    /// The CUDA backend's flash attention (probabilities in a reused scratch, recomputed in
    /// backward) computes what the host's flash kernels compute.
    #[test]
    fn the_flash_attention_plans_compute_what_the_cpu_flash_kernels_compute() {
        use crate::flash::{flash_attention_backward as fb, flash_attention_forward as ff, KeyValues};
        let (b, t, c, nh) = (3, 6, 8, 2);
        let qkv = rand(b * t * 3 * c, 21);
        let own = KeyValues::own(t, c);
        let (mut y, mut lse) = (vec![0.0; b * t * c], vec![0.0; b * nh * t]);
        ff(&mut y, &mut lse, &qkv, &qkv, &own, b, c, nh);
        let mut ar = Arena::new();
        let pq = ar.put(&qkv);
        let py = ar.put(&vec![f64::NAN; b * t * c]);
        let (scratch, datt) = (ar.put(&vec![f64::NAN; nh * t * t]), ar.put(&vec![f64::NAN; nh * t * t]));
        execute_host(&flash_attention_forward(py, scratch, pq, b, t, c, nh), &mut ar.mem);
        close("out", ar.get(py, b * t * c), &y);
        let (dout, dqkv0) = (rand(b * t * c, 22), rand(b * t * 3 * c, 23));
        let mut dqkv = dqkv0.clone();
        fb(&mut dqkv, None, &dout, &y, &lse, &qkv, &qkv, &own, b, c, nh);
        let (pdq, pd) = (ar.put(&dqkv0), ar.put(&dout));
        execute_host(
            &flash_attention_backward(pdq, pd, pq, scratch, datt, b, t, c, nh),
            &mut ar.mem,
        );
        close("dqkv", ar.get(pdq, b * t * 3 * c), &dqkv);
    }
}
