//! The ops of a GPT-2 block, each a `<op>_forward` / `<op>_backward` pair over flat row-major
//! slices. Shapes are given in the doc of each op (B batch, T time, C channels, NH heads,
//! OC output channels, V vocabulary, Vp padded vocabulary). Backward ops *accumulate* (`+=`)
//! into parameter and input gradients, so gradient accumulation over microbatches is free.
//!
//! Parallel work is split into fixed blocks that do not depend on the thread count, and every
//! reduction adds its blocks in order: results are bit-identical run to run and at any thread count.

use rayon::prelude::*;

use crate::Real;

/// Rows per parallel block of the row-wise ops.
const ROWS: usize = 64;

/// Rows per parallel block of a matrix product: large, because each block packs the whole other
/// operand again. The split never changes a result: each output element is accumulated over k
/// in the same order whatever the number of rows in its block.
const GEMM_ROWS: usize = 256;

fn r<R: Real>(x: f64) -> R {
    R::of(x)
}

/// out[N,C] = wte[tokens[n] − lo] + wpe[n % T], where `wte` holds vocabulary rows lo.. (a
/// vocabulary-parallel shard: tokens outside it contribute 0) and `wpe` may be absent (added by
/// one tensor-parallel rank only).
pub fn encoder_forward<R: Real>(
    out: &mut [R],
    tokens: &[u32],
    wte: &[R],
    lo: usize,
    wpe: Option<&[R]>,
    t: usize,
    c: usize,
) {
    let rows = wte.len() / c;
    out.par_chunks_mut(c).enumerate().for_each(|(n, o)| {
        let tok = tokens[n] as usize;
        o.iter_mut().for_each(|x| *x = R::zero());
        if (lo..lo + rows).contains(&tok) {
            o.copy_from_slice(&wte[(tok - lo) * c..(tok - lo + 1) * c]);
        }
        if let Some(wpe) = wpe {
            let pos = (n % t) * c;
            for j in 0..c {
                o[j] = o[j] + wpe[pos + j];
            }
        }
    });
}

/// dwte[tokens[n] − lo] += dout[n] for the tokens in the shard; dwpe[n % T] += dout[n].
pub fn encoder_backward<R: Real>(
    dwte: &mut [R],
    lo: usize,
    dwpe: Option<&mut [R]>,
    dout: &[R],
    tokens: &[u32],
    t: usize,
    c: usize,
) {
    let rows = dwte.len() / c;
    for (n, d) in dout.chunks(c).enumerate() {
        let tok = tokens[n] as usize;
        if (lo..lo + rows).contains(&tok) {
            let w = &mut dwte[(tok - lo) * c..(tok - lo + 1) * c];
            for j in 0..c {
                w[j] = w[j] + d[j];
            }
        }
    }
    if let Some(dwpe) = dwpe {
        for (n, d) in dout.chunks(c).enumerate() {
            let pos = (n % t) * c;
            for j in 0..c {
                dwpe[pos + j] = dwpe[pos + j] + d[j];
            }
        }
    }
}

/// out[N,C] = (inp - mean) · rstd · w + b, per row; keeps mean[N] and rstd[N] for backward.
pub fn layernorm_forward<R: Real>(
    out: &mut [R],
    mean: &mut [R],
    rstd: &mut [R],
    inp: &[R],
    w: &[R],
    b: &[R],
    c: usize,
) {
    let cf = R::of(c as f64);
    out.par_chunks_mut(c)
        .zip(mean.par_iter_mut())
        .zip(rstd.par_iter_mut())
        .zip(inp.par_chunks(c))
        .for_each(|(((o, m), s), x)| {
            let mu = x.iter().copied().sum::<R>() / cf;
            let var = x.iter().map(|&v| (v - mu) * (v - mu)).sum::<R>() / cf;
            let rs = R::one() / (var + r(1e-5)).sqrt();
            for j in 0..c {
                o[j] = (x[j] - mu) * rs * w[j] + b[j];
            }
            *m = mu;
            *s = rs;
        });
}

/// Sum per-block partial vectors in block order (deterministic).
fn sum_blocks<R: Real>(parts: Vec<Vec<R>>, into: &mut [R]) {
    for p in parts {
        for (a, b) in into.iter_mut().zip(p) {
            *a = *a + b;
        }
    }
}

