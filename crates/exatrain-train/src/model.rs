//! GPT-2 with its parameters, gradients and activations in flat buffers.
//!
//! Parameters are laid out block by block (so a pipeline stage owns a contiguous range and a
//! tensor-parallel shard can be cut per tensor): `wte, wpe, block 0 .. block L-1, lnf`. The
//! offset tables ([`ParamLayout`], [`ActLayout`]) give every tensor's range and, in comments, its
//! shape. Activations are sized for one (B, T) microbatch.

use std::ops::Range;

use exatrain_spec::{Mlp, ModelSpec, Norm, Position, SpecError};

use crate::kernels::*;
use crate::Real;

/// The sizes the trainer needs, from a [`ModelSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptShape {
    /// L
    pub layers: usize,
    /// C
    pub channels: usize,
    /// NH
    pub heads: usize,
    /// F (4C for GPT-2)
    pub ffn: usize,
    /// T, the longest sequence (learned positions)
    pub max_seq: usize,
    /// V
    pub vocab: usize,
    /// Vp ≥ V
    pub padded_vocab: usize,
}

impl GptShape {
    /// The GPT-2 architecture only: GELU MLP, LayerNorm, learned positions, tied head, MHA, biases.
    pub fn from_spec(m: &ModelSpec) -> Result<Self, SpecError> {
        let no = |what: &str| {
            Err(SpecError::new(format!(
                "model {}: the trainer runs GPT-2 blocks only; {what}",
                m.name
            )))
        };
        if m.mlp != Mlp::Gelu {
            return no("mlp must be gelu");
        }
        if m.norm != Norm::Layernorm {
            return no("norm must be layernorm");
        }
        if m.position != Position::Learned {
            return no("position must be learned");
        }
        if !m.tied_embeddings {
            return no("tied_embeddings must be true");
        }
        if m.kv_heads != m.heads || m.head_dim * m.heads != m.hidden {
            return no("kv_heads must equal heads and head_dim = hidden / heads");
        }
        if !m.bias {
            return no("bias must be true");
        }
        Ok(GptShape {
            layers: m.layers as usize,
            channels: m.hidden as usize,
            heads: m.heads as usize,
            ffn: m.ffn_hidden as usize,
            max_seq: m.seq_len as usize,
            vocab: m.vocab as usize,
            padded_vocab: m.padded_vocab as usize,
        })
    }
}

/// One block's tensors in the parameter buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockParams {
    pub ln1w: Range<usize>,    // [C]
    pub ln1b: Range<usize>,    // [C]
    pub qkvw: Range<usize>,    // [3C, C]
    pub qkvb: Range<usize>,    // [3C]
    pub projw: Range<usize>,   // [C, C]
    pub projb: Range<usize>,   // [C]
    pub ln2w: Range<usize>,    // [C]
    pub ln2b: Range<usize>,    // [C]
    pub fcw: Range<usize>,     // [F, C]
    pub fcb: Range<usize>,     // [F]
    pub fcprojw: Range<usize>, // [C, F]
    pub fcprojb: Range<usize>, // [C]
}

/// Every parameter tensor's range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    pub wte: Range<usize>, // [Vp, C]
    pub wpe: Range<usize>, // [T, C]
    pub blocks: Vec<BlockParams>,
    pub lnfw: Range<usize>, // [C]
    pub lnfb: Range<usize>, // [C]
    pub total: usize,
}

struct Cursor(usize);

impl Cursor {
    fn take(&mut self, n: usize) -> Range<usize> {
        let r = self.0..self.0 + n;
        self.0 += n;
        r
    }
}

impl ParamLayout {
    pub fn new(s: &GptShape) -> Self {
        let (c, f) = (s.channels, s.ffn);
        let mut k = Cursor(0);
        let wte = k.take(s.padded_vocab * c);
        let wpe = k.take(s.max_seq * c);
        let blocks = (0..s.layers)
            .map(|_| BlockParams {
                ln1w: k.take(c),
                ln1b: k.take(c),
                qkvw: k.take(3 * c * c),
                qkvb: k.take(3 * c),
                projw: k.take(c * c),
                projb: k.take(c),
                ln2w: k.take(c),
                ln2b: k.take(c),
                fcw: k.take(f * c),
                fcb: k.take(f),
                fcprojw: k.take(c * f),
                fcprojb: k.take(c),
            })
            .collect();
        let lnfw = k.take(c);
        let lnfb = k.take(c);
        ParamLayout {
            wte,
            wpe,
            blocks,
            lnfw,
            lnfb,
            total: k.0,
        }
    }

