//! GPT-2 with its parameters, gradients and activations in flat buffers addressed through the
//! offset tables of [`layout`]; [`block`] holds one transformer block's forward / backward and
//! [`tp`] the tensor-parallel group the model calls.

mod block;
mod layout;
mod tp;

use std::ops::Range;

use exatrain_parallel::comm::CommError;
use exatrain_spec::Recompute;

pub use layout::{ActLayout, BlockActs, BlockParams, GptShape, GradLayout, ParamLayout, Part};
pub use tp::{Alone, TpGroup};

use block::{block_backward, block_forward};
use layout::{parts, Dims};
use tp::{norm_grads_before, seq_gather, seq_reduce, sum_norm_grads};

use crate::kernels::*;
use crate::Real;

/// One in-flight microbatch: its activations' layout and its tokens.
struct Slot {
    act: ActLayout,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

/// A GPT-2 model (or one [`Part`] of it) with its buffers.
pub struct Gpt<R: Real> {
    pub shape: GptShape,
    pub layout: ParamLayout,
    /// All parameters, in `layout` order.
    pub params: Vec<R>,
    /// Their gradients, same layout.
    pub grads: Vec<R>,
    /// slots × kept activations, then the recompute scratch shared by all slots
    acts: Vec<R>,
    slots: Vec<Slot>,
    scratch_len: usize,
    /// the backward workspace ([`GradLayout`])
    dacts: Vec<R>,
    grad_layout: Option<GradLayout>,
    /// which `dres` buffer holds the input gradient after a backward
    dinput: usize,
}

impl<R: Real> Gpt<R> {
    /// GPT-2 initialization: N(0, 0.02) weights, residual projections scaled by 1/√(2L), zero
    /// biases, unit LayerNorm gains.
    pub fn new(shape: GptShape, seed: u64) -> Self {
        let layout = ParamLayout::new(&shape);
        let mut params = vec![R::zero(); layout.total];
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut normal = |std: f64| {
            // Box-Muller
            let (u1, u2) = (rng.f64().max(1e-300), rng.f64());
            R::of(std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos())
        };
        let resid = 0.02 / (2.0 * shape.layers as f64).sqrt();
        let mut fill = |r: &Range<usize>, std: f64, params: &mut [R]| {
            for x in &mut params[r.clone()] {
                *x = normal(std);
            }
        };
        fill(&layout.wte, 0.02, &mut params);
        fill(&layout.wpe, 0.01, &mut params);
        for b in &layout.blocks {
            fill(&b.qkvw, 0.02, &mut params);
            fill(&b.projw, resid, &mut params);
            fill(&b.fcw, 0.02, &mut params);
            fill(&b.fcprojw, resid, &mut params);
            for r in [&b.ln1w, &b.ln2w] {
                params[r.clone()].iter_mut().for_each(|x| *x = R::one());
            }
        }
        params[layout.lnfw.clone()].iter_mut().for_each(|x| *x = R::one());
        // padded vocabulary rows are never used: keep them zero
        let (c, v) = (shape.channels, shape.vocab);
        params[layout.wte.start + v * c..layout.wte.end]
            .iter_mut()
            .for_each(|x| *x = R::zero());
        Self::with_params(shape, layout, params)
    }

    /// One part of the model initialised exactly as [`Gpt::new`] initialises the whole (so
    /// every layout starts from the same weights).
    pub fn new_part(shape: GptShape, part: &Part, seed: u64) -> Self {
        let whole = Self::new(shape, seed);
        let layout = ParamLayout::of_part(&shape, part);
        let mut params = vec![R::zero(); layout.total];
        for (l, w, n) in layout.shard_runs(&shape) {
            params[l..l + n].copy_from_slice(&whole.params[w..w + n]);
        }
        Self::with_params(shape, layout, params)
    }

