//! GPT-2 with its parameters, gradients and activations in flat buffers.
//!
//! Parameters are laid out block by block (so a pipeline stage owns a contiguous range and a
//! tensor-parallel shard can be cut per tensor): `wte, wpe, block 0 .. block L-1, lnf`. The
//! offset tables ([`ParamLayout`], [`ActLayout`]) give every tensor's range and, in comments, its
//! shape. Activations are sized for one (B, T) microbatch.

use std::ops::Range;

use exatrain_parallel::comm::CommError;
use exatrain_spec::{Mlp, ModelSpec, Norm, Position, Recompute, SpecError};

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

/// Which piece of the model one rank holds: a contiguous range of layers (a pipeline stage, or
/// one chunk of an interleaved stage), the embedding if it holds the first layer's input, the
/// final norm, head and loss if it holds the last layer's output, and one tensor-parallel shard
/// of every tensor (Megatron's split: QKV and MLP-up by output rows, attention-out and MLP-down
/// by input columns, the vocabulary by rows). The single-process model is [`Part::whole`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub layers: Range<usize>,
    pub embed: bool,
    pub head: bool,
    /// tensor-parallel size and this rank's index in its group
    pub tp: usize,
    pub tp_rank: usize,
    /// Megatron's sequence parallelism: the norms and the residual stream hold this rank's 1/tp
    /// of the rows (tokens), gathered before and reduce-scattered after each parallel region
    pub sp: bool,
    pub recompute: Recompute,
}

impl Part {
    pub fn whole(s: &GptShape) -> Part {
        Part {
            layers: 0..s.layers,
            embed: true,
            head: true,
            tp: 1,
            tp_rank: 0,
            sp: false,
            recompute: Recompute::None,
        }
    }

    /// The shape must split evenly into `tp` shards.
    pub fn check(&self, s: &GptShape) -> Result<(), SpecError> {
        let t = self.tp;
        for (what, n) in [
            ("heads", s.heads),
            ("ffn_hidden", s.ffn),
            ("padded_vocab", s.padded_vocab),
        ] {
            if t == 0 || n % t != 0 {
                return Err(SpecError::new(format!("--tp {t} does not divide {n} {what}")));
            }
        }
        if self.layers.end > s.layers || self.tp_rank >= t {
            return Err(SpecError::new(format!(
                "part {:?} / tp rank {} outside the model's {} layers / --tp {t}",
                self.layers, self.tp_rank, s.layers
            )));
        }
        Ok(())
    }
}

/// The local sizes of a part.
#[derive(Debug, Clone, Copy)]
struct Dims {
    /// C, the full width of the residual stream
    c: usize,
    /// C / tp: this rank's share of the attention width
    cl: usize,
    /// NH / tp
    nh: usize,
    /// F / tp
    f: usize,
    /// Vp / tp: this rank's vocabulary rows, ids vlo..vlo+vl, of which `valid` are real
    vl: usize,
    vlo: usize,
    valid: usize,
}

impl Dims {
    fn new(s: &GptShape, p: &Part) -> Dims {
        let vl = s.padded_vocab / p.tp;
        let vlo = p.tp_rank * vl;
        Dims {
            c: s.channels,
            cl: s.channels / p.tp,
            nh: s.heads / p.tp,
            f: s.ffn / p.tp,
            vl,
            vlo,
            valid: s.vocab.saturating_sub(vlo).min(vl),
        }
    }
}

/// One block's tensors in the parameter buffer (local shapes: Cl = C/tp, Fl = F/tp).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockParams {
    pub ln1w: Range<usize>,    // [C]
    pub ln1b: Range<usize>,    // [C]
    pub qkvw: Range<usize>,    // [3Cl, C]  column-parallel (rows: this rank's heads' q, k, v)
    pub qkvb: Range<usize>,    // [3Cl]
    pub projw: Range<usize>,   // [C, Cl]   row-parallel (input columns)
    pub projb: Range<usize>,   // [C]       replicated, added by tp rank 0
    pub ln2w: Range<usize>,    // [C]
    pub ln2b: Range<usize>,    // [C]
    pub fcw: Range<usize>,     // [Fl, C]   column-parallel
    pub fcb: Range<usize>,     // [Fl]
    pub fcprojw: Range<usize>, // [C, Fl]   row-parallel
    pub fcprojb: Range<usize>, // [C]       replicated, added by tp rank 0
}