    /// (name, range) of every tensor, in buffer order, with Hugging Face GPT-2 names.
    pub fn named(&self) -> Vec<(String, Range<usize>)> {
        let mut v = vec![
            ("wte".to_string(), self.wte.clone()),
            ("wpe".to_string(), self.wpe.clone()),
        ];
        for (l, b) in self.blocks.iter().enumerate() {
            for (n, r) in [
                ("ln_1.weight", &b.ln1w),
                ("ln_1.bias", &b.ln1b),
                ("attn.c_attn.weight", &b.qkvw),
                ("attn.c_attn.bias", &b.qkvb),
                ("attn.c_proj.weight", &b.projw),
                ("attn.c_proj.bias", &b.projb),
                ("ln_2.weight", &b.ln2w),
                ("ln_2.bias", &b.ln2b),
                ("mlp.c_fc.weight", &b.fcw),
                ("mlp.c_fc.bias", &b.fcb),
                ("mlp.c_proj.weight", &b.fcprojw),
                ("mlp.c_proj.bias", &b.fcprojb),
            ] {
                v.push((format!("h.{l}.{n}"), r.clone()));
            }
        }
        v.push(("ln_f.weight".into(), self.lnfw.clone()));
        v.push(("ln_f.bias".into(), self.lnfb.clone()));
        v
    }
}

/// One block's activations for a (B, T) microbatch; N = B·T.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockActs {
    pub ln1: Range<usize>,      // [N, C]
    pub ln1_mean: Range<usize>, // [N]
    pub ln1_rstd: Range<usize>, // [N]
    pub qkv: Range<usize>,      // [N, 3C]
    pub att: Range<usize>,      // [B, NH, T, T]
    pub atty: Range<usize>,     // [N, C]
    pub attproj: Range<usize>,  // [N, C]
    pub res2: Range<usize>,     // [N, C]
    pub ln2: Range<usize>,      // [N, C]
    pub ln2_mean: Range<usize>, // [N]
    pub ln2_rstd: Range<usize>, // [N]
    pub fch: Range<usize>,      // [N, F]
    pub fch_gelu: Range<usize>, // [N, F]
    pub fcproj: Range<usize>,   // [N, C]
    pub res3: Range<usize>,     // [N, C]
}

/// Every activation tensor's range for one (B, T).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActLayout {
    pub b: usize,
    pub t: usize,
    pub encoded: Range<usize>, // [N, C]
    pub blocks: Vec<BlockActs>,
    pub lnf: Range<usize>,      // [N, C]
    pub lnf_mean: Range<usize>, // [N]
    pub lnf_rstd: Range<usize>, // [N]
    pub logits: Range<usize>,   // [N, Vp]
    pub probs: Range<usize>,    // [N, Vp]
    pub losses: Range<usize>,   // [N]
    pub total: usize,
}

impl ActLayout {
    pub fn new(s: &GptShape, b: usize, t: usize) -> Self {
        let (n, c, f) = (b * t, s.channels, s.ffn);
        let mut k = Cursor(0);
        let encoded = k.take(n * c);
        let blocks = (0..s.layers)
            .map(|_| BlockActs {
                ln1: k.take(n * c),
                ln1_mean: k.take(n),
                ln1_rstd: k.take(n),
                qkv: k.take(n * 3 * c),
                att: k.take(b * s.heads * t * t),
                atty: k.take(n * c),
                attproj: k.take(n * c),
                res2: k.take(n * c),
                ln2: k.take(n * c),
                ln2_mean: k.take(n),
                ln2_rstd: k.take(n),
                fch: k.take(n * f),
                fch_gelu: k.take(n * f),
                fcproj: k.take(n * c),
                res3: k.take(n * c),
            })
            .collect();
        let lnf = k.take(n * c);
        let lnf_mean = k.take(n);
        let lnf_rstd = k.take(n);
        let logits = k.take(n * s.padded_vocab);
        let probs = k.take(n * s.padded_vocab);
        let losses = k.take(n);
        ActLayout {
            b,
            t,
            encoded,
            blocks,
            lnf,
            lnf_mean,
            lnf_rstd,
            logits,
            probs,
            losses,
            total: k.0,
        }
    }
}

