//! One transformer block's forward and backward over a (B, T) microbatch: the kernel pairs in
//! order, with the tensor-parallel f / g at the column- and row-parallel GEMMs.

use std::ops::Range;

use exatrain_parallel::comm::CommError;

use super::layout::{parts, BlockActs, BlockParams, Dims, GradLayout};
use super::tp::{seq_gather, seq_reduce, TpGroup};
use crate::kernels::*;
use crate::Real;

/// One block's forward over a (B, T) microbatch, reading `input` and writing the block's
/// activations; a row-parallel layer's bias is added by tp rank 0 (`first`) only, before the
/// reduction sums the partial products.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_forward<R: Real>(
    p: &[R],
    bp: &BlockParams,
    a: &mut [R],
    ba: &BlockActs,
    input: &Range<usize>,
    d: &Dims,
    b: usize,
    t: usize,
    first: bool,
    sp: bool,
    tp: &dyn TpGroup<R>,
) -> Result<(), CommError> {
    let [ln1, m1, r1, ln1f, qkv, att, atty, apf, attproj, res2, ln2, m2, r2, ln2f, fch, fchg, fpf, fcproj, res3, x] =
        parts(
            a,
            [
                &ba.ln1,
                &ba.ln1_mean,
                &ba.ln1_rstd,
                &ba.ln1_full,
                &ba.qkv,
                &ba.att,
                &ba.atty,
                &ba.attproj_full,
                &ba.attproj,
                &ba.res2,
                &ba.ln2,
                &ba.ln2_mean,
                &ba.ln2_rstd,
                &ba.ln2_full,
                &ba.fch,
                &ba.fch_gelu,
                &ba.fcproj_full,
                &ba.fcproj,
                &ba.res3,
                input,
            ],
        );
    let w = |r: &Range<usize>| &p[r.clone()];
    let bias = |r: &Range<usize>| first.then(|| &p[r.clone()]);
    let c = d.c;
    layernorm_forward(ln1, m1, r1, x, w(&bp.ln1w), w(&bp.ln1b), c);
    seq_gather(tp, sp, ln1, ln1f)?; // f
    matmul_forward(qkv, ln1f, w(&bp.qkvw), Some(w(&bp.qkvb)), c, 3 * d.cl);
    attention_forward(atty, att, qkv, b, t, d.cl, d.nh);
    matmul_forward(apf, atty, w(&bp.projw), bias(&bp.projb), d.cl, c);
    seq_reduce(tp, sp, apf, attproj)?; // g
    residual_forward(res2, x, attproj);
    layernorm_forward(ln2, m2, r2, res2, w(&bp.ln2w), w(&bp.ln2b), c);
    seq_gather(tp, sp, ln2, ln2f)?; // f
    matmul_forward(fch, ln2f, w(&bp.fcw), Some(w(&bp.fcb)), c, d.f);
    gelu_forward(fchg, fch);
    matmul_forward(fpf, fchg, w(&bp.fcprojw), bias(&bp.fcprojb), d.f, c);
    seq_reduce(tp, sp, fpf, fcproj)?; // g
    residual_forward(res3, res2, fcproj);
    Ok(())
}