/// dinp += ∂L/∂inp, dw += Σ dout·norm, db += Σ dout.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward<R: Real>(
    dinp: &mut [R],
    dw: &mut [R],
    db: &mut [R],
    dout: &[R],
    inp: &[R],
    w: &[R],
    mean: &[R],
    rstd: &[R],
    c: usize,
) {
    let cf = R::of(c as f64);
    let parts: Vec<Vec<R>> = dinp
        .par_chunks_mut(ROWS * c)
        .enumerate()
        .map(|(blk, dblock)| {
            let mut acc = vec![R::zero(); 2 * c];
            for (i, di) in dblock.chunks_mut(c).enumerate() {
                let n = blk * ROWS + i;
                let x = &inp[n * c..(n + 1) * c];
                let d = &dout[n * c..(n + 1) * c];
                let (mu, rs) = (mean[n], rstd[n]);
                let mut dnorm_mean = R::zero();
                let mut dnorm_norm_mean = R::zero();
                for j in 0..c {
                    let norm = (x[j] - mu) * rs;
                    let dnorm = d[j] * w[j];
                    dnorm_mean = dnorm_mean + dnorm;
                    dnorm_norm_mean = dnorm_norm_mean + dnorm * norm;
                }
                dnorm_mean = dnorm_mean / cf;
                dnorm_norm_mean = dnorm_norm_mean / cf;
                for j in 0..c {
                    let norm = (x[j] - mu) * rs;
                    let dnorm = d[j] * w[j];
                    acc[j] = acc[j] + d[j] * norm;
                    acc[c + j] = acc[c + j] + d[j];
                    di[j] = di[j] + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
                }
            }
            acc
        })
        .collect();
    let mut acc = vec![R::zero(); 2 * c];
    sum_blocks(parts, &mut acc);
    for j in 0..c {
        dw[j] = dw[j] + acc[j];
        db[j] = db[j] + acc[c + j];
    }
}

/// out[N,OC] = inp[N,C] · wᵀ + bias, with w[OC,C] (a linear layer's weight as stored by PyTorch).
pub fn matmul_forward<R: Real>(out: &mut [R], inp: &[R], w: &[R], bias: Option<&[R]>, c: usize, oc: usize) {
    out.par_chunks_mut(GEMM_ROWS * oc).enumerate().for_each(|(blk, o)| {
        let rows = o.len() / oc;
        let x = &inp[blk * GEMM_ROWS * c..(blk * GEMM_ROWS + rows) * c];
        // SAFETY: x is rows×C, w is OC×C read transposed, o is rows×OC; all in bounds, o is unique.
        unsafe {
            R::gemm(
                rows,
                c,
                oc,
                R::one(),
                x.as_ptr(),
                c as isize,
                1,
                w.as_ptr(),
                1,
                c as isize,
                R::zero(),
                o.as_mut_ptr(),
                oc as isize,
                1,
            );
        }
        if let Some(b) = bias {
            for row in o.chunks_mut(oc) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v = *v + *bb;
                }
            }
        }
    });
}

/// dinp += dout · w; dw += doutᵀ · inp; dbias += Σ_n dout.
#[allow(clippy::too_many_arguments)]
pub fn matmul_backward<R: Real>(
    dinp: &mut [R],
    dw: &mut [R],
    dbias: Option<&mut [R]>,
    dout: &[R],
    inp: &[R],
    w: &[R],
    c: usize,
    oc: usize,
) {
    let n = inp.len() / c;
    dinp.par_chunks_mut(GEMM_ROWS * c).enumerate().for_each(|(blk, di)| {
        let rows = di.len() / c;
        let d = &dout[blk * GEMM_ROWS * oc..(blk * GEMM_ROWS + rows) * oc];
        // SAFETY: d is rows×OC, w is OC×C, di is rows×C and unique to this block.
        unsafe {
            R::gemm(
                rows,
                oc,
                c,
                R::one(),
                d.as_ptr(),
                oc as isize,
                1,
                w.as_ptr(),
                c as isize,
                1,
                R::one(),
                di.as_mut_ptr(),
                c as isize,
                1,
            );
        }
    });
    // Split dw by output rows: each block owns rows [o0, o0 + rows) of dw.
    dw.par_chunks_mut(GEMM_ROWS * c).enumerate().for_each(|(blk, dwb)| {
        let rows = dwb.len() / c;
        let o0 = blk * GEMM_ROWS;
        // SAFETY: A = doutᵀ restricted to rows o0.., read with row stride 1 and column stride OC
        // (rows×N); B = inp (N×C); dwb is rows×C and unique to this block.
        unsafe {
            R::gemm(
                rows,
                n,
                c,
                R::one(),
                dout.as_ptr().add(o0),
                1,
                oc as isize,
                inp.as_ptr(),
                c as isize,
                1,
                R::one(),
                dwb.as_mut_ptr(),
                c as isize,
                1,
            );
        }
    });
    if let Some(db) = dbias {
        db.par_iter_mut().enumerate().for_each(|(o, b)| {
            let mut s = R::zero();
            for row in 0..n {
                s = s + dout[row * oc + o];
            }
            *b = *b + s;
        });
    }
}

