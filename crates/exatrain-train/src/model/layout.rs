//! The offset tables: every tensor of the parameters, the activations and the backward
//! workspace as a range of one flat buffer, with its shape in a comment. Parameters are laid out
//! block by block (so a pipeline stage owns a contiguous range and a tensor-parallel shard can be
//! cut per tensor): `wte, wpe, block 0 .. block L-1, lnf`. Activations are sized for one (B, T)
//! microbatch.

use std::ops::Range;

use exatrain_spec::{Mlp, ModelSpec, Norm, Position, Recompute, SpecError};

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
    /// flash attention: no T×T probabilities kept, each row's log-sum-exp instead ([`crate::flash`])
    pub flash: bool,
    /// context-parallel size and this rank's index in its group: the part's activations hold
    /// the rank's T/cp tokens of each sequence ([`crate::flash::cp_positions`]), each block
    /// gathers the whole sequence's keys and values over the group
    pub cp: usize,
    pub cp_rank: usize,
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
            flash: false,
            cp: 1,
            cp_rank: 0,
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
        let cp = self.cp;
        if cp == 0 || self.cp_rank >= cp || (cp > 1 && (!self.flash || !s.max_seq.is_multiple_of(2 * cp))) {
            return Err(SpecError::new(format!(
                "part: context-parallel rank {} of --cp {} needs flash attention and a sequence of {} that splits into 2·cp chunks",
                self.cp_rank, self.cp, s.max_seq
            )));
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
pub(super) struct Dims {
    /// C, the full width of the residual stream
    pub(super) c: usize,
    /// C / tp: this rank's share of the attention width
    pub(super) cl: usize,
    /// NH / tp
    pub(super) nh: usize,
    /// F / tp
    pub(super) f: usize,
    /// Vp / tp: this rank's vocabulary rows, ids vlo..vlo+vl, of which `valid` are real
    pub(super) vl: usize,
    pub(super) vlo: usize,
    pub(super) valid: usize,
    /// flash attention, and the context-parallel size and rank (see [`Part`])
    pub(super) flash: bool,
    pub(super) cp: usize,
    pub(super) cp_rank: usize,
    /// full recomputation: backward runs the block's forward again first
    pub(super) full: bool,
}

impl Dims {
    pub(super) fn new(s: &GptShape, p: &Part) -> Dims {
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
            flash: p.flash,
            cp: p.cp,
            cp_rank: p.cp_rank,
            full: p.recompute == Recompute::Full,
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

/// One block's activations for a (B, T) microbatch, N = B·T (local shapes as in [`BlockParams`];
/// under context parallelism T is the rank's T/cp tokens of each sequence). With flash attention
/// `att` holds each row's log-sum-exp; with context parallelism `kv` the whole sequence's keys
/// and values in global order, gathered again in backward.
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
    pub att: Range<usize>,          // [B, NH/tp, T, T] (selective: scratch); flash: [B, NH/tp, T]
    pub kv: Range<usize>,           // [B, cp·T, 2Cl] gathered keys, values (cp > 1; scratch)
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
    pub enc_pos: Range<usize>,  // [T, C] the position rows of the rank's tokens (cp > 1; scratch)
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
    pub(super) fn build(
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
        let enc_pos = enc_scratch.take(if part.embed && part.cp > 1 { t * c } else { 0 });
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
                    // flash attention keeps its log-sum-exp whatever the recomputation, as the
                    // planner prices it (nothing of the core to recompute)
                    att: if part.flash {
                        take(b * d.nh * t, !full)
                    } else {
                        take(b * d.nh * t * t, !full && !sel)
                    },
                    kv: take(if part.cp > 1 { b * part.cp * t * 2 * cl } else { 0 }, false),
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
            enc_pos,
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
    pub(super) fn block_input(&self, l: usize) -> Range<usize> {
        if l == 0 {
            self.encoded.clone()
        } else {
            self.blocks[l - 1].res3.clone()
        }
    }

    /// The part's output: the last block's residual stream (in the scratch unless the part
    /// holds the head: valid until the next pass).
    pub(super) fn output(&self) -> Range<usize> {
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
    pub dkv: Range<usize>,           // [B, cp·T, 2Cl] the keys' and values' gradients (cp > 1)
    pub dwpe: Range<usize>,          // [T, C] the rank's position rows' gradient (cp > 1)
    pub total: usize,
}

impl GradLayout {
    pub(super) fn new(s: &GptShape, part: &Part, b: usize, t: usize) -> Self {
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
            dkv: k.take(if part.cp > 1 { b * part.cp * t * 2 * cl } else { 0 }),
            dwpe: k.take(if part.cp > 1 && part.embed { t * c } else { 0 }),
            total: k.0,
        }
    }

    /// The range holding one block's scratch gradients (everything after the residual buffers).
    pub(super) fn block_scratch(&self) -> Range<usize> {
        self.dln1_full.start..self.total
    }
}

/// Disjoint mutable views of one buffer (panics on overlap: a layout bug, not input).
pub(crate) fn parts<'a, R, const K: usize>(buf: &'a mut [R], ranges: [&Range<usize>; K]) -> [&'a mut [R]; K] {
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