/// Every parameter tensor's range; tensors a part does not hold are empty ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    pub wte: Range<usize>, // [Vp/tp, C] vocabulary-parallel; held by the embedding and the head
    pub wpe: Range<usize>, // [T, C]     replicated, added by tp rank 0
    pub blocks: Vec<BlockParams>,
    pub lnfw: Range<usize>, // [C]
    pub lnfb: Range<usize>, // [C]
    pub total: usize,
    /// the part this layout is for
    pub part: Part,
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
    /// The whole model.
    pub fn new(s: &GptShape) -> Self {
        Self::of_part(s, &Part::whole(s))
    }

    pub fn of_part(s: &GptShape, part: &Part) -> Self {
        let d = Dims::new(s, part);
        let (c, cl, f) = (d.c, d.cl, d.f);
        let mut k = Cursor(0);
        let wte = k.take(if part.embed || part.head { d.vl * c } else { 0 });
        let wpe = k.take(if part.embed { s.max_seq * c } else { 0 });
        let blocks = part
            .layers
            .clone()
            .map(|_| BlockParams {
                ln1w: k.take(c),
                ln1b: k.take(c),
                qkvw: k.take(3 * cl * c),
                qkvb: k.take(3 * cl),
                projw: k.take(c * cl),
                projb: k.take(c),
                ln2w: k.take(c),
                ln2b: k.take(c),
                fcw: k.take(f * c),
                fcb: k.take(f),
                fcprojw: k.take(c * f),
                fcprojb: k.take(c),
            })
            .collect();
        let lnfw = k.take(if part.head { c } else { 0 });
        let lnfb = k.take(if part.head { c } else { 0 });
        ParamLayout {
            wte,
            wpe,
            blocks,
            lnfw,
            lnfb,
            total: k.0,
            part: part.clone(),
        }
    }

    /// (name, range) of every tensor held, in buffer order, with Hugging Face GPT-2 names.
    pub fn named(&self) -> Vec<(String, Range<usize>)> {
        let mut v = vec![
            ("wte".to_string(), self.wte.clone()),
            ("wpe".to_string(), self.wpe.clone()),
        ];
        for (i, b) in self.blocks.iter().enumerate() {
            let l = self.part.layers.start + i;
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
        v.retain(|(_, r)| !r.is_empty());
        v
    }

    /// The weight matrices (and the embedding), which get weight decay.
    pub fn decayed(&self) -> Vec<Range<usize>> {
        self.blocks
            .iter()
            .flat_map(|b| [b.qkvw.clone(), b.projw.clone(), b.fcw.clone(), b.fcprojw.clone()])
            .chain([self.wte.clone()])
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// The tensors every tensor-parallel rank holds whole (norms, row-parallel biases, positions):
    /// their gradients are identical across the group, so a global norm counts them once.
    pub fn tp_replicated(&self) -> Vec<Range<usize>> {
        let mut v: Vec<Range<usize>> = self
            .blocks
            .iter()
            .flat_map(|b| {
                [
                    b.ln1w.clone(),
                    b.ln1b.clone(),
                    b.projb.clone(),
                    b.ln2w.clone(),
                    b.ln2b.clone(),
                    b.fcprojb.clone(),
                ]
            })
            .collect();
        v.extend([self.wpe.clone(), self.lnfw.clone(), self.lnfb.clone()]);
        v.retain(|r| !r.is_empty());
        v
    }

    /// Where this part's parameters sit in the whole model's buffer: (local start, whole start,
    /// length) runs that together cover the part's buffer once.
    pub fn shard_runs(&self, s: &GptShape) -> Vec<(usize, usize, usize)> {
        let full = ParamLayout::new(s);
        let part = &self.part;
        let d = Dims::new(s, part);
        let (c, cl, f, t) = (d.c, d.cl, d.f, part.tp_rank);
        let mut runs = Vec::new();
        // rows r0..r0+n of a row-major tensor with `cols` columns, to local offset `at`
        let mut rows = |at: usize, full: &Range<usize>, r0: usize, n: usize, cols: usize| {
            if n * cols > 0 {
                runs.push((at, full.start + r0 * cols, n * cols));
            }
        };
        let whole = |l: &Range<usize>, f: &Range<usize>| (l.start, f.start, l.len());
        let mut wholes = Vec::new();
        let mut columns = Vec::new();
        if !self.wte.is_empty() {
            rows(self.wte.start, &full.wte, d.vlo, d.vl, c);
        }
        wholes.extend([
            whole(&self.wpe, &full.wpe),
            whole(&self.lnfw, &full.lnfw),
            whole(&self.lnfb, &full.lnfb),
        ]);
        for (i, b) in self.blocks.iter().enumerate() {
            let fb = &full.blocks[part.layers.start + i];
            for k in 0..3 {
                // q, k and v rows of this rank's heads
                rows(b.qkvw.start + k * cl * c, &fb.qkvw, k * c + t * cl, cl, c);
                rows(b.qkvb.start + k * cl, &fb.qkvb, k * c + t * cl, cl, 1);
            }
            rows(b.fcw.start, &fb.fcw, t * f, f, c);
            rows(b.fcb.start, &fb.fcb, t * f, f, 1);
            // input columns of every output row
            for r in 0..c {
                columns.push((b.projw.start + r * cl, fb.projw.start + r * c + t * cl, cl));
                columns.push((b.fcprojw.start + r * f, fb.fcprojw.start + r * s.ffn + t * f, f));
            }
            wholes.extend([
                whole(&b.ln1w, &fb.ln1w),
                whole(&b.ln1b, &fb.ln1b),
                whole(&b.projb, &fb.projb),
                whole(&b.ln2w, &fb.ln2w),
                whole(&b.ln2b, &fb.ln2b),
                whole(&b.fcprojb, &fb.fcprojb),
            ]);
        }
        runs.extend(columns);
        runs.extend(wholes.into_iter().filter(|r| r.2 > 0));
        runs.sort_unstable();
        runs
    }
}

/// One block's activations for a (B, T) microbatch, N = B·T (local shapes as in [`BlockParams`]).
/// Under recomputation the tensors not kept point into a scratch region shared by all blocks
/// and microbatches, refilled in backward.
#[derive(Debug, Clone, PartialEq, Eq)]
/// Rows: R = N/tp under sequence parallelism, else N; the `_full` tensors are the gathered [N, C]
/// inputs of the column-parallel GEMMs and the [N, C] partial sums of the row-parallel ones.
pub struct BlockActs {
    pub ln1: Range<usize>,          // [R, C]
    pub ln1_mean: Range<usize>,     // [R]
    pub ln1_rstd: Range<usize>,     // [R]
    pub ln1_full: Range<usize>,     // [N, C]  (scratch: gathered again in backward)
    pub qkv: Range<usize>,          // [N, 3Cl]
    pub att: Range<usize>,          // [B, NH/tp, T, T]  (scratch under selective recompute)
    pub atty: Range<usize>,         // [N, Cl]
    pub attproj_full: Range<usize>, // [N, C]  (scratch)
    pub attproj: Range<usize>,      // [R, C]  (scratch)
    pub res2: Range<usize>,         // [R, C]
    pub ln2: Range<usize>,          // [R, C]
    pub ln2_mean: Range<usize>,     // [R]
    pub ln2_rstd: Range<usize>,     // [R]
    pub ln2_full: Range<usize>,     // [N, C]  (scratch: gathered again in backward)
    pub fch: Range<usize>,          // [N, Fl]
    pub fch_gelu: Range<usize>,     // [N, Fl]
    pub fcproj_full: Range<usize>,  // [N, C]  (scratch)
    pub fcproj: Range<usize>,       // [R, C]  (scratch)
    pub res3: Range<usize>,         // [R, C]  (the only kept tensor under full recompute; scratch
                                    //          for a stage's last block, whose output is sent on)
}

/// Every activation tensor's range of one in-flight (B, T) microbatch; head tensors are empty
/// unless the part holds the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActLayout {
    pub b: usize,
    pub t: usize,
    /// rows of the residual stream on this rank (N/tp under sequence parallelism)
    pub rows: usize,
    pub enc_full: Range<usize>, // [N, C] the embedding's partial sums (scratch)
    pub encoded: Range<usize>,  // [R, C] the part's input: the embedding, or what the previous stage sent
    pub blocks: Vec<BlockActs>,
    pub lnf: Range<usize>,      // [R, C]
    pub lnf_mean: Range<usize>, // [R]
    pub lnf_rstd: Range<usize>, // [R]
    pub lnf_full: Range<usize>, // [N, C] (scratch: gathered again in backward)
    pub logits: Range<usize>,   // [N, Vp/tp]  (scratch: valid until the next pass)
    pub probs: Range<usize>,    // [N, Vp/tp]
    pub losses: Range<usize>,   // [N]
    pub ce_max: Range<usize>,   // [N]  row max over the whole vocabulary
    pub ce_stats: Range<usize>, // [2N] Σexp, and the target's logit − max
}