/// The backward workspace for one (B, T): the head's gradients, the residual stream's gradient
/// (two buffers, ping-pong between blocks) and one block's activation gradients, reused by every
/// block — only one block's are live at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GradLayout {
    pub dlogits: Range<usize>,   // [N, Vp]
    pub dlnf: Range<usize>,      // [N, C]
    pub dres: [Range<usize>; 2], // [N, C] each
    pub dln1: Range<usize>,      // [N, C]
    pub dqkv: Range<usize>,      // [N, 3C]
    pub datty: Range<usize>,     // [N, C]
    pub dattproj: Range<usize>,  // [N, C]
    pub dres2: Range<usize>,     // [N, C]
    pub dln2: Range<usize>,      // [N, C]
    pub dfch: Range<usize>,      // [N, F]
    pub dfchg: Range<usize>,     // [N, F]
    pub dfcproj: Range<usize>,   // [N, C]
    pub total: usize,
}

impl GradLayout {
    pub fn new(s: &GptShape, b: usize, t: usize) -> Self {
        let (n, c, f) = (b * t, s.channels, s.ffn);
        let mut k = Cursor(0);
        let dlogits = k.take(n * s.padded_vocab);
        let dlnf = k.take(n * c);
        let dres = [k.take(n * c), k.take(n * c)];
        GradLayout {
            dlogits,
            dlnf,
            dres,
            dln1: k.take(n * c),
            dqkv: k.take(n * 3 * c),
            datty: k.take(n * c),
            dattproj: k.take(n * c),
            dres2: k.take(n * c),
            dln2: k.take(n * c),
            dfch: k.take(n * f),
            dfchg: k.take(n * f),
            dfcproj: k.take(n * c),
            total: k.0,
        }
    }

    /// The range holding one block's scratch gradients (everything after the residual buffers).
    fn block_scratch(&self) -> Range<usize> {
        self.dln1.start..self.total
    }
}

/// Disjoint mutable views of one buffer (panics on overlap: a layout bug, not input).
fn parts<'a, R, const K: usize>(buf: &'a mut [R], ranges: [&Range<usize>; K]) -> [&'a mut [R]; K] {
    let mut order: Vec<usize> = (0..K).collect();
    order.sort_by_key(|&i| ranges[i].start);
    let mut out: Vec<Option<&'a mut [R]>> = (0..K).map(|_| None).collect();
    let mut rest = buf;
    let mut at = 0;
    for &i in &order {
        let r = ranges[i];
        assert!(r.start >= at, "overlapping ranges");
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - at);
        let (mine, tail) = tail.split_at_mut(r.len());
        out[i] = Some(mine);
        rest = tail;
        at = r.end;
    }
    out.into_iter()
        .map(|s| s.expect("every range taken"))
        .collect::<Vec<_>>()
        .try_into()
        .ok()
        .expect("K parts")
}