    fn with_params(shape: GptShape, layout: ParamLayout, params: Vec<R>) -> Self {
        Gpt {
            shape,
            grads: vec![R::zero(); layout.total],
            layout,
            params,
            acts: Vec::new(),
            slots: Vec::new(),
            scratch_len: 0,
            dacts: Vec::new(),
            grad_layout: None,
            dinput: 0,
        }
    }

    pub fn part(&self) -> &Part {
        &self.layout.part
    }

    /// Bytes of the activations kept from forward for backward over all slots (the planner's
    /// `activations`), and under full recomputation the block being recomputed.
    pub fn activation_bytes(&self) -> usize {
        // under full recomputation the scratch is the one block being recomputed: the planner
        // counts it as activations
        let scratch = if self.layout.part.recompute == Recompute::Full {
            0
        } else {
            self.scratch_len
        };
        (self.acts.len() - scratch) * std::mem::size_of::<R>()
    }

    /// Bytes of the backward workspace and the recompute scratch: the head's and one block's
    /// activation gradients plus the residual gradient (not kept across the step; the planner
    /// does not count it).
    pub fn workspace_bytes(&self) -> usize {
        let scratch = if self.layout.part.recompute == Recompute::Full {
            0
        } else {
            self.scratch_len
        };
        (self.dacts.len() + scratch) * std::mem::size_of::<R>()
    }

    /// Size the buffers for `slots` microbatches of (B, T) in flight at once.
    pub fn prepare(&mut self, b: usize, t: usize, slots: usize) {
        let same = self.slots.len() == slots && self.slots.first().is_some_and(|s| s.act.b == b && s.act.t == t);
        if same {
            return;
        }
        let part = self.layout.part.clone();
        let (_, kept, scratch) = ActLayout::build(&self.shape, &part, b, t, 0, 0);
        self.slots = (0..slots)
            .map(|i| Slot {
                act: ActLayout::build(&self.shape, &part, b, t, i * kept, slots * kept).0,
                tokens: Vec::new(),
                targets: Vec::new(),
            })
            .collect();
        self.acts = vec![R::zero(); slots * kept + scratch];
        self.scratch_len = scratch;
        let gl = GradLayout::new(&self.shape, &part, b, t);
        self.dacts = vec![R::zero(); gl.total];
        self.grad_layout = Some(gl);
    }

    /// Forward a (B, T) microbatch of token ids and next-token targets through the whole model;
    /// the mean loss.
    pub fn forward(&mut self, tokens: &[u32], targets: &[u32], b: usize, t: usize) -> R {
        assert!(
            t <= self.shape.max_seq && tokens.len() == b * t && targets.len() == b * t,
            "shapes checked by the caller"
        );
        self.prepare(b, t, 1);
        let loss = self.forward_part(0, &Alone, tokens, targets, None);
        loss.expect("no communication").expect("the whole model has a head")
    }

    /// Backward of the last [`Gpt::forward`], accumulating `scale ×` the gradient of its mean
    /// loss into `grads` (scale = 1 / microbatches for gradient accumulation).
    pub fn backward(&mut self, scale: R) {
        self.backward_part(0, &Alone, None, scale, &mut |_, _| Ok(()))
            .expect("no communication");
    }