/// Causal multi-head attention. qkv[B,T,3C] holds Q, K, V side by side; out[B,T,C];
/// att[B,NH,T,T] keeps the softmax probabilities for backward (zero above the diagonal).
pub fn attention_forward<R: Real>(out: &mut [R], att: &mut [R], qkv: &[R], b: usize, t: usize, c: usize, nh: usize) {
    debug_assert_eq!(att.len(), b * nh * t * t);
    let hs = c / nh;
    let scale = R::one() / R::of(hs as f64).sqrt();
    let c3 = 3 * c;
    let heads: Vec<Vec<R>> = att
        .par_chunks_mut(t * t)
        .enumerate()
        .map(|(bh, a)| {
            let (bi, h) = (bh / nh, bh % nh);
            let base = bi * t * c3 + h * hs;
            let q = &qkv[base..];
            let k = &qkv[base + c..];
            let v = &qkv[base + 2 * c..];
            // SAFETY: Q and K are T×hs with row stride 3C inside qkv; a is T×T and unique.
            unsafe {
                R::gemm(
                    t,
                    hs,
                    t,
                    scale,
                    q.as_ptr(),
                    c3 as isize,
                    1,
                    k.as_ptr(),
                    1,
                    c3 as isize,
                    R::zero(),
                    a.as_mut_ptr(),
                    t as isize,
                    1,
                );
            }
            for i in 0..t {
                causal_softmax_row(&mut a[i * t..(i + 1) * t], i);
            }
            let mut y = vec![R::zero(); t * hs];
            // SAFETY: a is T×T, V is T×hs with row stride 3C, y is T×hs.
            unsafe {
                R::gemm(
                    t,
                    t,
                    hs,
                    R::one(),
                    a.as_ptr(),
                    t as isize,
                    1,
                    v.as_ptr(),
                    c3 as isize,
                    1,
                    R::zero(),
                    y.as_mut_ptr(),
                    hs as isize,
                    1,
                );
            }
            y
        })
        .collect();
    for (bh, y) in heads.into_iter().enumerate() {
        let (bi, h) = (bh / nh, bh % nh);
        for i in 0..t {
            let o = (bi * t + i) * c + h * hs;
            out[o..o + hs].copy_from_slice(&y[i * hs..(i + 1) * hs]);
        }
    }
}

/// One row of scores in place: softmax over columns 0..=last, zeros after (the causal mask);
/// returns the log-sum-exp of the row (flash attention keeps it).
pub(crate) fn causal_softmax_row<R: Real>(row: &mut [R], last: usize) -> R {
    let max = row[..=last].iter().copied().fold(R::neg_infinity(), R::max);
    let mut sum = R::zero();
    for x in row[..=last].iter_mut() {
        *x = (*x - max).exp();
        sum = sum + *x;
    }
    let inv = R::one() / sum;
    for x in row[..=last].iter_mut() {
        *x = *x * inv;
    }
    for x in row[last + 1..].iter_mut() {
        *x = R::zero();
    }
    max + sum.ln()
}

