//! Flash attention's kernel pair on the host: causal multi-head attention that keeps no T×T
//! probabilities between forward and backward — only each row's log-sum-exp — and recomputes
//! them in backward (what `--flash-attention` prices: no s×s activation, the scores computed
//! again in backward). The queries may be a slice of the sequence at any global positions and
//! the keys and values a separate buffer, so one pair serves context parallelism too: a rank's
//! queries (its two load-balanced chunks) against the whole sequence's keys and values gathered
//! from the context-parallel group.
//!
//! Shapes: B batch, Tq query rows (the rank's tokens), Tk key rows (the whole sequence), C the
//! attention width (heads × head size, this tensor-parallel rank's share), NH heads.

use rayon::prelude::*;

use crate::kernels::causal_softmax_row;
use crate::Real;

/// Where the keys and values of one attention call are, and which keys each query sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValues {
    /// Tk: key rows per sequence
    pub tk: usize,
    /// the row stride of the key/value buffer (3C when it is the qkv buffer itself, 2C for a
    /// gathered [B, Tk, 2C] one)
    pub stride: usize,
    /// offsets of K and V inside a row
    pub k: usize,
    pub v: usize,
    /// the global position of each query row (causal: row i sees keys 0..=pos[i])
    pub pos: Vec<usize>,
}

impl KeyValues {
    /// Self-attention over the qkv buffer [B, T, 3C] itself: queries at positions 0..T.
    pub fn own(t: usize, c: usize) -> Self {
        KeyValues {
            tk: t,
            stride: 3 * c,
            k: c,
            v: 2 * c,
            pos: (0..t).collect(),
        }
    }

    /// A rank's queries at positions `pos` against a gathered [B, Tk, 2C] key/value buffer
    /// (K, then V, in each row) in global order.
    pub fn gathered(tk: usize, c: usize, pos: Vec<usize>) -> Self {
        KeyValues {
            tk,
            stride: 2 * c,
            k: 0,
            v: c,
            pos,
        }
    }
}

/// S = scale · Q Kᵀ [Tq, Tk] of one (sequence, head).
#[allow(clippy::too_many_arguments)]
fn scores<R: Real>(s: &mut [R], q: &[R], qs: usize, k: &[R], ks: usize, tq: usize, tk: usize, hs: usize, scale: R) {
    // SAFETY: Q is Tq×hs with row stride qs, K is Tk×hs with row stride ks (both inside their
    // buffers, checked by the callers' slicing); s is a fresh Tq×Tk buffer.
    unsafe {
        R::gemm(
            tq,
            hs,
            tk,
            scale,
            q.as_ptr(),
            qs as isize,
            1,
            k.as_ptr(),
            1,
            ks as isize,
            R::zero(),
            s.as_mut_ptr(),
            tk as isize,
            1,
        );
    }
}

/// out[B,Tq,C] = softmax(QKᵀ/√hs, causal by position)·V; lse[B,NH,Tq] keeps each row's
/// log-sum-exp for backward. Q is read from qkv [B,Tq,3C], K and V from `kv` as `at` says.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward<R: Real>(
    out: &mut [R],
    lse: &mut [R],
    qkv: &[R],
    kv: &[R],
    at: &KeyValues,
    b: usize,
    c: usize,
    nh: usize,
) {
    let (tq, tk, hs) = (at.pos.len(), at.tk, c / nh);
    debug_assert_eq!(lse.len(), b * nh * tq);
    let scale = R::one() / R::of(hs as f64).sqrt();
    let heads: Vec<(Vec<R>, Vec<R>)> = (0..b * nh)
        .into_par_iter()
        .map(|bh| {
            let (bi, h) = (bh / nh, bh % nh);
            let q = &qkv[bi * tq * 3 * c + h * hs..];
            let kvb = &kv[bi * tk * at.stride + h * hs..];
            let (k, v) = (&kvb[at.k..], &kvb[at.v..]);
            let mut s = vec![R::zero(); tq * tk];
            scores(&mut s, q, 3 * c, k, at.stride, tq, tk, hs, scale);
            let mut l = vec![R::zero(); tq];
            for i in 0..tq {
                l[i] = causal_softmax_row(&mut s[i * tk..(i + 1) * tk], at.pos[i]);
            }
            let mut y = vec![R::zero(); tq * hs];
            // SAFETY: s is Tq×Tk, V is Tk×hs with row stride `stride`, y is Tq×hs.
            unsafe {
                R::gemm(
                    tq,
                    tk,
                    hs,
                    R::one(),
                    s.as_ptr(),
                    tk as isize,
                    1,
                    v.as_ptr(),
                    at.stride as isize,
                    1,
                    R::zero(),
                    y.as_mut_ptr(),
                    hs as isize,
                    1,
                );
            }
            (y, l)
        })
        .collect();
    for (bh, (y, l)) in heads.into_iter().enumerate() {
        let (bi, h) = (bh / nh, bh % nh);
        for i in 0..tq {
            let o = (bi * tq + i) * c + h * hs;
            out[o..o + hs].copy_from_slice(&y[i * hs..(i + 1) * hs]);
        }
        lse[bh * tq..(bh + 1) * tq].copy_from_slice(&l);
    }
}

