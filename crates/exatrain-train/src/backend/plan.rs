//! The CUDA backend's matmul and attention as data: the cuBLASLt GEMMs (column-major, with
//! transposes, leading dimensions, strided batches, `alpha` and `beta`) and the causal-softmax
//! kernels between them, over device addresses. Pure, so the mapping from the CPU kernels'
//! row-major products to cuBLASLt's terms — the easiest part of a GPU port to get wrong — is
//! tested here without a GPU: [`execute_host`] runs a plan with cuBLASLt's and the softmax
//! kernels' semantics on a host arena, and the tests compare it with `crate::kernels`.
//!
//! Row-major `X[r, c]` with row stride `L` is column-major `Xᵀ` with leading dimension `L`, so
//! every row-major product `C = A·B` is issued as the column-major `Cᵀ = Bᵀ·Aᵀ`.

use crate::flash::KeyValues;

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
    /// In place over `rows` rows of `mask.tk`: the causal softmax, row r being the query at
    /// global position `r mod mask.tq + mask.offset` (it keeps columns ≤ that position).
    SoftmaxForward {
        att: u64,
        rows: usize,
        mask: Mask,
    },
    /// In place: `datt` becomes the gradient at the softmax's input.
    SoftmaxBackward {
        datt: u64,
        att: u64,
        rows: usize,
        mask: Mask,
    },
}

/// The causal mask of a block of attention rows: `tq` query rows per head, at global positions
/// `offset..offset + tq`, against `tk` keys in global order (the row length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask {
    pub tq: usize,
    pub tk: usize,
    pub offset: usize,
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

/// One attention call's operands: the queries' qkv [B, Tq, 3C] and its gradient, and where the
/// keys and values are as `at` says — the qkv buffer itself (`KeyValues::own`: its gradient is
/// dqkv's K and V parts) or, under context parallelism, a gathered [B, Tk, 2C] buffer in global
/// order with its own gradient.
#[derive(Clone, Copy)]
struct Operands<'a> {
    qkv: u64,
    kv: u64,
    at: &'a KeyValues,
    c: usize,
    nh: usize,
}

/// The query rows of `pos` in contiguous runs of global positions: (first row, rows, the first
/// row's position). Self-attention is one run; a context-parallel rank's two chunks are two.
fn runs(pos: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &p) in pos.iter().enumerate() {
        match out.last_mut() {
            Some((lo, len, p0)) if *lo + *len == i && *p0 + *len == p => *len += 1,
            _ => out.push((i, 1, p)),
        }
    }
    out
}

impl<'a> Operands<'a> {
    /// Self-attention over `qkv` itself (`at`: `KeyValues::own`).
    fn own(qkv: u64, at: &'a KeyValues, c: usize, nh: usize) -> Self {
        Operands {
            qkv,
            kv: qkv,
            at,
            c,
            nh,
        }
    }
    fn hs(&self) -> usize {
        self.c / self.nh
    }
    /// Sequence `bi`'s query rows from `lo` (their qkv rows) and its keys' rows.
    fn rows(&self, bi: usize, lo: usize) -> (u64, u64) {
        let tq = self.at.pos.len();
        (
            at(self.qkv, (bi * tq + lo) * 3 * self.c),
            at(self.kv, bi * self.at.tk * self.at.stride),
        )
    }

    /// The causal softmax(scale·Q_h·K_hᵀ) of one run of `len` queries from row `lo` (positions
    /// from `p0`) against the `p0 + len` keys they see, into `a` [NH, len, p0 + len].
    fn probabilities(&self, a: u64, bi: usize, (lo, len, p0): (usize, usize, usize)) -> [Step; 2] {
        let (hs, kl, st) = (self.hs(), p0 + len, self.at.stride);
        let scale = 1.0 / (hs as f32).sqrt();
        let (q, kv) = self.rows(bi, lo);
        // att_hᵀ[kl, len] = (K_hᵀ [HS, kl], ld stride)ᵀ · Q_hᵀ[HS, len]
        let scores = gemm(kl, len, hs, (true, false), (st, 3 * self.c, kl)).batched(self.nh, (hs, hs, len * kl));
        [
            scores.call(scale, at(kv, self.at.k), q, 0.0, a),
            Step::SoftmaxForward {
                att: a,
                rows: self.nh * len,
                mask: Mask {
                    tq: len,
                    tk: kl,
                    offset: p0,
                },
            },
        ]
    }