/// dqkv += ∂L/∂qkv through causal attention, from dout[B,T,C] and the kept att[B,NH,T,T].
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<R: Real>(
    dqkv: &mut [R],
    dout: &[R],
    qkv: &[R],
    att: &[R],
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
) {
    let hs = c / nh;
    let scale = R::one() / R::of(hs as f64).sqrt();
    let c3 = 3 * c;
    let grads: Vec<[Vec<R>; 3]> = (0..b * nh)
        .into_par_iter()
        .map(|bh| {
            let (bi, h) = (bh / nh, bh % nh);
            let base = bi * t * c3 + h * hs;
            let (q, k, v) = (&qkv[base..], &qkv[base + c..], &qkv[base + 2 * c..]);
            let a = &att[bh * t * t..(bh + 1) * t * t];
            let dy = &dout[bi * t * c + h * hs..];
            let mut da = vec![R::zero(); t * t];
            let mut dq = vec![R::zero(); t * hs];
            let mut dk = vec![R::zero(); t * hs];
            let mut dv = vec![R::zero(); t * hs];
            // SAFETY (all four products): operands are the T×hs head slices (row stride 3C in
            // qkv, C in dout), the T×T probabilities, and freshly allocated outputs.
            unsafe {
                // datt = dy · Vᵀ
                R::gemm(
                    t,
                    hs,
                    t,
                    R::one(),
                    dy.as_ptr(),
                    c as isize,
                    1,
                    v.as_ptr(),
                    1,
                    c3 as isize,
                    R::zero(),
                    da.as_mut_ptr(),
                    t as isize,
                    1,
                );
                // dV = attᵀ · dy
                R::gemm(
                    t,
                    t,
                    hs,
                    R::one(),
                    a.as_ptr(),
                    1,
                    t as isize,
                    dy.as_ptr(),
                    c as isize,
                    1,
                    R::zero(),
                    dv.as_mut_ptr(),
                    hs as isize,
                    1,
                );
            }
            // softmax backward, causal: dpre_ij = a_ij (da_ij - Σ_k a_ik da_ik), then the scale
            for i in 0..t {
                let ar = &a[i * t..i * t + i + 1];
                let dr = &mut da[i * t..(i + 1) * t];
                let dot: R = ar.iter().zip(dr.iter()).map(|(x, y)| *x * *y).sum();
                for j in 0..=i {
                    dr[j] = ar[j] * (dr[j] - dot) * scale;
                }
                for x in dr[i + 1..].iter_mut() {
                    *x = R::zero();
                }
            }
            unsafe {
                // dQ = dpre · K ; dK = dpreᵀ · Q
                R::gemm(
                    t,
                    t,
                    hs,
                    R::one(),
                    da.as_ptr(),
                    t as isize,
                    1,
                    k.as_ptr(),
                    c3 as isize,
                    1,
                    R::zero(),
                    dq.as_mut_ptr(),
                    hs as isize,
                    1,
                );
                R::gemm(
                    t,
                    t,
                    hs,
                    R::one(),
                    da.as_ptr(),
                    1,
                    t as isize,
                    q.as_ptr(),
                    c3 as isize,
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
    for (bh, g) in grads.into_iter().enumerate() {
        let (bi, h) = (bh / nh, bh % nh);
        for (part, gp) in g.iter().enumerate() {
            for i in 0..t {
                let o = (bi * t + i) * c3 + part * c + h * hs;
                for d in 0..hs {
                    dqkv[o + d] = dqkv[o + d] + gp[i * hs + d];
                }
            }
        }
    }
}

fn gelu_k<R: Real>() -> R {
    R::of((2.0 / std::f64::consts::PI).sqrt())
}

/// tanh(z) = 1 − 2 / (e^{2z} + 1): one exp, which is cheaper than the library tanh; exact to
/// rounding, saturating correctly at ±∞.
#[inline]
fn tanh_exp<R: Real>(z: R) -> R {
    let two = R::of(2.0);
    R::one() - two / ((two * z).exp() + R::one())
}

/// out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  (GPT-2's "gelu_new")
pub fn gelu_forward<R: Real>(out: &mut [R], inp: &[R]) {
    let (k, a, half) = (gelu_k::<R>(), R::of(0.044715), R::of(0.5));
    out.par_chunks_mut(4096).zip(inp.par_chunks(4096)).for_each(|(o, x)| {
        for (y, &v) in o.iter_mut().zip(x) {
            *y = half * v * (R::one() + tanh_exp(k * (v + a * v * v * v)));
        }
    });
}

/// dinp += dout · gelu'(inp)
pub fn gelu_backward<R: Real>(dinp: &mut [R], inp: &[R], dout: &[R]) {
    let (k, a, half) = (gelu_k::<R>(), R::of(0.044715), R::of(0.5));
    let a3 = R::of(3.0 * 0.044715);
    dinp.par_chunks_mut(4096)
        .zip(inp.par_chunks(4096))
        .zip(dout.par_chunks(4096))
        .for_each(|((di, x), d)| {
            for ((g, &v), &dy) in di.iter_mut().zip(x).zip(d) {
                let th = tanh_exp(k * (v + a * v * v * v));
                let sech2 = R::one() - th * th;
                let local = half * (R::one() + th) + half * v * sech2 * k * (R::one() + a3 * v * v);
                *g = *g + local * dy;
            }
        });
}

/// out = a + b
pub fn residual_forward<R: Real>(out: &mut [R], a: &[R], b: &[R]) {
    out.par_iter_mut()
        .zip(a.par_iter().zip(b.par_iter()))
        .for_each(|(o, (x, y))| *o = *x + *y);
}

/// da += dout; db += dout
pub fn residual_backward<R: Real>(da: &mut [R], db: &mut [R], dout: &[R]) {
    da.par_iter_mut()
        .zip(db.par_iter_mut())
        .zip(dout.par_iter())
        .for_each(|((x, y), d)| {
            *x = *x + *d;
            *y = *y + *d;
        });
}

/// Cross-entropy over a vocabulary that may be split across tensor-parallel ranks (Megatron's
/// vocab-parallel cross-entropy) in three steps with a reduction between each: this rank holds
/// logits[N,Vl] for vocabulary ids lo..lo+Vl of which the first `valid` are real (the rest is
/// padding). Step 1: maxes[N] = the row max over the valid columns.
pub fn crossentropy_max<R: Real>(maxes: &mut [R], logits: &[R], valid: usize, vl: usize) {
    maxes.par_iter_mut().enumerate().for_each(|(n, m)| {
        *m = logits[n * vl..n * vl + valid]
            .iter()
            .copied()
            .fold(R::neg_infinity(), R::max);
    });
}

/// Step 2, given the global row max: probs[n,j] = exp(logit − max) (padding 0);
/// stats[n] = Σ_j probs[n,j] and stats[N+n] = logit[n,target] − max if the target is here, else 0.
#[allow(clippy::too_many_arguments)]
pub fn crossentropy_exp<R: Real>(
    probs: &mut [R],
    stats: &mut [R],
    logits: &[R],
    maxes: &[R],
    targets: &[u32],
    lo: usize,
    valid: usize,
    vl: usize,
) {
    let n_rows = maxes.len();
    let (sums, tgt) = stats.split_at_mut(n_rows);
    probs
        .par_chunks_mut(vl)
        .zip(sums.par_iter_mut())
        .zip(tgt.par_iter_mut())
        .enumerate()
        .for_each(|(n, ((p, s), tl))| {
            let row = &logits[n * vl..(n + 1) * vl];
            let mut sum = R::zero();
            for j in 0..valid {
                p[j] = (row[j] - maxes[n]).exp();
                sum = sum + p[j];
            }
            p[valid..].iter_mut().for_each(|x| *x = R::zero());
            *s = sum;
            let t = targets[n] as usize;
            *tl = if (lo..lo + valid).contains(&t) {
                row[t - lo] - maxes[n]
            } else {
                R::zero()
            };
        });
}

/// Step 3, given the global stats: probs /= Σ; losses[n] = ln Σ − (logit[target] − max).
pub fn crossentropy_normalize<R: Real>(probs: &mut [R], losses: &mut [R], stats: &[R], vl: usize) {
    let n_rows = losses.len();
    probs
        .par_chunks_mut(vl)
        .zip(losses.par_iter_mut())
        .enumerate()
        .for_each(|(n, (p, l))| {
            let inv = R::one() / stats[n];
            p.iter_mut().for_each(|x| *x = *x * inv);
            *l = stats[n].ln() - stats[n_rows + n];
        });
}

/// probs[N,Vp] = softmax over the first V logits of each row (padded columns 0);
/// losses[N] = −ln probs[n, targets[n]] (the three steps above on one rank).
pub fn crossentropy_forward<R: Real>(
    probs: &mut [R],
    losses: &mut [R],
    logits: &[R],
    targets: &[u32],
    v: usize,
    vp: usize,
) {
    let n = losses.len();
    let mut maxes = vec![R::zero(); n];
    let mut stats = vec![R::zero(); 2 * n];
    crossentropy_max(&mut maxes, logits, v, vp);
    crossentropy_exp(probs, &mut stats, logits, &maxes, targets, 0, v, vp);
    crossentropy_normalize(probs, losses, &stats, vp);
}

/// dlogits += dloss · (probs − onehot(target)) over this rank's Vl columns (ids lo..), of
/// which the first `valid` are real; every position's loss has weight `dloss` (1/N for a mean).
pub fn crossentropy_backward<R: Real>(
    dlogits: &mut [R],
    probs: &[R],
    targets: &[u32],
    lo: usize,
    dloss: R,
    valid: usize,
    vl: usize,
) {
    dlogits.par_chunks_mut(vl).enumerate().for_each(|(n, d)| {
        let p = &probs[n * vl..(n + 1) * vl];
        let tgt = targets[n] as usize;
        for j in 0..valid {
            let ind = if j + lo == tgt { R::one() } else { R::zero() };
            d[j] = d[j] + (p[j] - ind) * dloss;
        }
    });
}