impl ActLayout {
    /// The whole model's activations for one microbatch (no recomputation).
    pub fn new(s: &GptShape, b: usize, t: usize) -> Self {
        Self::build(s, &Part::whole(s), b, t, 0, 0).0
    }

    /// One slot's layout with its kept tensors from `kept_base` and the shared recompute scratch
    /// from `scratch_base`; also the lengths of both.
    fn build(
        s: &GptShape,
        part: &Part,
        b: usize,
        t: usize,
        kept_base: usize,
        scratch_base: usize,
    ) -> (Self, usize, usize) {
        let d = Dims::new(s, part);
        let (n, c, cl, f) = (b * t, d.c, d.cl, d.f);
        let r = if part.sp { n / part.tp } else { n };
        let mut k = Cursor(kept_base);
        let mut scratch_len = 0;
        let mut enc_scratch = Cursor(scratch_base);
        let enc_full = enc_scratch.take(if part.embed { n * c } else { 0 });
        scratch_len = scratch_len.max(enc_scratch.0 - scratch_base);
        let encoded = k.take(r * c);
        let last = part.layers.len().saturating_sub(1);
        let blocks = part
            .layers
            .clone()
            .enumerate()
            .map(|(i, _)| {
                let mut sc = Cursor(scratch_base);
                // a stage's output is sent on at once, and its backward never reads it
                let sent = i == last && !part.head;
                let full = part.recompute == Recompute::Full;
                let sel = part.recompute == Recompute::Selective;
                let mut take = |len: usize, kept: bool| if kept { k.take(len) } else { sc.take(len) };
                let a = BlockActs {
                    ln1: take(r * c, !full),
                    ln1_mean: take(r, !full),
                    ln1_rstd: take(r, !full),
                    ln1_full: take(n * c, false),
                    qkv: take(n * 3 * cl, !full),
                    att: take(b * d.nh * t * t, !full && !sel),
                    atty: take(n * cl, !full),
                    // the projections' outputs are only added into the residual stream: backward
                    // never reads them, so they live in the scratch
                    attproj_full: take(n * c, false),
                    attproj: take(r * c, false),
                    res2: take(r * c, !full),
                    ln2: take(r * c, !full),
                    ln2_mean: take(r, !full),
                    ln2_rstd: take(r, !full),
                    ln2_full: take(n * c, false),
                    fch: take(n * f, !full),
                    fch_gelu: take(n * f, !full),
                    fcproj_full: take(n * c, false),
                    fcproj: take(r * c, false),
                    res3: take(r * c, !sent),
                };
                scratch_len = scratch_len.max(sc.0 - scratch_base);
                a
            })
            .collect();
        let h = |len: usize| if part.head { len } else { 0 };
        // the logits are read only by the cross-entropy's forward (backward needs the probs)
        let mut head_scratch = Cursor(scratch_base);
        let logits = head_scratch.take(h(n * d.vl));
        let lnf_full = head_scratch.take(h(n * c));
        scratch_len = scratch_len.max(head_scratch.0 - scratch_base);
        let lay = ActLayout {
            b,
            t,
            rows: r,
            enc_full,
            encoded,
            blocks,
            lnf: k.take(h(r * c)),
            lnf_mean: k.take(h(r)),
            lnf_rstd: k.take(h(r)),
            lnf_full,
            logits,
            probs: k.take(h(n * d.vl)),
            losses: k.take(h(n)),
            ce_max: k.take(h(n)),
            ce_stats: k.take(h(2 * n)),
        };
        (lay, k.0 - kept_base, scratch_len)
    }