    /// Forward one microbatch through this part into `slot`: from the tokens if the part holds
    /// the embedding, else from `input` [R, C] (R = N/tp rows under sequence parallelism, else
    /// N). Returns the mean loss if it holds the head.
    pub fn forward_part(
        &mut self,
        slot: usize,
        tp: &dyn TpGroup<R>,
        tokens: &[u32],
        targets: &[u32],
        input: Option<&[R]>,
    ) -> Result<Option<R>, CommError> {
        let d = Dims::new(&self.shape, &self.layout.part);
        let part = &self.layout.part;
        let (first, sp) = (part.tp_rank == 0, part.sp);
        let sl = &mut self.slots[slot];
        sl.tokens.clear();
        sl.tokens.extend_from_slice(tokens);
        sl.targets.clear();
        sl.targets.extend_from_slice(targets);
        let la = &sl.act;
        let (b, t) = (la.b, la.t);
        let p = &self.params;
        let pl = &self.layout;
        let a = &mut self.acts;
        if part.embed {
            let [full, out] = parts(a, [&la.enc_full, &la.encoded]);
            let wpe = first.then(|| &p[pl.wpe.clone()]);
            encoder_forward(full, tokens, &p[pl.wte.clone()], d.vlo, wpe, t, d.c);
            seq_reduce(tp, sp, full, out)?; // g: the vocabulary shards' partial embeddings
        } else {
            a[la.encoded.clone()].copy_from_slice(input.expect("a part without the embedding gets its input"));
        }
        for l in 0..pl.blocks.len() {
            block_forward(
                p,
                &pl.blocks[l],
                a,
                &la.blocks[l],
                &la.block_input(l),
                &d,
                b,
                t,
                first,
                sp,
                tp,
            )?;
        }
        if !part.head {
            return Ok(None);
        }
        let x = la.output();
        let [lnf, mf, rf, lnf_full, logits, probs, losses, cmax, cstats, x] = parts(
            a,
            [
                &la.lnf,
                &la.lnf_mean,
                &la.lnf_rstd,
                &la.lnf_full,
                &la.logits,
                &la.probs,
                &la.losses,
                &la.ce_max,
                &la.ce_stats,
                &x,
            ],
        );
        layernorm_forward(lnf, mf, rf, x, &p[pl.lnfw.clone()], &p[pl.lnfb.clone()], d.c);
        seq_gather(tp, sp, lnf, lnf_full)?; // f
        matmul_forward(logits, lnf_full, &p[pl.wte.clone()], None, d.c, d.vl);
        crossentropy_max(cmax, logits, d.valid, d.vl);
        tp.max_stats(cmax)?;
        crossentropy_exp(probs, cstats, logits, cmax, targets, d.vlo, d.valid, d.vl);
        tp.sum_stats(cstats)?;
        crossentropy_normalize(probs, losses, cstats, d.vl);
        let n = R::of((b * t) as f64);
        Ok(Some(losses.iter().copied().sum::<R>() / n))
    }

    /// The output [R, C] of the last forward into `slot` (what the next stage receives).
    pub fn output(&self, slot: usize) -> &[R] {
        &self.acts[self.slots[slot].act.output()]
    }

