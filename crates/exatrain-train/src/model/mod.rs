//! GPT-2 with its parameters, gradients and activations in flat buffers addressed through the
//! offset tables of [`layout`], written once over a [`Backend`]; [`block`] holds one
//! transformer block's forward / backward and [`tp`] the tensor-parallel group the model calls.

mod block;
mod layout;
mod tp;

use std::ops::Range;

use exatrain_parallel::comm::CommError;
use exatrain_spec::Recompute;

pub(crate) use layout::parts;
pub use layout::{ActLayout, BlockActs, BlockParams, GptShape, GradLayout, ParamLayout, Part};
pub use tp::{Alone, TpGroup};

use block::{block_backward, block_forward};
use layout::Dims;
use tp::{norm_grads_before, seq_gather, seq_reduce, sum_norm_grads};

use crate::backend::{Backend, Cpu};
use crate::Real;

/// One in-flight microbatch: its activations' layout and its tokens.
struct Slot {
    act: ActLayout,
    tokens: Vec<u32>,
    targets: Vec<u32>,
}

/// A GPT-2 model (or one [`Part`] of it) on the host, in `R`.
pub type Gpt<R> = Model<Cpu<R>>;

/// Called by [`Model::backward_part`] with the backend, the gradients and the first parameter
/// index whose gradients are complete.
pub type Ready<'a, B> = dyn FnMut(&B, &<B as Backend>::Buf, usize) -> Result<(), CommError> + 'a;

/// A GPT-2 model (or one [`Part`] of it) with its buffers on backend `B`.
pub struct Model<B: Backend> {
    pub be: B,
    pub shape: GptShape,
    pub layout: ParamLayout,
    /// All parameters, in `layout` order.
    pub params: B::Buf,
    /// Their gradients, same layout.
    pub grads: B::Buf,
    /// slots × kept activations, then the recompute scratch shared by all slots
    acts: B::Buf,
    slots: Vec<Slot>,
    scratch_len: usize,
    /// the backward workspace ([`GradLayout`])
    dacts: B::Buf,
    grad_layout: Option<GradLayout>,
    /// which `dres` buffer holds the input gradient after a backward
    dinput: usize,
}

/// GPT-2 initialization on the host: N(0, 0.02) weights, residual projections scaled by
/// 1/√(2L), zero biases, unit LayerNorm gains.
fn init_params<R: Real>(shape: &GptShape, seed: u64) -> (ParamLayout, Vec<R>) {
    let layout = ParamLayout::new(shape);
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
    (layout, params)
}

impl<R: Real> Gpt<R> {
    /// The whole model on the host, initialised as [`init_params`] does.
    pub fn new(shape: GptShape, seed: u64) -> Self {
        Model::new_on(Cpu::default(), shape, seed)
    }

    /// One part of the model on the host, initialised exactly as [`Gpt::new`] initialises the
    /// whole (so every layout starts from the same weights).
    pub fn new_part(shape: GptShape, part: &Part, seed: u64) -> Self {
        Model::init(Cpu::default(), shape, part, seed)
    }
}

impl<B: Backend> Model<B> {
    /// The whole model on backend `be`, initialised as [`Gpt::new`] initialises it.
    pub fn new_on(be: B, shape: GptShape, seed: u64) -> Self {
        let (layout, params) = init_params(&shape, seed);
        Model::with_params(be, shape, layout, params)
    }

    /// One part of the model on backend `be`, initialised exactly as the whole model is (so
    /// every layout and every backend starts from the same weights).
    pub fn init(be: B, shape: GptShape, part: &Part, seed: u64) -> Self {
        let (whole_layout, whole) = init_params::<B::R>(&shape, seed);
        debug_assert_eq!(whole.len(), whole_layout.total);
        let layout = ParamLayout::of_part(&shape, part);
        let mut params = vec![<B::R as num_traits::Zero>::zero(); layout.total];
        for (l, w, n) in layout.shard_runs(&shape) {
            params[l..l + n].copy_from_slice(&whole[w..w + n]);
        }
        Self::with_params(be, shape, layout, params)
    }