    /// The input of local block `l`.
    fn block_input(&self, l: usize) -> Range<usize> {
        if l == 0 {
            self.encoded.clone()
        } else {
            self.blocks[l - 1].res3.clone()
        }
    }

    /// The part's output: the last block's residual stream (in the scratch unless the part
    /// holds the head: valid until the next pass).
    fn output(&self) -> Range<usize> {
        self.block_input(self.blocks.len())
    }
}

/// The backward workspace for one (B, T): the head's gradients, the residual stream's gradient
/// (two buffers, ping-pong between blocks) and one block's activation gradients, reused by every
/// block — only one block's are live at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GradLayout {
    pub dlogits: Range<usize>,       // [N, Vp/tp]
    pub dlnf_full: Range<usize>,     // [N, C]
    pub dlnf: Range<usize>,          // [R, C]
    pub denc_full: Range<usize>,     // [N, C]
    pub dres: [Range<usize>; 2],     // [R, C] each
    pub dln1_full: Range<usize>,     // [N, C]
    pub dln1: Range<usize>,          // [R, C]
    pub dqkv: Range<usize>,          // [N, 3Cl]
    pub datty: Range<usize>,         // [N, Cl]
    pub dattproj_full: Range<usize>, // [N, C]
    pub dattproj: Range<usize>,      // [R, C]
    pub dres2: Range<usize>,         // [R, C]
    pub dln2_full: Range<usize>,     // [N, C]
    pub dln2: Range<usize>,          // [R, C]
    pub dfch: Range<usize>,          // [N, Fl]
    pub dfchg: Range<usize>,         // [N, Fl]
    pub dfcproj_full: Range<usize>,  // [N, C]
    pub dfcproj: Range<usize>,       // [R, C]
    pub total: usize,
}