/// Backward of [`flash_attention_forward`], the probabilities recomputed from Q, K and lse:
/// dQ += into the Q part of dqkv [B,Tq,3C]; dK and dV += into `dkv` laid out as `at` says, or,
/// when `dkv` is None (the keys are the qkv buffer itself), into dqkv's K and V parts.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward<R: Real>(
    dqkv: &mut [R],
    dkv: Option<&mut [R]>,
    dout: &[R],
    out: &[R],
    lse: &[R],
    qkv: &[R],
    kv: &[R],
    at: &KeyValues,
    b: usize,
    c: usize,
    nh: usize,
) {
    let (tq, tk, hs) = (at.pos.len(), at.tk, c / nh);
    let scale = R::one() / R::of(hs as f64).sqrt();
    let grads: Vec<[Vec<R>; 3]> = (0..b * nh)
        .into_par_iter()
        .map(|bh| {
            let (bi, h) = (bh / nh, bh % nh);
            let q = &qkv[bi * tq * 3 * c + h * hs..];
            let kvb = &kv[bi * tk * at.stride + h * hs..];
            let (k, v) = (&kvb[at.k..], &kvb[at.v..]);
            let dy = &dout[bi * tq * c + h * hs..];
            let y = &out[bi * tq * c + h * hs..];
            let l = &lse[bh * tq..(bh + 1) * tq];
            // the probabilities again
            let mut p = vec![R::zero(); tq * tk];
            scores(&mut p, q, 3 * c, k, at.stride, tq, tk, hs, scale);
            for i in 0..tq {
                let last = at.pos[i];
                let row = &mut p[i * tk..(i + 1) * tk];
                row[..=last].iter_mut().for_each(|x| *x = (*x - l[i]).exp());
                row[last + 1..].iter_mut().for_each(|x| *x = R::zero());
            }
            let mut dp = vec![R::zero(); tq * tk];
            let mut dv = vec![R::zero(); tk * hs];
            // SAFETY (all four products): the head slices of Q, K, V (row strides 3C and
            // `stride`), dY and Y (row stride C), and freshly allocated outputs.
            unsafe {
                // dP = dY · Vᵀ
                R::gemm(
                    tq,
                    hs,
                    tk,
                    R::one(),
                    dy.as_ptr(),
                    c as isize,
                    1,
                    v.as_ptr(),
                    1,
                    at.stride as isize,
                    R::zero(),
                    dp.as_mut_ptr(),
                    tk as isize,
                    1,
                );
                // dV = Pᵀ · dY
                R::gemm(
                    tk,
                    tq,
                    hs,
                    R::one(),
                    p.as_ptr(),
                    1,
                    tk as isize,
                    dy.as_ptr(),
                    c as isize,
                    1,
                    R::zero(),
                    dv.as_mut_ptr(),
                    hs as isize,
                    1,
                );
            }
            // softmax backward: dS_ij = P_ij (dP_ij − D_i)·scale, D_i = dY_i · Y_i (= Σ_j P_ij dP_ij)
            for i in 0..tq {
                let d: R = (0..hs).map(|e| dy[i * c + e] * y[i * c + e]).sum();
                let (pr, dr) = (&p[i * tk..(i + 1) * tk], &mut dp[i * tk..(i + 1) * tk]);
                for j in 0..tk {
                    dr[j] = pr[j] * (dr[j] - d) * scale;
                }
            }
            let mut dq = vec![R::zero(); tq * hs];
            let mut dk = vec![R::zero(); tk * hs];
            unsafe {
                // dQ = dS · K ; dK = dSᵀ · Q
                R::gemm(
                    tq,
                    tk,
                    hs,
                    R::one(),
                    dp.as_ptr(),
                    tk as isize,
                    1,
                    k.as_ptr(),
                    at.stride as isize,
                    1,
                    R::zero(),
                    dq.as_mut_ptr(),
                    hs as isize,
                    1,
                );
                R::gemm(
                    tk,
                    tq,
                    hs,
                    R::one(),
                    dp.as_ptr(),
                    1,
                    tk as isize,
                    q.as_ptr(),
                    3 * c as isize,
                    1,
                    R::zero(),
                    dk.as_mut_ptr(),
                    hs as isize,
                    1,
                );
            }
            [dq, dk, dv]
        })
        .collect();
    let add = |dst: &mut [R], at: usize, src: &[R]| {
        for (d, s) in dst[at..at + src.len()].iter_mut().zip(src) {
            *d = *d + *s;
        }
    };
    let mut dkv = dkv;
    for (bh, [dq, dk, dv]) in grads.into_iter().enumerate() {
        let (bi, h) = (bh / nh, bh % nh);
        for i in 0..tq {
            add(dqkv, (bi * tq + i) * 3 * c + h * hs, &dq[i * hs..(i + 1) * hs]);
        }
        for j in 0..tk {
            let (kj, vj) = (&dk[j * hs..(j + 1) * hs], &dv[j * hs..(j + 1) * hs]);
            match dkv.as_deref_mut() {
                Some(d) => {
                    let row = (bi * tk + j) * at.stride + h * hs;
                    add(d, row + at.k, kj);
                    add(d, row + at.v, vj);
                }
                None => {
                    let row = (bi * tq + j) * 3 * c + h * hs;
                    add(dqkv, row + c, kj);
                    add(dqkv, row + 2 * c, vj);
                }
            }
        }
    }
}