    /// The run's y_h = P_h·V_h into `out` [B, Tq, C], from the probabilities `a`.
    fn values(&self, out: u64, a: u64, bi: usize, (lo, len, p0): (usize, usize, usize)) -> Step {
        let (hs, kl, st) = (self.hs(), p0 + len, self.at.stride);
        let (_, kv) = self.rows(bi, lo);
        let y = at(out, (bi * self.at.pos.len() + lo) * self.c);
        // y_hᵀ[HS, len] = V_hᵀ[HS, kl] · att_hᵀ[kl, len]
        let g = gemm(hs, len, kl, (false, false), (st, kl, self.c)).batched(self.nh, (hs, len * kl, hs));
        g.call(1.0, at(kv, self.at.v), a, 0.0, y)
    }

    /// `dq += ∂L/∂Q` into dqkv [B, Tq, 3C] and `dk`, `dv` += into `dkv` (laid out as the keys)
    /// for the run, from its probabilities `a`; `datt` is scratch for [NH, len, p0 + len].
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        dqkv: u64,
        dkv: u64,
        dout: u64,
        a: u64,
        datt: u64,
        bi: usize,
        run: (usize, usize, usize),
    ) -> Vec<Step> {
        let (lo, len, p0) = run;
        let (hs, kl, st, c) = (self.hs(), p0 + len, self.at.stride, self.c);
        let scale = 1.0 / (hs as f32).sqrt();
        let (q, kv) = self.rows(bi, lo);
        let tq = self.at.pos.len();
        let dq = at(dqkv, (bi * tq + lo) * 3 * c);
        let dkv = at(dkv, bi * self.at.tk * st);
        let dy = at(dout, (bi * tq + lo) * c);
        let nh = self.nh;
        vec![
            // datt_hᵀ[kl, len] = (V_hᵀ [HS, kl], ld stride)ᵀ · dY_hᵀ[HS, len]
            gemm(kl, len, hs, (true, false), (st, c, kl))
                .batched(nh, (hs, hs, len * kl))
                .call(1.0, at(kv, self.at.v), dy, 0.0, datt),
            // dV_hᵀ[HS, kl] += dY_hᵀ[HS, len] · (att_hᵀ stored [kl, len])ᵀ
            gemm(hs, kl, len, (false, true), (c, kl, st))
                .batched(nh, (hs, len * kl, hs))
                .call(1.0, dy, a, 1.0, at(dkv, self.at.v)),
            Step::SoftmaxBackward {
                datt,
                att: a,
                rows: nh * len,
                mask: Mask {
                    tq: len,
                    tk: kl,
                    offset: p0,
                },
            },
            // dQ_hᵀ[HS, len] += scale · K_hᵀ[HS, kl] · dS_hᵀ[kl, len]
            gemm(hs, len, kl, (false, false), (st, kl, 3 * c))
                .batched(nh, (hs, len * kl, hs))
                .call(scale, at(kv, self.at.k), datt, 1.0, dq),
            // dK_hᵀ[HS, kl] += scale · Q_hᵀ[HS, len] · (dS_hᵀ stored)ᵀ
            gemm(hs, kl, len, (false, true), (3 * c, kl, st))
                .batched(nh, (hs, len * kl, hs))
                .call(scale, q, datt, 1.0, at(dkv, self.at.k)),
        ]
    }
}

/// What `kernels::attention_forward` computes, per sequence: att_h = softmax(scale·Q_h·K_hᵀ)
/// causal into `att` [B, NH, T, T], then y_h = att_h·V_h into `out` [B, T, C]; Q, K and V of
/// head h are the HS columns at h·HS, C + h·HS, 2C + h·HS of each row of `qkv` [B, T, 3C].
pub fn attention_forward(out: u64, att: u64, qkv: u64, b: usize, t: usize, c: usize, nh: usize) -> Vec<Step> {
    let own = KeyValues::own(t, c);
    let o = Operands::own(qkv, &own, c, nh);
    let mut steps = Vec::new();
    for bi in 0..b {
        let a = at(att, bi * nh * t * t);
        steps.extend(o.probabilities(a, bi, (0, t, 0)));
        steps.push(o.values(out, a, bi, (0, t, 0)));
    }
    steps
}