    /// The model of `layout` holding `params` (host values, in `layout` order) on `be`.
    pub fn with_params(be: B, shape: GptShape, layout: ParamLayout, params: Vec<B::R>) -> Self {
        Model {
            grads: be.alloc(layout.total),
            params: be.upload(params),
            shape,
            layout,
            acts: be.alloc(0),
            slots: Vec::new(),
            scratch_len: 0,
            dacts: be.alloc(0),
            grad_layout: None,
            dinput: 0,
            be,
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
        (B::len(&self.acts) - scratch) * std::mem::size_of::<B::R>()
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
        (B::len(&self.dacts) + scratch) * std::mem::size_of::<B::R>()
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
        self.acts = self.be.alloc(slots * kept + scratch);
        self.scratch_len = scratch;
        let gl = GradLayout::new(&self.shape, &part, b, t);
        self.dacts = self.be.alloc(gl.total);
        self.grad_layout = Some(gl);
    }

    /// Forward a (B, T) microbatch of token ids and next-token targets through the whole model;
    /// the mean loss.
    pub fn forward(&mut self, tokens: &[u32], targets: &[u32], b: usize, t: usize) -> Result<B::R, CommError> {
        assert!(
            t <= self.shape.max_seq && tokens.len() == b * t && targets.len() == b * t,
            "shapes checked by the caller"
        );
        self.prepare(b, t, 1);
        let loss = self.forward_part(0, &Alone, tokens, targets, None)?;
        Ok(loss.expect("the whole model has a head"))
    }

    /// Backward of the last [`Model::forward`], accumulating `scale ×` the gradient of its mean
    /// loss into `grads` (scale = 1 / microbatches for gradient accumulation).
    pub fn backward(&mut self, scale: B::R) -> Result<(), CommError> {
        self.backward_part(0, &Alone, None, scale, &mut |_, _, _| Ok(()))
    }

    /// Forward one microbatch through this part into `slot`: from the tokens if the part holds
    /// the embedding, else from `input` [R, C] (R = N/tp rows under sequence parallelism, else
    /// N). Returns the mean loss if it holds the head.
    pub fn forward_part(
        &mut self,
        slot: usize,
        tp: &dyn TpGroup<B::R>,
        tokens: &[u32],
        targets: &[u32],
        input: Option<&[B::R]>,
    ) -> Result<Option<B::R>, CommError> {
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
        let be = &self.be;
        let p = &self.params;
        let pl = &self.layout;
        let a = &mut self.acts;
        if part.embed {
            let [mut full, out, mut rows] = B::parts(a, [&la.enc_full, &la.encoded, &la.enc_pos]);
            let wpe = match (first, d.cp > 1) {
                (false, _) => None,
                (true, false) => Some(B::view(p, &pl.wpe)),
                (true, true) => {
                    // the position rows of this rank's tokens
                    let pos = crate::flash::cp_positions(d.cp * t, d.cp, d.cp_rank);
                    be.with_host(B::view(p, &pl.wpe), |w| {
                        be.with_host_mut(B::reborrow(&mut rows), |r| {
                            for (i, q) in pos.iter().enumerate() {
                                r[i * d.c..(i + 1) * d.c].copy_from_slice(&w[q * d.c..(q + 1) * d.c]);
                            }
                        })
                    });
                    Some(B::read(&rows))
                }
            };
            be.encoder_forward(B::reborrow(&mut full), tokens, B::view(p, &pl.wte), d.vlo, wpe, t, d.c);
            seq_reduce(be, tp, sp, full, out)?; // g: the vocabulary shards' partial embeddings
        } else {
            let input = input.expect("a part without the embedding gets its input");
            let [enc] = B::parts(a, [&la.encoded]);
            be.with_host_mut(enc, |e| e.copy_from_slice(input));
        }
        for l in 0..pl.blocks.len() {
            block_forward(
                be,
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
            be.check()?;
            return Ok(None);
        }
        let x = la.output();
        let [mut lnf, mf, rf, mut lnf_full, mut logits, mut probs, mut losses, mut cmax, mut cstats, x] = B::parts(
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
        let (lnfw, lnfb) = (B::view(p, &pl.lnfw), B::view(p, &pl.lnfb));
        be.layernorm_forward(B::reborrow(&mut lnf), mf, rf, B::read(&x), lnfw, lnfb, d.c);
        seq_gather(be, tp, sp, B::read(&lnf), B::reborrow(&mut lnf_full))?; // f
        let wte = B::view(p, &pl.wte);
        be.matmul_forward(B::reborrow(&mut logits), B::read(&lnf_full), wte, None, d.c, d.vl);
        be.crossentropy_max(B::reborrow(&mut cmax), B::read(&logits), d.valid, d.vl);
        if tp.size() > 1 {
            be.with_host_mut(B::reborrow(&mut cmax), |m| tp.max_stats(m))?;
        }
        let (lg, mx) = (B::read(&logits), B::read(&cmax));
        be.crossentropy_exp(
            B::reborrow(&mut probs),
            B::reborrow(&mut cstats),
            lg,
            mx,
            targets,
            d.vlo,
            d.valid,
            d.vl,
        );
        if tp.size() > 1 {
            be.with_host_mut(B::reborrow(&mut cstats), |s| tp.sum_stats(s))?;
        }
        be.crossentropy_normalize(probs, B::reborrow(&mut losses), B::read(&cstats), d.vl);
        be.check()?;
        let n = B::R::of((b * t) as f64);
        Ok(Some(
            be.with_host(B::read(&losses), |l| l.iter().copied().sum::<B::R>()) / n,
        ))
    }

    /// The output [R, C] of the last forward into `slot` (what the next stage receives).
    pub fn output(&self, slot: usize) -> B::Ref<'_> {
        B::view(&self.acts, &self.slots[slot].act.output())
    }

    /// Backward of the forward in `slot`, accumulating `scale ×` the gradient of its mean loss
    /// into `grads`: from the loss if the part holds the head, else from `dout` [R, C], the
    /// gradient at its output. Afterwards [`Model::input_grad`] holds the gradient at its input.
    /// `ready(backend, grads, from)` is called as soon as this microbatch's gradients of every parameter
    /// at index ≥ `from` are complete (after the head, after each block, `from = 0` last), so
    /// that their data-parallel reduction can start while backward goes on.
    pub fn backward_part(
        &mut self,
        slot: usize,
        tp: &dyn TpGroup<B::R>,
        dout: Option<&[B::R]>,
        scale: B::R,
        ready: &mut Ready<'_, B>,
    ) -> Result<(), CommError> {
        let d = Dims::new(&self.shape, &self.layout.part);
        let part = self.layout.part.clone();
        let (first, sp) = (part.tp_rank == 0, part.sp);
        let sl = &self.slots[slot];
        let la = &sl.act;
        let (b, t) = (la.b, la.t);
        let be = &self.be;
        let p = &self.params;
        let pl = &self.layout;
        let g = &mut self.grads;
        let gl = self.grad_layout.as_ref().expect("prepared");
        let dd = &mut self.dacts;
        let c = d.c;
        let mut cur = 0;
        be.zero(dd, &gl.dres[cur]);
        if part.head {
            let before = norm_grads_before(be, g, sp, &[pl.lnfw.start..pl.lnfb.end]);
            {
                // the head's GEMM input again (sequence parallel: gathered again)
                let [lnf, lnf_full] = B::parts(&mut self.acts, [&la.lnf, &la.lnf_full]);
                seq_gather(be, tp, sp, B::read(&lnf), lnf_full)?;
            }
            let a = &self.acts;
            be.zero(dd, &(gl.dlogits.start..gl.dlnf.end));
            let dloss = scale / B::R::of((b * t) as f64);
            let [mut dlogits, mut dlnf_full, mut dlnf, dx] =
                B::parts(dd, [&gl.dlogits, &gl.dlnf_full, &gl.dlnf, &gl.dres[cur]]);
            let probs = B::view(a, &la.probs);
            be.crossentropy_backward(
                B::reborrow(&mut dlogits),
                probs,
                &sl.targets,
                d.vlo,
                dloss,
                d.valid,
                d.vl,
            );
            let [dwte, dlnfw, dlnfb] = B::parts(g, [&pl.wte, &pl.lnfw, &pl.lnfb]);
            let (lnf_full, wte) = (B::view(a, &la.lnf_full), B::view(p, &pl.wte));
            be.matmul_backward(
                B::reborrow(&mut dlnf_full),
                dwte,
                None,
                B::read(&dlogits),
                lnf_full,
                wte,
                c,
                d.vl,
            );
            seq_reduce(be, tp, sp, dlnf_full, B::reborrow(&mut dlnf))?; // f's backward: the head's input gradient
            let (mean, rstd) = (B::view(a, &la.lnf_mean), B::view(a, &la.lnf_rstd));
            let (x, lnfw) = (B::view(a, &la.output()), B::view(p, &pl.lnfw));
            be.layernorm_backward(dx, dlnfw, dlnfb, B::read(&dlnf), x, lnfw, mean, rstd, c);
            sum_norm_grads(be, tp, g, &before)?;
            ready(be, g, pl.lnfw.start)?;
        } else {
            let dout = dout.expect("a part without the head gets its output gradient");
            let [dres] = B::parts(dd, [&gl.dres[cur]]);
            be.with_host_mut(dres, |x| x.copy_from_slice(dout));
        }
        for l in (0..pl.blocks.len()).rev() {
            let (bp, ba) = (&pl.blocks[l], &la.blocks[l]);
            let before = norm_grads_before(be, g, sp, &[bp.ln1w.start..bp.ln1b.end, bp.ln2w.start..bp.ln2b.end]);
            let input = la.block_input(l);
            match part.recompute {
                Recompute::Full => block_forward(be, p, bp, &mut self.acts, ba, &input, &d, b, t, first, sp, tp)?,
                // flash attention keeps nothing of its core to recompute
                Recompute::Selective if d.flash => {}
                Recompute::Selective => {
                    // the attention core again, into its scratch (atty is rewritten with the same values)
                    let [atty, att, qkv] = B::parts(&mut self.acts, [&ba.atty, &ba.att, &ba.qkv]);
                    be.attention_forward(atty, att, B::read(&qkv), b, t, d.cl, d.nh);
                }
                Recompute::None => {}
            }
            block_backward(be, p, bp, g, &mut self.acts, ba, &input, dd, gl, cur, &d, b, t, sp, tp)?;
            cur = 1 - cur;
            sum_norm_grads(be, tp, g, &before)?;
            ready(be, g, bp.ln1w.start)?; // this block's gradients are final for the microbatch
        }
        if part.embed {
            be.zero(dd, &gl.dwpe);
            let [dwte, dwpe] = B::parts(g, [&pl.wte, &pl.wpe]);
            let [dres, mut dfull, mut drows] = B::parts(dd, [&gl.dres[cur], &gl.denc_full, &gl.dwpe]);
            seq_gather(be, tp, sp, B::read(&dres), B::reborrow(&mut dfull))?; // g's backward
                                                                              // every rank gets the same dwpe (its input gradient is whole), so the replicas agree
            if d.cp > 1 {
                // the rank's position rows, then added at their positions
                be.encoder_backward(
                    dwte,
                    d.vlo,
                    Some(B::reborrow(&mut drows)),
                    B::read(&dfull),
                    &sl.tokens,
                    t,
                    c,
                );
                let pos = crate::flash::cp_positions(d.cp * t, d.cp, d.cp_rank);
                be.with_host(B::read(&drows), |r| {
                    be.with_host_mut(dwpe, |w| {
                        for (i, q) in pos.iter().enumerate() {
                            for (x, y) in w[q * c..(q + 1) * c].iter_mut().zip(&r[i * c..(i + 1) * c]) {
                                *x = *x + *y;
                            }
                        }
                    })
                });
            } else {
                be.encoder_backward(dwte, d.vlo, Some(dwpe), B::read(&dfull), &sl.tokens, t, c);
            }
        }
        be.check()?;
        ready(be, g, 0)?;
        self.dinput = cur;
        Ok(())
    }

    /// The gradient at the part's input [N, C] after [`Model::backward_part`] (what the previous
    /// stage receives).
    pub fn input_grad(&self) -> B::Ref<'_> {
        B::view(
            &self.dacts,
            &self.grad_layout.as_ref().expect("after backward").dres[self.dinput],
        )
    }

    pub fn zero_grad(&mut self) {
        let all = 0..self.layout.total;
        self.be.zero(&mut self.grads, &all);
    }

    /// Logits of the last forward, [B·T, Vp/tp] (valid until the next forward or backward).
    pub fn logits(&self) -> B::Ref<'_> {
        B::view(&self.acts, &self.slots[0].act.logits)
    }
}