    /// Backward of the forward in `slot`, accumulating `scale ×` the gradient of its mean loss
    /// into `grads`: from the loss if the part holds the head, else from `dout` [R, C], the
    /// gradient at its output. Afterwards [`Gpt::input_grad`] holds the gradient at its input.
    /// `ready(grads, from)` is called as soon as this microbatch's gradients of every parameter
    /// at index ≥ `from` are complete (after the head, after each block, `from = 0` last), so
    /// that their data-parallel reduction can start while backward goes on.
    pub fn backward_part(
        &mut self,
        slot: usize,
        tp: &dyn TpGroup<R>,
        dout: Option<&[R]>,
        scale: R,
        ready: &mut dyn FnMut(&[R], usize) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let d = Dims::new(&self.shape, &self.layout.part);
        let part = self.layout.part.clone();
        let (first, sp) = (part.tp_rank == 0, part.sp);
        let sl = &self.slots[slot];
        let la = &sl.act;
        let (b, t) = (la.b, la.t);
        let p = &self.params;
        let pl = &self.layout;
        let g = &mut self.grads;
        let gl = self.grad_layout.as_ref().expect("prepared");
        let dd = &mut self.dacts;
        let c = d.c;
        let mut cur = 0;
        dd[gl.dres[cur].clone()].iter_mut().for_each(|x| *x = R::zero());
        if part.head {
            let before = norm_grads_before(g, sp, &[pl.lnfw.start..pl.lnfb.end]);
            {
                // the head's GEMM input again (sequence parallel: gathered again)
                let [lnf, lnf_full] = parts(&mut self.acts, [&la.lnf, &la.lnf_full]);
                seq_gather(tp, sp, lnf, lnf_full)?;
            }
            let a = &self.acts;
            dd[gl.dlogits.start..gl.dlnf.end]
                .iter_mut()
                .for_each(|x| *x = R::zero());
            let dloss = scale / R::of((b * t) as f64);
            let [dlogits, dlnf_full, dlnf, dx] = parts(dd, [&gl.dlogits, &gl.dlnf_full, &gl.dlnf, &gl.dres[cur]]);
            crossentropy_backward(dlogits, &a[la.probs.clone()], &sl.targets, d.vlo, dloss, d.valid, d.vl);
            let [dwte, dlnfw, dlnfb] = parts(g, [&pl.wte, &pl.lnfw, &pl.lnfb]);
            let (lnf_full, wte) = (&a[la.lnf_full.clone()], &p[pl.wte.clone()]);
            matmul_backward(dlnf_full, dwte, None, dlogits, lnf_full, wte, c, d.vl);
            seq_reduce(tp, sp, dlnf_full, dlnf)?; // f's backward: the head's input gradient
            let (mean, rstd) = (&a[la.lnf_mean.clone()], &a[la.lnf_rstd.clone()]);
            let x = &a[la.output()];
            layernorm_backward(dx, dlnfw, dlnfb, dlnf, x, &p[pl.lnfw.clone()], mean, rstd, c);
            sum_norm_grads(tp, g, &before)?;
            ready(g, pl.lnfw.start)?;
        } else {
            dd[gl.dres[cur].clone()].copy_from_slice(dout.expect("a part without the head gets its output gradient"));
        }
        for l in (0..pl.blocks.len()).rev() {
            let (bp, ba) = (&pl.blocks[l], &la.blocks[l]);
            let before = norm_grads_before(g, sp, &[bp.ln1w.start..bp.ln1b.end, bp.ln2w.start..bp.ln2b.end]);
            let input = la.block_input(l);
            match part.recompute {
                Recompute::Full => block_forward(p, bp, &mut self.acts, ba, &input, &d, b, t, first, sp, tp)?,
                Recompute::Selective => {
                    // the attention core again, into its scratch (atty is rewritten with the same values)
                    let [atty, att, qkv] = parts(&mut self.acts, [&ba.atty, &ba.att, &ba.qkv]);
                    attention_forward(atty, att, qkv, b, t, d.cl, d.nh);
                }
                Recompute::None => {}
            }
            block_backward(p, bp, g, &mut self.acts, ba, &input, dd, gl, cur, &d, b, t, sp, tp)?;
            cur = 1 - cur;
            sum_norm_grads(tp, g, &before)?;
            ready(g, bp.ln1w.start)?; // this block's gradients are final for the microbatch
        }
        if part.embed {
            let [dwte, dwpe] = parts(g, [&pl.wte, &pl.wpe]);
            let [dres, dfull] = parts(dd, [&gl.dres[cur], &gl.denc_full]);
            seq_gather(tp, sp, dres, dfull)?; // g's backward
                                              // every rank gets the same dwpe (its input gradient is whole), so the replicas agree
            encoder_backward(dwte, d.vlo, Some(dwpe), dfull, &sl.tokens, t, c);
        }
        ready(g, 0)?;
        self.dinput = cur;
        Ok(())
    }

    /// The gradient at the part's input [N, C] after [`Gpt::backward_part`] (what the previous
    /// stage receives).
    pub fn input_grad(&self) -> &[R] {
        &self.dacts[self.grad_layout.as_ref().expect("after backward").dres[self.dinput].clone()]
    }

    pub fn zero_grad(&mut self) {
        self.grads.iter_mut().for_each(|x| *x = R::zero());
    }

    /// Logits of the last forward, [B·T, Vp/tp] (valid until the next forward or backward).
    pub fn logits(&self) -> &[R] {
        &self.acts[self.slots[0].act.logits.clone()]
    }
}