impl GradLayout {
    fn new(s: &GptShape, part: &Part, b: usize, t: usize) -> Self {
        let d = Dims::new(s, part);
        let (n, c, cl, f) = (b * t, d.c, d.cl, d.f);
        let r = if part.sp { n / part.tp } else { n };
        let mut k = Cursor(0);
        let h = |len: usize| if part.head { len } else { 0 };
        let dlogits = k.take(h(n * d.vl));
        let dlnf_full = k.take(h(n * c));
        let dlnf = k.take(h(r * c));
        let denc_full = k.take(if part.embed { n * c } else { 0 });
        let dres = [k.take(r * c), k.take(r * c)];
        GradLayout {
            dlogits,
            dlnf_full,
            dlnf,
            denc_full,
            dres,
            dln1_full: k.take(n * c),
            dln1: k.take(r * c),
            dqkv: k.take(n * 3 * cl),
            datty: k.take(n * cl),
            dattproj_full: k.take(n * c),
            dattproj: k.take(r * c),
            dres2: k.take(r * c),
            dln2_full: k.take(n * c),
            dln2: k.take(r * c),
            dfch: k.take(n * f),
            dfchg: k.take(n * f),
            dfcproj_full: k.take(n * c),
            dfcproj: k.take(r * c),
            total: k.0,
        }
    }

    /// The range holding one block's scratch gradients (everything after the residual buffers).
    fn block_scratch(&self) -> Range<usize> {
        self.dln1_full.start..self.total
    }
}

