//! One transformer block's forward and backward over a (B, T) microbatch: the kernel pairs in
//! order, with the tensor-parallel f / g at the column- and row-parallel GEMMs, over any
//! [`Backend`].

use std::ops::Range;

use exatrain_parallel::comm::CommError;

use super::layout::{BlockActs, BlockParams, Dims, GradLayout};
use super::tp::{kv_gather, kv_scatter, seq_gather, seq_reduce, TpGroup};
use crate::backend::Backend;
use crate::flash::KeyValues;

/// One block's forward over a (B, T) microbatch, reading `input` and writing the block's
/// activations; a row-parallel layer's bias is added by tp rank 0 (`first`) only, before the
/// reduction sums the partial products.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_forward<B: Backend>(
    be: &B,
    p: &B::Buf,
    bp: &BlockParams,
    a: &mut B::Buf,
    ba: &BlockActs,
    input: &Range<usize>,
    d: &Dims,
    b: usize,
    t: usize,
    first: bool,
    sp: bool,
    tp: &dyn TpGroup<B::R>,
) -> Result<(), CommError> {
    let [mut ln1, m1, r1, mut ln1f, mut qkv, att, mut kv, mut atty, mut apf, mut attproj, mut res2, mut ln2, m2, r2, mut ln2f, mut fch, mut fchg, mut fpf, mut fcproj, res3, x] =
        B::parts(
            a,
            [
                &ba.ln1,
                &ba.ln1_mean,
                &ba.ln1_rstd,
                &ba.ln1_full,
                &ba.qkv,
                &ba.att,
                &ba.kv,
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
    let w = |r: &Range<usize>| B::view(p, r);
    let bias = |r: &Range<usize>| first.then(|| B::view(p, r));
    let c = d.c;
    let x = B::read(&x);
    be.layernorm_forward(B::reborrow(&mut ln1), m1, r1, x, w(&bp.ln1w), w(&bp.ln1b), c);
    seq_gather(be, tp, sp, B::read(&ln1), B::reborrow(&mut ln1f))?; // f
    be.matmul_forward(
        B::reborrow(&mut qkv),
        B::read(&ln1f),
        w(&bp.qkvw),
        Some(w(&bp.qkvb)),
        c,
        3 * d.cl,
    );
    if d.flash {
        let at = key_values(d, t);
        let kv = if d.cp > 1 {
            kv_gather(be, tp, (b, t, d.cl, d.cp), B::read(&qkv), B::reborrow(&mut kv))?;
            Some(B::read(&kv))
        } else {
            None
        };
        be.flash_attention_forward(B::reborrow(&mut atty), att, B::read(&qkv), kv, &at, b, d.cl, d.nh);
    } else {
        be.attention_forward(B::reborrow(&mut atty), att, B::read(&qkv), b, t, d.cl, d.nh);
    }
    let (atty, projb) = (B::read(&atty), bias(&bp.projb));
    be.matmul_forward(B::reborrow(&mut apf), atty, w(&bp.projw), projb, d.cl, c);
    seq_reduce(be, tp, sp, apf, B::reborrow(&mut attproj))?; // g
    be.residual_forward(B::reborrow(&mut res2), x, B::read(&attproj));
    let res2 = B::read(&res2);
    be.layernorm_forward(B::reborrow(&mut ln2), m2, r2, res2, w(&bp.ln2w), w(&bp.ln2b), c);
    seq_gather(be, tp, sp, B::read(&ln2), B::reborrow(&mut ln2f))?; // f
    be.matmul_forward(
        B::reborrow(&mut fch),
        B::read(&ln2f),
        w(&bp.fcw),
        Some(w(&bp.fcb)),
        c,
        d.f,
    );
    be.gelu_forward(B::reborrow(&mut fchg), B::read(&fch));
    let (fchg, fcprojb) = (B::read(&fchg), bias(&bp.fcprojb));
    be.matmul_forward(B::reborrow(&mut fpf), fchg, w(&bp.fcprojw), fcprojb, d.f, c);
    seq_reduce(be, tp, sp, fpf, B::reborrow(&mut fcproj))?; // g
    be.residual_forward(res3, res2, B::read(&fcproj));
    Ok(())
}

/// Backward of one block over the microbatch whose activations `ba` holds (recomputed already
/// where the part recomputes), accumulating its parameters' gradients into `g` and the
/// gradient at its input into `gl.dres[1 - cur]`, from the gradient at its output in
/// `gl.dres[cur]`. The column-parallel GEMMs' inputs are gathered again under sequence
/// parallelism (they are kept as this rank's rows only).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_backward<B: Backend>(
    be: &B,
    p: &B::Buf,
    bp: &BlockParams,
    g: &mut B::Buf,
    a: &mut B::Buf,
    ba: &BlockActs,
    input: &Range<usize>,
    dd: &mut B::Buf,
    gl: &GradLayout,
    cur: usize,
    d: &Dims,
    b: usize,
    t: usize,
    sp: bool,
    tp: &dyn TpGroup<B::R>,
) -> Result<(), CommError> {
    let c = d.c;
    {
        // the column-parallel GEMMs' inputs again (sequence parallel: gathered again)
        let [ln1, ln1_full, ln2, ln2_full, qkv, kv] =
            B::parts(a, [&ba.ln1, &ba.ln1_full, &ba.ln2, &ba.ln2_full, &ba.qkv, &ba.kv]);
        seq_gather(be, tp, sp, B::read(&ln2), ln2_full)?;
        seq_gather(be, tp, sp, B::read(&ln1), ln1_full)?;
        if d.flash && d.cp > 1 && !d.full {
            // the whole sequence's keys and values again (full recomputation's forward just
            // gathered them)
            kv_gather(be, tp, (b, t, d.cl, d.cp), B::read(&qkv), kv)?;
        }
    }
    let a = &*a;
    // this block's scratch and the input gradient start from zero (kernels accumulate)
    be.zero(dd, &gl.block_scratch());
    be.zero(dd, &gl.dres[1 - cur]);
    let [mut dln1_full, mut dln1, mut dqkv, mut datty, mut dattproj_full, mut dattproj, mut dres2, mut dln2_full, mut dln2, mut dfch, mut dfchg, mut dfcproj_full, mut dfcproj, mut dkv, dres3, mut dx] =
        B::parts(
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
                &gl.dkv,
                &gl.dres[cur],
                &gl.dres[1 - cur],
            ],
        );
    let [dln1w, dln1b, dqkvw, dqkvb, dprojw, dprojb, dln2w, dln2b, dfcw, dfcb, dfcprojw, dfcprojb] = B::parts(
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
    let w = |r: &Range<usize>| B::view(p, r);
    let x = |r: &Range<usize>| B::view(a, r);
    be.residual_backward(B::reborrow(&mut dres2), B::reborrow(&mut dfcproj), B::read(&dres3));
    seq_gather(be, tp, sp, B::read(&dfcproj), B::reborrow(&mut dfcproj_full))?; // g's backward
    let (fchg, fcprojw) = (x(&ba.fch_gelu), w(&bp.fcprojw));
    be.matmul_backward(
        B::reborrow(&mut dfchg),
        dfcprojw,
        Some(dfcprojb),
        B::read(&dfcproj_full),
        fchg,
        fcprojw,
        d.f,
        c,
    );
    be.gelu_backward(B::reborrow(&mut dfch), x(&ba.fch), B::read(&dfchg));
    let (ln2_full, fcw) = (x(&ba.ln2_full), w(&bp.fcw));
    be.matmul_backward(
        B::reborrow(&mut dln2_full),
        dfcw,
        Some(dfcb),
        B::read(&dfch),
        ln2_full,
        fcw,
        c,
        d.f,
    );
    seq_reduce(be, tp, sp, B::reborrow(&mut dln2_full), B::reborrow(&mut dln2))?; // f's backward
    let (m2, r2) = (x(&ba.ln2_mean), x(&ba.ln2_rstd));
    let (res2, ln2w) = (x(&ba.res2), w(&bp.ln2w));
    be.layernorm_backward(
        B::reborrow(&mut dres2),
        dln2w,
        dln2b,
        B::read(&dln2),
        res2,
        ln2w,
        m2,
        r2,
        c,
    );
    be.residual_backward(B::reborrow(&mut dx), B::reborrow(&mut dattproj), B::read(&dres2));
    seq_gather(be, tp, sp, B::read(&dattproj), B::reborrow(&mut dattproj_full))?; // g's backward
    let (atty, projw) = (x(&ba.atty), w(&bp.projw));
    be.matmul_backward(
        B::reborrow(&mut datty),
        dprojw,
        Some(dprojb),
        B::read(&dattproj_full),
        atty,
        projw,
        d.cl,
        c,
    );
    let (qkv, att) = (x(&ba.qkv), x(&ba.att));
    if d.flash {
        let at = key_values(d, t);
        let (out, kv) = (x(&ba.atty), (d.cp > 1).then(|| x(&ba.kv)));
        let dkv_mut = (d.cp > 1).then(|| B::reborrow(&mut dkv));
        be.flash_attention_backward(
            B::reborrow(&mut dqkv),
            dkv_mut,
            B::read(&datty),
            out,
            att,
            qkv,
            kv,
            &at,
            b,
            d.cl,
            d.nh,
        );
        if d.cp > 1 {
            kv_scatter(be, tp, (b, t, d.cl, d.cp), B::read(&dkv), B::reborrow(&mut dqkv))?;
        }
    } else {
        be.attention_backward(B::reborrow(&mut dqkv), B::read(&datty), qkv, att, b, t, d.cl, d.nh);
    }
    let (ln1_full, qkvw) = (x(&ba.ln1_full), w(&bp.qkvw));
    be.matmul_backward(
        B::reborrow(&mut dln1_full),
        dqkvw,
        Some(dqkvb),
        B::read(&dqkv),
        ln1_full,
        qkvw,
        c,
        3 * d.cl,
    );
    seq_reduce(be, tp, sp, dln1_full, B::reborrow(&mut dln1))?; // f's backward
    let (m1, r1) = (x(&ba.ln1_mean), x(&ba.ln1_rstd));
    be.layernorm_backward(dx, dln1w, dln1b, B::read(&dln1), x(input), w(&bp.ln1w), m1, r1, c);
    Ok(())
}

/// Which keys the rank's T query rows see: its own rows without context parallelism, else the
/// whole sequence's (cp·T rows, gathered) with its rows at their global positions.
fn key_values(d: &Dims, t: usize) -> KeyValues {
    if d.cp > 1 {
        let tk = d.cp * t;
        KeyValues::gathered(tk, d.cl, crate::flash::cp_positions(tk, d.cp, d.cp_rank))
    } else {
        KeyValues::own(t, d.cl)
    }
}