/// The global positions of a context-parallel rank's tokens: the sequence of `t` tokens is cut
/// into 2·cp chunks and rank r holds chunks r and 2·cp − 1 − r (Megatron's load balancing:
/// every rank gets the same share of the causal work), in that order.
pub fn cp_positions(t: usize, cp: usize, rank: usize) -> Vec<usize> {
    if cp == 1 {
        return (0..t).collect();
    }
    let chunk = t / (2 * cp);
    let (a, b) = (rank * chunk, (2 * cp - 1 - rank) * chunk);
    (a..a + chunk).chain(b..b + chunk).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{attention_backward, attention_forward};

    fn fill(n: usize, seed: u64) -> Vec<f64> {
        let mut r = fastrand::Rng::with_seed(seed);
        (0..n).map(|_| r.f64() * 2.0 - 1.0).collect()
    }

    /// Over the qkv buffer itself, flash attention computes what the kept-probabilities kernel
    /// computes, forward and backward.
    #[test]
    fn flash_equals_the_materialized_attention() {
        let (b, t, c, nh) = (2, 7, 8, 2);
        let qkv = fill(b * t * 3 * c, 1);
        let dout = fill(b * t * c, 2);
        let (mut o1, mut att) = (vec![0.0; b * t * c], vec![0.0; b * nh * t * t]);
        attention_forward(&mut o1, &mut att, &qkv, b, t, c, nh);
        let (mut o2, mut lse) = (vec![0.0; b * t * c], vec![0.0; b * nh * t]);
        let at = KeyValues::own(t, c);
        flash_attention_forward(&mut o2, &mut lse, &qkv, &qkv, &at, b, c, nh);
        for (x, y) in o1.iter().zip(&o2) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
        let mut d1 = vec![0.0; qkv.len()];
        attention_backward(&mut d1, &dout, &qkv, &att, b, t, c, nh);
        let mut d2 = vec![0.0; qkv.len()];
        flash_attention_backward(&mut d2, None, &dout, &o2, &lse, &qkv, &qkv, &at, b, c, nh);
        for (x, y) in d1.iter().zip(&d2) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
    }

    /// Context parallelism: each rank's queries against the gathered keys give that rank's rows
    /// of the whole sequence's attention, and the ranks' key/value gradients sum to the whole's.
    #[test]
    fn context_parallel_ranks_compute_their_rows_of_the_whole() {
        let (b, t, c, nh, cp) = (2, 8, 4, 2, 2);
        let qkv = fill(b * t * 3 * c, 3);
        let dout = fill(b * t * c, 4);
        let whole = KeyValues::own(t, c);
        let (mut o, mut lse) = (vec![0.0; b * t * c], vec![0.0; b * nh * t]);
        flash_attention_forward(&mut o, &mut lse, &qkv, &qkv, &whole, b, c, nh);
        let mut dw = vec![0.0; qkv.len()];
        flash_attention_backward(&mut dw, None, &dout, &o, &lse, &qkv, &qkv, &whole, b, c, nh);
        // the gathered K and V [B, T, 2C]
        let mut kv = vec![0.0; b * t * 2 * c];
        for n in 0..b * t {
            kv[n * 2 * c..(n + 1) * 2 * c].copy_from_slice(&qkv[n * 3 * c + c..(n + 1) * 3 * c]);
        }
        let mut dkv = vec![0.0; kv.len()];
        for r in 0..cp {
            let pos = cp_positions(t, cp, r);
            let tq = pos.len();
            let rows = |x: &[f64], w: usize| -> Vec<f64> {
                (0..b)
                    .flat_map(|bi| {
                        pos.iter()
                            .flat_map(move |&p| x[(bi * t + p) * w..(bi * t + p + 1) * w].to_vec())
                    })
                    .collect()
            };
            let (q, dy) = (rows(&qkv, 3 * c), rows(&dout, c));
            let at = KeyValues::gathered(t, c, pos.clone());
            let (mut ol, mut ll) = (vec![0.0; b * tq * c], vec![0.0; b * nh * tq]);
            flash_attention_forward(&mut ol, &mut ll, &q, &kv, &at, b, c, nh);
            assert_eq!(ol, rows(&o, c), "rank {r}: its rows of the output");
            let mut dq = vec![0.0; q.len()];
            flash_attention_backward(&mut dq, Some(&mut dkv), &dy, &ol, &ll, &q, &kv, &at, b, c, nh);
            for (i, x) in dq.iter().enumerate() {
                let (n, e) = (i / (3 * c), i % (3 * c));
                let want = if e < c { rows(&dw, 3 * c)[n * 3 * c + e] } else { 0.0 };
                assert!((x - want).abs() < 1e-12, "rank {r}: dq[{i}] {x} vs {want}");
            }
        }
        for n in 0..b * t {
            for e in 0..2 * c {
                let (x, want) = (dkv[n * 2 * c + e], dw[n * 3 * c + c + e]);
                assert!((x - want).abs() < 1e-12, "dkv[{n}, {e}] {x} vs {want}");
            }
        }
    }

    #[test]
    fn positions_pair_chunks_from_both_ends() {
        assert_eq!(cp_positions(8, 2, 0), vec![0, 1, 6, 7]);
        assert_eq!(cp_positions(8, 2, 1), vec![2, 3, 4, 5]);
        assert_eq!(cp_positions(6, 1, 0), (0..6).collect::<Vec<_>>());
        let mut all: Vec<usize> = (0..4).flat_map(|r| cp_positions(16, 4, r)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }
}