/// Disjoint mutable views of one buffer (panics on overlap: a layout bug, not input).
fn parts<'a, R, const K: usize>(buf: &'a mut [R], ranges: [&Range<usize>; K]) -> [&'a mut [R]; K] {
    let mut order: Vec<usize> = (0..K).collect();
    order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
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

/// The tensor-parallel group as the model sees it. Megatron's conjugate operators are the two
/// places `all_reduce` is called: **g** after a row-parallel layer (forward: all-reduce the
/// partial sums, backward: identity) and **f** before a column-parallel one (forward: identity,
/// backward: all-reduce the input gradient).
pub trait TpGroup<R> {
    fn size(&self) -> usize;
    /// Sum over the group, in place (activation traffic: the planner's TP bytes).
    fn all_reduce(&self, buf: &mut [R]) -> Result<(), CommError>;
    /// `full` [size · mine.len()] ends as every rank's `mine` in rank order (sequence parallel:
    /// forward of f, backward of g).
    fn all_gather(&self, mine: &[R], full: &mut [R]) -> Result<(), CommError>;
    /// `mine` ends as this rank's chunk of the sum of `full` (sequence parallel: forward of g,
    /// backward of f).
    fn reduce_scatter(&self, full: &[R], mine: &mut [R]) -> Result<(), CommError>;
    /// Elementwise max over the group (the cross-entropy's row max: N values, not metered).
    fn max_stats(&self, buf: &mut [R]) -> Result<(), CommError>;
    /// Sum of the cross-entropy's per-row statistics (2N values, not metered).
    fn sum_stats(&self, buf: &mut [R]) -> Result<(), CommError>;
}

/// No tensor parallelism: every collective is the identity.
pub struct Alone;

impl<R: Real> TpGroup<R> for Alone {
    fn size(&self) -> usize {
        1
    }
    fn all_reduce(&self, _: &mut [R]) -> Result<(), CommError> {
        Ok(())
    }
    fn all_gather(&self, mine: &[R], full: &mut [R]) -> Result<(), CommError> {
        full.copy_from_slice(mine);
        Ok(())
    }
    fn reduce_scatter(&self, full: &[R], mine: &mut [R]) -> Result<(), CommError> {
        mine.copy_from_slice(full);
        Ok(())
    }
    fn max_stats(&self, _: &mut [R]) -> Result<(), CommError> {
        Ok(())
    }
    fn sum_stats(&self, _: &mut [R]) -> Result<(), CommError> {
        Ok(())
    }
}

/// Megatron's f before a column-parallel region, forward (and g's backward): under sequence
/// parallelism all-gather the rows, else the rows are already whole (a copy).
fn seq_gather<R: Real>(tp: &dyn TpGroup<R>, sp: bool, mine: &[R], full: &mut [R]) -> Result<(), CommError> {
    if sp {
        tp.all_gather(mine, full)
    } else {
        full.copy_from_slice(mine);
        Ok(())
    }
}

/// Megatron's g after a row-parallel region, forward (and f's backward): sum the partial
/// results over the group — reduce-scattered to this rank's rows under sequence parallelism,
/// all-reduced otherwise.
fn seq_reduce<R: Real>(tp: &dyn TpGroup<R>, sp: bool, full: &mut [R], mine: &mut [R]) -> Result<(), CommError> {
    if sp {
        tp.reduce_scatter(full, mine)
    } else {
        tp.all_reduce(full)?;
        mine.copy_from_slice(full);
        Ok(())
    }
}

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
            {
                // the column-parallel GEMMs' inputs again (sequence parallel: gathered again)
                let [ln1, ln1_full, ln2, ln2_full] =
                    parts(&mut self.acts, [&ba.ln1, &ba.ln1_full, &ba.ln2, &ba.ln2_full]);
                seq_gather(tp, sp, ln2, ln2_full)?;
                seq_gather(tp, sp, ln1, ln1_full)?;
            }
            let a = &self.acts;
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
            layernorm_backward(dx, dln1w, dln1b, dln1, x(&input), w(&bp.ln1w), m1, r1, c);
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

/// Sequence parallel: the norms' gradients (ranges of `g`) before a microbatch's backward
/// reaches them; nothing without sequence parallelism.
fn norm_grads_before<R: Real>(g: &[R], sp: bool, ranges: &[Range<usize>]) -> Vec<(Range<usize>, Vec<R>)> {
    ranges
        .iter()
        .filter(|r| sp && !r.is_empty())
        .map(|r| (r.clone(), g[r.clone()].to_vec()))
        .collect()
}

/// Sequence parallel: the norms saw only this rank's rows, so sum this microbatch's share of
/// their gradients over the tp group (what was accumulated before stays as it is).
fn sum_norm_grads<R: Real>(
    tp: &dyn TpGroup<R>,
    g: &mut [R],
    before: &[(Range<usize>, Vec<R>)],
) -> Result<(), CommError> {
    for (r, was) in before {
        let mut delta: Vec<R> = g[r.clone()].iter().zip(was).map(|(x, y)| *x - *y).collect();
        tp.sum_stats(&mut delta)?;
        for ((x, y), dl) in g[r.clone()].iter_mut().zip(was).zip(&delta) {
            *x = *y + *dl;
        }
    }
    Ok(())
}

/// One block's forward over a (B, T) microbatch, reading `input` and writing the block's
/// activations; a row-parallel layer's bias is added by tp rank 0 (`first`) only, before the
/// reduction sums the partial products.
#[allow(clippy::too_many_arguments)]
fn block_forward<R: Real>(
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