/// A GPT-2 model with its buffers.
pub struct Gpt<R: Real> {
    pub shape: GptShape,
    pub layout: ParamLayout,
    /// All parameters, in `layout` order.
    pub params: Vec<R>,
    /// Their gradients, same layout.
    pub grads: Vec<R>,
    acts: Vec<R>,
    dacts: Vec<R>,
    act_layout: Option<ActLayout>,
    grad_layout: Option<GradLayout>,
    tokens: Vec<u32>,
    targets: Vec<u32>,
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
        let grads = vec![R::zero(); layout.total];
        Gpt {
            shape,
            layout,
            params,
            grads,
            acts: Vec::new(),
            dacts: Vec::new(),
            act_layout: None,
            grad_layout: None,
            tokens: Vec::new(),
            targets: Vec::new(),
        }
    }

    /// Bytes of the activations kept from forward for backward (the planner's `activations`).
    pub fn activation_bytes(&self) -> usize {
        self.acts.len() * std::mem::size_of::<R>()
    }

    /// Bytes of the backward workspace: the head's and one block's activation gradients plus the
    /// residual gradient (not kept across the step; the planner does not count it).
    pub fn workspace_bytes(&self) -> usize {
        self.dacts.len() * std::mem::size_of::<R>()
    }

    fn ensure(&mut self, b: usize, t: usize) {
        if self.act_layout.as_ref().is_none_or(|l| l.b != b || l.t != t) {
            let l = ActLayout::new(&self.shape, b, t);
            let gl = GradLayout::new(&self.shape, b, t);
            self.acts = vec![R::zero(); l.total];
            self.dacts = vec![R::zero(); gl.total];
            self.act_layout = Some(l);
            self.grad_layout = Some(gl);
        }
    }

    /// Forward a (B, T) microbatch of token ids and next-token targets; the mean loss.
    pub fn forward(&mut self, tokens: &[u32], targets: &[u32], b: usize, t: usize) -> R {
        assert!(
            t <= self.shape.max_seq && tokens.len() == b * t && targets.len() == b * t,
            "shapes checked by the caller"
        );
        self.ensure(b, t);
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        self.targets.clear();
        self.targets.extend_from_slice(targets);
        let s = self.shape;
        let (c, f, nh) = (s.channels, s.ffn, s.heads);
        let la = self.act_layout.as_ref().expect("ensured");
        let p = &self.params;
        let pl = &self.layout;
        let a = &mut self.acts;
        encoder_forward(
            &mut a[la.encoded.clone()],
            tokens,
            &p[pl.wte.clone()],
            &p[pl.wpe.clone()],
            t,
            c,
        );
        for l in 0..s.layers {
            let (bp, ba) = (&pl.blocks[l], &la.blocks[l]);
            let input = if l == 0 {
                la.encoded.clone()
            } else {
                la.blocks[l - 1].res3.clone()
            };
            let [ln1, m1, r1, qkv, att, atty, attproj, res2, ln2, m2, r2, fch, fchg, fcproj, res3, x] = parts(
                a,
                [
                    &ba.ln1,
                    &ba.ln1_mean,
                    &ba.ln1_rstd,
                    &ba.qkv,
                    &ba.att,
                    &ba.atty,
                    &ba.attproj,
                    &ba.res2,
                    &ba.ln2,
                    &ba.ln2_mean,
                    &ba.ln2_rstd,
                    &ba.fch,
                    &ba.fch_gelu,
                    &ba.fcproj,
                    &ba.res3,
                    &input,
                ],
            );
            layernorm_forward(ln1, m1, r1, x, &p[bp.ln1w.clone()], &p[bp.ln1b.clone()], c);
            matmul_forward(qkv, ln1, &p[bp.qkvw.clone()], Some(&p[bp.qkvb.clone()]), c, 3 * c);
            attention_forward(atty, att, qkv, b, t, c, nh);
            matmul_forward(attproj, atty, &p[bp.projw.clone()], Some(&p[bp.projb.clone()]), c, c);
            residual_forward(res2, x, attproj);
            layernorm_forward(ln2, m2, r2, res2, &p[bp.ln2w.clone()], &p[bp.ln2b.clone()], c);
            matmul_forward(fch, ln2, &p[bp.fcw.clone()], Some(&p[bp.fcb.clone()]), c, f);
            gelu_forward(fchg, fch);
            matmul_forward(fcproj, fchg, &p[bp.fcprojw.clone()], Some(&p[bp.fcprojb.clone()]), f, c);
            residual_forward(res3, res2, fcproj);
        }
        let last = la.blocks[s.layers - 1].res3.clone();
        let [lnf, mf, rf, logits, probs, losses, x] = parts(
            a,
            [
                &la.lnf,
                &la.lnf_mean,
                &la.lnf_rstd,
                &la.logits,
                &la.probs,
                &la.losses,
                &last,
            ],
        );
        layernorm_forward(lnf, mf, rf, x, &p[pl.lnfw.clone()], &p[pl.lnfb.clone()], c);
        matmul_forward(logits, lnf, &p[pl.wte.clone()], None, c, s.padded_vocab);
        crossentropy_forward(probs, losses, logits, targets, s.vocab, s.padded_vocab);
        let n = R::of((b * t) as f64);
        losses.iter().copied().sum::<R>() / n
    }

    /// Backward of the last forward, accumulating `scale ×` the gradient of its mean loss into
    /// `grads` (scale = 1 / microbatches for gradient accumulation).
    pub fn backward(&mut self, scale: R) {
        let s = self.shape;
        let (c, f, nh) = (s.channels, s.ffn, s.heads);
        let la = self.act_layout.as_ref().expect("backward after forward");
        let (b, t) = (la.b, la.t);
        let p = &self.params;
        let pl = &self.layout;
        let a = &self.acts;
        let g = &mut self.grads;
        let gl = self.grad_layout.as_ref().expect("backward after forward");
        let d = &mut self.dacts;
        d.iter_mut().for_each(|x| *x = R::zero());
        let dloss = scale / R::of((b * t) as f64);
        let last = la.blocks[s.layers - 1].res3.clone();
        // dres[cur] is the gradient of the residual stream at the current block's output.
        let mut cur = 0;
        {
            let [dlogits, dlnf, dx] = parts(d, [&gl.dlogits, &gl.dlnf, &gl.dres[cur]]);
            crossentropy_backward(
                dlogits,
                &a[la.probs.clone()],
                &self.targets,
                dloss,
                s.vocab,
                s.padded_vocab,
            );
            let [dwte, dlnfw, dlnfb] = parts(g, [&pl.wte, &pl.lnfw, &pl.lnfb]);
            matmul_backward(
                dlnf,
                dwte,
                None,
                dlogits,
                &a[la.lnf.clone()],
                &p[pl.wte.clone()],
                c,
                s.padded_vocab,
            );
            layernorm_backward(
                dx,
                dlnfw,
                dlnfb,
                dlnf,
                &a[last.clone()],
                &p[pl.lnfw.clone()],
                &a[la.lnf_mean.clone()],
                &a[la.lnf_rstd.clone()],
                c,
            );
        }
        for l in (0..s.layers).rev() {
            let (bp, ba) = (&pl.blocks[l], &la.blocks[l]);
            let input = if l == 0 {
                la.encoded.clone()
            } else {
                la.blocks[l - 1].res3.clone()
            };
            // this block's scratch and the input gradient start from zero (kernels accumulate)
            d[gl.block_scratch()].iter_mut().for_each(|x| *x = R::zero());
            d[gl.dres[1 - cur].clone()].iter_mut().for_each(|x| *x = R::zero());
            let [dln1, dqkv, datty, dattproj, dres2, dln2, dfch, dfchg, dfcproj, dres3, dx] = parts(
                d,
                [
                    &gl.dln1,
                    &gl.dqkv,
                    &gl.datty,
                    &gl.dattproj,
                    &gl.dres2,
                    &gl.dln2,
                    &gl.dfch,
                    &gl.dfchg,
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
            residual_backward(dres2, dfcproj, dres3);
            matmul_backward(
                dfchg,
                dfcprojw,
                Some(dfcprojb),
                dfcproj,
                &a[ba.fch_gelu.clone()],
                &p[bp.fcprojw.clone()],
                f,
                c,
            );
            gelu_backward(dfch, &a[ba.fch.clone()], dfchg);
            matmul_backward(
                dln2,
                dfcw,
                Some(dfcb),
                dfch,
                &a[ba.ln2.clone()],
                &p[bp.fcw.clone()],
                c,
                f,
            );
            layernorm_backward(
                dres2,
                dln2w,
                dln2b,
                dln2,
                &a[ba.res2.clone()],
                &p[bp.ln2w.clone()],
                &a[ba.ln2_mean.clone()],
                &a[ba.ln2_rstd.clone()],
                c,
            );
            residual_backward(dx, dattproj, dres2);
            matmul_backward(
                datty,
                dprojw,
                Some(dprojb),
                dattproj,
                &a[ba.atty.clone()],
                &p[bp.projw.clone()],
                c,
                c,
            );
            attention_backward(dqkv, datty, &a[ba.qkv.clone()], &a[ba.att.clone()], b, t, c, nh);
            matmul_backward(
                dln1,
                dqkvw,
                Some(dqkvb),
                dqkv,
                &a[ba.ln1.clone()],
                &p[bp.qkvw.clone()],
                c,
                3 * c,
            );
            layernorm_backward(
                dx,
                dln1w,
                dln1b,
                dln1,
                &a[input.clone()],
                &p[bp.ln1w.clone()],
                &a[ba.ln1_mean.clone()],
                &a[ba.ln1_rstd.clone()],
                c,
            );
            cur = 1 - cur;
        }
        let [dwte, dwpe] = parts(g, [&pl.wte, &pl.wpe]);
        encoder_backward(dwte, dwpe, &d[gl.dres[cur].clone()], &self.tokens, t, c);
    }

    pub fn zero_grad(&mut self) {
        self.grads.iter_mut().for_each(|x| *x = R::zero());
    }

    /// Logits of the last forward, [B·T, Vp].
    pub fn logits(&self) -> &[R] {
        let la = self.act_layout.as_ref().expect("after forward");
        &self.acts[la.logits.clone()]
    }
}