/// Backward of one block over the microbatch whose activations `ba` holds (recomputed already
/// where the part recomputes), accumulating its parameters' gradients into `g` and the
/// gradient at its input into `gl.dres[1 - cur]`, from the gradient at its output in
/// `gl.dres[cur]`. The column-parallel GEMMs' inputs are gathered again under sequence
/// parallelism (they are kept as this rank's rows only).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_backward<R: Real>(
    p: &[R],
    bp: &BlockParams,
    g: &mut [R],
    a: &mut [R],
    ba: &BlockActs,
    input: &Range<usize>,
    dd: &mut [R],
    gl: &GradLayout,
    cur: usize,
    d: &Dims,
    b: usize,
    t: usize,
    sp: bool,
    tp: &dyn TpGroup<R>,
) -> Result<(), CommError> {
    let c = d.c;
    {
        // the column-parallel GEMMs' inputs again (sequence parallel: gathered again)
        let [ln1, ln1_full, ln2, ln2_full] = parts(a, [&ba.ln1, &ba.ln1_full, &ba.ln2, &ba.ln2_full]);
        seq_gather(tp, sp, ln2, ln2_full)?;
        seq_gather(tp, sp, ln1, ln1_full)?;
    }
    let a = &*a;
    // this block's scratch and the input gradient start from zero (kernels accumulate)
    dd[gl.block_scratch()].iter_mut().for_each(|x| *x = R::zero());
    dd[gl.dres[1 - cur].clone()].iter_mut().for_each(|x| *x = R::zero());
    let [dln1_full, dln1, dqkv, datty, dattproj_full, dattproj, dres2, dln2_full, dln2, dfch, dfchg, dfcproj_full, dfcproj, dres3, dx] =
        parts(
            dd,
            [
                &gl.dln1_full,
                &gl.dln1,
                &gl.dqkv,
                &gl.datty,
                &gl.dattproj_full,
                &gl.dattproj,
                &gl.dres2,
                &gl.dln2_full,
                &gl.dln2,
                &gl.dfch,
                &gl.dfchg,
                &gl.dfcproj_full,
                &gl.dfcproj,
                &gl.dres[cur],
                &gl.dres[1 - cur],
            ],
        );
    let [dln1w, dln1b, dqkvw, dqkvb, dprojw, dprojb, dln2w, dln2b, dfcw, dfcb, dfcprojw, dfcprojb] = parts(
        g,
        [
            &bp.ln1w,
            &bp.ln1b,
            &bp.qkvw,
            &bp.qkvb,
            &bp.projw,
            &bp.projb,
            &bp.ln2w,
            &bp.ln2b,
            &bp.fcw,
            &bp.fcb,
            &bp.fcprojw,
            &bp.fcprojb,
        ],
    );
    let w = |r: &Range<usize>| &p[r.clone()];
    let x = |r: &Range<usize>| &a[r.clone()];
    residual_backward(dres2, dfcproj, dres3);
    seq_gather(tp, sp, dfcproj, dfcproj_full)?; // g's backward
    let (fchg, fcprojw) = (x(&ba.fch_gelu), w(&bp.fcprojw));
    matmul_backward(dfchg, dfcprojw, Some(dfcprojb), dfcproj_full, fchg, fcprojw, d.f, c);
    gelu_backward(dfch, x(&ba.fch), dfchg);
    matmul_backward(dln2_full, dfcw, Some(dfcb), dfch, x(&ba.ln2_full), w(&bp.fcw), c, d.f);
    seq_reduce(tp, sp, dln2_full, dln2)?; // f's backward
    let (m2, r2) = (x(&ba.ln2_mean), x(&ba.ln2_rstd));
    layernorm_backward(dres2, dln2w, dln2b, dln2, x(&ba.res2), w(&bp.ln2w), m2, r2, c);
    residual_backward(dx, dattproj, dres2);
    seq_gather(tp, sp, dattproj, dattproj_full)?; // g's backward
    let (atty, projw) = (x(&ba.atty), w(&bp.projw));
    matmul_backward(datty, dprojw, Some(dprojb), dattproj_full, atty, projw, d.cl, c);
    attention_backward(dqkv, datty, x(&ba.qkv), x(&ba.att), b, t, d.cl, d.nh);
    matmul_backward(
        dln1_full,
        dqkvw,
        Some(dqkvb),
        dqkv,
        x(&ba.ln1_full),
        w(&bp.qkvw),
        c,
        3 * d.cl,
    );
    seq_reduce(tp, sp, dln1_full, dln1)?; // f's backward
    let (m1, r1) = (x(&ba.ln1_mean), x(&ba.ln1_rstd));
    layernorm_backward(dx, dln1w, dln1b, dln1, x(input), w(&bp.ln1w), m1, r1, c);
    Ok(())
}