/// What `flash::flash_attention_forward` computes, as the CUDA backend runs it: each
/// sequence's probabilities in `scratch` (at least [NH, Tq, Tk]; reused by the next sequence, so
/// nothing T×T is kept), then y = P·V into `out` [B, Tq, C]; its backward recomputes them. The
/// keys and values are `kv` as `at` says (the qkv buffer itself, or a gathered [B, Tk, 2C] one
/// under context parallelism, where each contiguous run of the rank's query positions — its two
/// chunks — is one masked block against the keys before its end).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward(
    out: u64,
    scratch: u64,
    qkv: u64,
    kv: u64,
    at: &KeyValues,
    b: usize,
    c: usize,
    nh: usize,
) -> Vec<Step> {
    let o = Operands { qkv, kv, at, c, nh };
    let mut steps = Vec::new();
    for bi in 0..b {
        for run in runs(&at.pos) {
            steps.extend(o.probabilities(scratch, bi, run));
            steps.push(o.values(out, scratch, bi, run));
        }
    }
    steps
}

/// `dqkv += ∂L/∂Q` (and `∂L/∂K`, `∂L/∂V` into `dkv`, laid out as `kv`; into dqkv's K and V
/// parts when the keys are the qkv buffer itself) through [`flash_attention_forward`]: each
/// run's probabilities recomputed into `scratch`, `datt` scratch of the same size.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    dqkv: u64,
    dkv: u64,
    dout: u64,
    qkv: u64,
    kv: u64,
    (scratch, datt): (u64, u64),
    at: &KeyValues,
    b: usize,
    c: usize,
    nh: usize,
) -> Vec<Step> {
    let o = Operands { qkv, kv, at, c, nh };
    let mut steps = Vec::new();
    for bi in 0..b {
        for run in runs(&at.pos) {
            steps.extend(o.probabilities(scratch, bi, run));
            steps.extend(o.backward(dqkv, dkv, dout, scratch, datt, bi, run));
        }
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
    let own = KeyValues::own(t, c);
    let o = Operands::own(qkv, &own, c, nh);
    (0..b)
        .flat_map(|bi| o.backward(dqkv, dqkv, dout, at(att, bi * nh * t * t), datt, bi, (0, t, 0)))
        .collect()
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
            Step::SoftmaxForward { att, rows, mask } => {
                let t = mask.tk;
                for r in 0..rows {
                    let (row, i) = (ix(att) + r * t, r % mask.tq + mask.offset);
                    let max = (0..=i).map(|j| mem[row + j]).fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = (0..=i).map(|j| (mem[row + j] - max).exp()).sum();
                    for j in 0..t {
                        mem[row + j] = if j <= i { (mem[row + j] - max).exp() / sum } else { 0.0 };
                    }
                }
            }
            Step::SoftmaxBackward { datt, att, rows, mask } => {
                let t = mask.tk;
                for r in 0..rows {
                    let (d, a, i) = (ix(datt) + r * t, ix(att) + r * t, r % mask.tq + mask.offset);
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
        use crate::flash::{flash_attention_backward as fb, flash_attention_forward as ff};
        let (b, t, c, nh) = (3, 6, 8, 2);
        let qkv = rand(b * t * 3 * c, 21);
        let own = KeyValues::own(t, c);
        let (mut y, mut lse) = (vec![0.0; b * t * c], vec![0.0; b * nh * t]);
        ff(&mut y, &mut lse, &qkv, &qkv, &own, b, c, nh);
        let mut ar = Arena::new();
        let pq = ar.put(&qkv);
        let py = ar.put(&vec![f64::NAN; b * t * c]);
        let (scratch, datt) = (ar.put(&vec![f64::NAN; nh * t * t]), ar.put(&vec![f64::NAN; nh * t * t]));
        execute_host(
            &flash_attention_forward(py, scratch, pq, pq, &own, b, c, nh),
            &mut ar.mem,
        );
        close("out", ar.get(py, b * t * c), &y);
        let (dout, dqkv0) = (rand(b * t * c, 22), rand(b * t * 3 * c, 23));
        let mut dqkv = dqkv0.clone();
        fb(&mut dqkv, None, &dout, &y, &lse, &qkv, &qkv, &own, b, c, nh);
        let (pdq, pd) = (ar.put(&dqkv0), ar.put(&dout));
        execute_host(
            &flash_attention_backward(pdq, pdq, pd, pq, pq, (scratch, datt), &own, b, c, nh),
            &mut ar.mem,
        );
        close("dqkv", ar.get(pdq, b * t * 3 * c), &dqkv);
    }

    /// Under context parallelism (a rank's two load-balanced chunks of queries against the
    /// whole sequence's gathered keys and values) the plans compute what the host's flash
    /// kernels compute, for every rank: outputs, dQ into dqkv, dK and dV into the gathered
    /// buffer's gradient.
    #[test]
    fn the_context_parallel_flash_plans_compute_what_the_cpu_flash_kernels_compute() {
        use crate::flash::{cp_positions, flash_attention_backward as fb, flash_attention_forward as ff};
        let (b, c, nh) = (2, 8, 2);
        for (tk, cp) in [(12, 2), (16, 4), (12, 3)] {
            let tq = tk / cp;
            let kv = rand(b * tk * 2 * c, 31);
            for r in 0..cp {
                let pos = cp_positions(tk, cp, r);
                // two chunks, r and 2cp − 1 − r, adjacent (one run) on the last rank
                assert_eq!(runs(&pos).len(), if r + 1 == cp { 1 } else { 2 });
                let at = KeyValues::gathered(tk, c, pos);
                let what = |x: &str| format!("{x}, t {tk} cp {cp} rank {r}");
                let qkv = rand(b * tq * 3 * c, 32 + r as u64);
                let (mut y, mut lse) = (vec![0.0; b * tq * c], vec![0.0; b * nh * tq]);
                ff(&mut y, &mut lse, &qkv, &kv, &at, b, c, nh);
                let mut ar = Arena::new();
                let (pq, pk) = (ar.put(&qkv), ar.put(&kv));
                let py = ar.put(&vec![f64::NAN; b * tq * c]);
                let scratch = ar.put(&vec![f64::NAN; nh * tq * tk]);
                let datt = ar.put(&vec![f64::NAN; nh * tq * tk]);
                execute_host(
                    &flash_attention_forward(py, scratch, pq, pk, &at, b, c, nh),
                    &mut ar.mem,
                );
                close(&what("out"), ar.get(py, b * tq * c), &y);
                let (dout, dqkv0, dkv0) = (rand(b * tq * c, 41), rand(b * tq * 3 * c, 42), rand(b * tk * 2 * c, 43));
                let (mut dqkv, mut dkv) = (dqkv0.clone(), dkv0.clone());
                fb(&mut dqkv, Some(&mut dkv), &dout, &y, &lse, &qkv, &kv, &at, b, c, nh);
                let (pdq, pdk, pd) = (ar.put(&dqkv0), ar.put(&dkv0), ar.put(&dout));
                execute_host(
                    &flash_attention_backward(pdq, pdk, pd, pq, pk, (scratch, datt), &at, b, c, nh),
                    &mut ar.mem,
                );
                close(&what("dqkv"), ar.get(pdq, b * tq * 3 * c), &dqkv);
                close(&what("dkv"), ar.get(pdk, b * tk * 2 * c), &dkv);
            }
        }
    }

    #[test]
    fn query_positions_split_into_contiguous_runs() {
        assert_eq!(runs(&[0, 1, 2, 3]), vec![(0, 4, 0)]);
        assert_eq!(runs(&[2, 3, 8, 9]), vec![(0, 2, 2), (2, 2, 8)]);
        // adjacent chunks (the last rank's) are one run
        assert_eq!(runs(&[4, 5, 6, 7]), vec![(0, 4, 4)]);
        assert_eq!(runs(&[5, 3]), vec![(0, 1, 5), (1, 1, 3)]);
    }
}
