use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Invalid, ModelSpec, SpecError};

/// Activation recomputation (Korthikanti et al. 2022).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation.
    #[default]
    None,
    /// Recompute the attention core (QKᵀ, softmax, dropout, ·V) in backward.
    Selective,
    /// Keep only each block's input; rerun the whole block forward in backward.
    Full,
}

impl Recompute {
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];
    pub fn as_str(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

impl FromStr for Recompute {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "none" => Ok(Recompute::None),
            "selective" => Ok(Recompute::Selective),
            "full" => Ok(Recompute::Full),
            _ => Err(SpecError::new(format!(
                "--recompute {s} is not known (allowed: none, selective, full)"
            ))),
        }
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Number format of weights and activations. `Bf16` means mixed precision: bf16 weights, grads and
/// activations with fp32 master weights and Adam moments; `Fp32` keeps everything in fp32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    Bf16,
    Fp32,
}

impl Dtype {
    /// Bytes of one weight, gradient or activation element.
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Bf16 => 2.0,
            Dtype::Fp32 => 4.0,
        }
    }
    /// Optimizer state bytes per parameter (Adam): fp32 master copy + m + v for mixed
    /// precision (ZeRO paper's K = 12), m + v for fp32.
    pub fn optimizer_bytes(self) -> f64 {
        match self {
            Dtype::Bf16 => 12.0,
            Dtype::Fp32 => 8.0,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp32 => "fp32",
        }
    }
}

impl FromStr for Dtype {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "bf16" => Ok(Dtype::Bf16),
            // fp16 needs loss scaling and its own master-weight bytes: not modelled, so refused
            // rather than silently planned as bf16
            "fp16" => Err(SpecError::new(
                "--dtype fp16 is not modelled (loss scaling, fp16 peak); allowed: bf16, fp32",
            )),
            "fp8" => Err(SpecError::new(
                "--dtype fp8: FP8 is bf16 mixed precision with FP8 linear layers: give --dtype bf16 --fp8",
            )),
            "fp32" => Ok(Dtype::Fp32),
            _ => Err(SpecError::new(format!(
                "--dtype {s} is not known (allowed: bf16, fp32)"
            ))),
        }
    }
}

/// One dimension of the rank grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dim {
    Tp,
    Dp,
    Pp,
}

/// Order of the rank grid's dimensions, innermost (fastest-varying) first. The default
/// `tp-dp-pp` gives `rank = tp + tp_size·(dp + dp_size·pp)`, so a TP group is consecutive ranks
/// and stays inside a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RankOrder(pub [Dim; 3]);

impl Default for RankOrder {
    fn default() -> Self {
        RankOrder([Dim::Tp, Dim::Dp, Dim::Pp])
    }
}

impl RankOrder {
    /// All six orders, the default first.
    pub const ALL: [RankOrder; 6] = [
        RankOrder([Dim::Tp, Dim::Dp, Dim::Pp]),
        RankOrder([Dim::Tp, Dim::Pp, Dim::Dp]),
        RankOrder([Dim::Dp, Dim::Tp, Dim::Pp]),
        RankOrder([Dim::Dp, Dim::Pp, Dim::Tp]),
        RankOrder([Dim::Pp, Dim::Tp, Dim::Dp]),
        RankOrder([Dim::Pp, Dim::Dp, Dim::Tp]),
    ];
}

impl fmt::Display for RankOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |d: Dim| match d {
            Dim::Tp => "tp",
            Dim::Dp => "dp",
            Dim::Pp => "pp",
        };
        write!(f, "{}-{}-{}", n(self.0[0]), n(self.0[1]), n(self.0[2]))
    }
}

impl FromStr for RankOrder {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let err = || {
            SpecError::new(format!(
                "--order {s} is not a rank order (allowed: a permutation of tp, dp, pp joined by '-', innermost first, e.g. tp-dp-pp)"
            ))
        };
        let dims: Vec<Dim> = s
            .split('-')
            .map(|p| match p {
                "tp" => Ok(Dim::Tp),
                "dp" => Ok(Dim::Dp),
                "pp" => Ok(Dim::Pp),
                _ => Err(err()),
            })
            .collect::<Result<_, _>>()?;
        if dims.len() != 3 || dims[0] == dims[1] || dims[1] == dims[2] || dims[0] == dims[2] {
            return Err(err());
        }
        Ok(RankOrder([dims[0], dims[1], dims[2]]))
    }
}

impl Serialize for RankOrder {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RankOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How one training step is split across `tp · pp · dp` devices. Field names follow Megatron-LM's
/// flags (`--tensor-model-parallel-size` → `tp`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    /// Tensor-parallel size (Megatron column/row-parallel GEMMs).
    pub tp: u32,
    /// Pipeline-parallel size (stages).
    pub pp: u32,
    /// Data-parallel size (replicas, or ZeRO shards).
    pub dp: u32,
    /// Context-parallel size (Megatron-LM's `--context-parallel-size`, torchtitan's
    /// `context_parallel_degree`): each sequence split over `cp` ranks in `2·cp` chunks, rank i
    /// holding chunks i and 2·cp−1−i (the causal load balance), attention passing the keys and
    /// values around a ring. The `cp` ranks of a group hold the same weights: gradients are
    /// reduced, and ZeRO shards, over `dp · cp` ranks. They sit right outside the TP ranks in the
    /// rank grid (Megatron's tp-cp-dp-pp). Needs flash attention.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub cp: u32,
    /// Sequences per microbatch per data-parallel rank.
    pub micro_batch: u32,
    /// Sequences per optimizer step over all replicas.
    pub global_batch: u32,
    /// ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + weights, sharded over DP.
    #[serde(default)]
    pub zero: u8,
    #[serde(default)]
    pub recompute: Recompute,
    /// Megatron sequence parallelism (norm/dropout regions sharded over TP along the sequence).
    #[serde(default)]
    pub sequence_parallel: bool,
    /// Model chunks per pipeline stage (interleaved 1F1B); 1 = plain 1F1B.
    #[serde(default = "one")]
    pub virtual_stages: u32,
    /// Fused, blockwise attention (FlashAttention): no s×s tensors stored or streamed.
    #[serde(default)]
    pub flash_attention: bool,
    #[serde(default)]
    pub dtype: Dtype,
    /// The transformer blocks' linear GEMMs in FP8 (Transformer Engine's hybrid format: E4M3
    /// forward, E5M2 gradients; Megatron-LM's `--fp8-format hybrid`), on top of bf16 mixed
    /// precision: attention, the output head, norms and the optimizer stay as `dtype` says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp8: bool,
    /// Overlap the data-parallel gradient reduction with backward.
    #[serde(default = "yes")]
    pub overlap_dp: bool,
    /// Overlap the tensor-parallel all-gathers / reduce-scatters with the GEMMs next to them
    /// (Megatron-LM's `--tp-comm-overlap`, Transformer Engine userbuffers; needs sequence
    /// parallelism). Off by default, as in Megatron-LM.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlap_tp: bool,
    #[serde(default)]
    pub order: RankOrder,
    /// Transformer layers of the first pipeline stage (Megatron's
    /// `--decoder-first-pipeline-num-layers`); default: the layers spread as evenly as possible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage_layers: Option<u32>,
    /// Transformer layers of the last pipeline stage (`--decoder-last-pipeline-num-layers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stage_layers: Option<u32>,
    /// Data-parallel gradient buckets of at least this many parameters, reduced as backward
    /// fills them (Megatron-LM's `--ddp-bucket-size`; the trainer's `--bucket-mb` in fp32
    /// elements); 0: one bucket for all, reduced when backward ends (the trainer's
    /// `--bucket-mb 0`). None: the stack's default — Megatron-LM's max(40 M, 1 M · dp · cp), the
    /// trainer's 25 MB (6.25 M).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_bucket: Option<u64>,
}

/// How the transformer layers are split over the pipeline stages: the first stage, each of the
/// `pp - 2` inner stages (all equal, as in Megatron-LM), and the last stage. With one stage,
/// `first` holds every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageLayers {
    pub pp: u32,
    pub first: u32,
    pub middle: u32,
    pub last: u32,
}

impl StageLayers {
    /// Layers of pipeline stage `s`.
    pub fn of(&self, s: u32) -> u32 {
        if self.pp == 1 || s == 0 {
            self.first
        } else if s == self.pp - 1 {
            self.last
        } else {
            self.middle
        }
    }

    /// The first layer of stage `s`, and one past its last.
    pub fn range(&self, s: u32) -> std::ops::Range<u32> {
        let start: u32 = (0..s).map(|i| self.of(i)).sum();
        start..start + self.of(s)
    }

    /// The most layers any stage holds.
    pub fn max(&self) -> u32 {
        (0..self.pp).map(|s| self.of(s)).max().unwrap_or(0)
    }

    /// Every stage holds the same number of layers.
    pub fn even(&self) -> bool {
        (0..self.pp).all(|s| self.of(s) == self.first)
    }

    /// The split Megatron-LM makes when the embedding and the loss each count as a layer
    /// (`--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`): the
    /// inner stages equal, the first and the last one layer short of them (Llama 3 405B's 126
    /// layers on 16 stages: 7, 14 × 8, 7). It can be interleaved like an even split.
    pub fn accounts_for_ends(&self) -> bool {
        self.pp > 2 && self.first + 1 == self.middle && self.last + 1 == self.middle
    }

    /// The slots of each stage an interleaved schedule divides into `v` chunks: the layers of an
    /// even split, the inner stages' layers of one that accounts for the ends, or None for any
    /// other split (which cannot be interleaved).
    pub fn interleave_slots(&self) -> Option<u32> {
        if self.even() {
            Some(self.first)
        } else if self.accounts_for_ends() {
            Some(self.middle)
        } else {
            None
        }
    }

    /// The interleave slots of each stage of `model`'s default split over `pp` stages (spread as
    /// evenly as possible, no explicit first/last sizes), or None where that split cannot be
    /// interleaved or `pp` does not fit the layers.
    pub fn default_interleave_slots(model: &ModelSpec, pp: u32) -> Option<u32> {
        ParallelConfig::new(1, pp, 1, 1, 1)
            .stage_layers(model)
            .ok()
            .and_then(|st| st.interleave_slots())
    }

    /// The layers of virtual stage `k` of `pp · v` (chunk `k / pp` of stage `k % pp`); with
    /// `v = 1` the stage's [`range`](Self::range). Interleaved, an even split gives every chunk
    /// `first / v` layers; a split that accounts for the ends gives every chunk `middle / v`
    /// slots, the embedding taking one slot of the very first chunk and the loss one of the
    /// very last ([`ParallelConfig::check`] admits no other interleaved split).
    pub fn chunk_range(&self, k: u32, v: u32) -> std::ops::Range<u32> {
        if v <= 1 {
            return self.range(k);
        }
        let slots = self.interleave_slots().unwrap_or(self.first) / v;
        if self.even() {
            return k * slots..(k + 1) * slots;
        }
        let layers = self.first + self.middle * (self.pp - 2) + self.last;
        let start = (k * slots).saturating_sub(1).min(layers);
        let end = ((k + 1) * slots).saturating_sub(1).min(layers);
        start..end
    }
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn is_one(x: &u32) -> bool {
    *x == 1
}

impl ParallelConfig {
    /// The buckets exatrain's trainer cuts its data-parallel gradients into, fp32 elements:
    /// `dp_bucket`, or its default 25 MB (`train --bucket-mb 25`, PyTorch DDP's); 0: one bucket
    /// per model chunk besides the embedding. The trainer cuts by it and the planner prices it.
    pub fn trainer_bucket(&self) -> u64 {
        self.dp_bucket.unwrap_or(25_000_000 / 4)
    }

    /// A plain layout with defaults for everything but the sizes.
    pub fn new(tp: u32, pp: u32, dp: u32, micro_batch: u32, global_batch: u32) -> Self {
        ParallelConfig {
            tp,
            pp,
            dp,
            cp: 1,
            micro_batch,
            global_batch,
            zero: 0,
            recompute: Recompute::None,
            sequence_parallel: false,
            virtual_stages: 1,
            flash_attention: false,
            dtype: Dtype::Bf16,
            fp8: false,
            overlap_dp: true,
            overlap_tp: false,
            order: RankOrder::default(),
            first_stage_layers: None,
            last_stage_layers: None,
            dp_bucket: None,
        }
    }

    /// The layers of each pipeline stage: the explicit first/last sizes with the rest split
    /// evenly over the inner stages, or by default the layers spread as evenly as possible
    /// (126 layers on 16 stages: 7, 14 × 8, 7).
    pub fn stage_layers(&self, model: &ModelSpec) -> Result<StageLayers, Invalid> {
        let (l, pp) = (model.layers, self.pp);
        let bad = Invalid::PpLayers {
            pp,
            layers: l,
            first: self.first_stage_layers,
            last: self.last_stage_layers,
        };
        if pp == 0 || pp > l {
            return Err(bad);
        }
        if pp == 1 {
            if self.first_stage_layers.is_some_and(|f| f != l) || self.last_stage_layers.is_some_and(|x| x != l) {
                return Err(bad);
            }
            return Ok(StageLayers {
                pp,
                first: l,
                middle: l,
                last: l,
            });
        }
        let split = |first: u32, last: u32| -> Option<StageLayers> {
            let rest = l.checked_sub(first)?.checked_sub(last)?;
            let inner = pp - 2;
            let middle = if inner == 0 {
                (rest == 0).then_some(0)?
            } else {
                (rest % inner == 0 && rest > 0).then_some(rest / inner)?
            };
            (first > 0 && last > 0).then_some(StageLayers {
                pp,
                first,
                middle,
                last,
            })
        };
        match (self.first_stage_layers, self.last_stage_layers) {
            (None, None) if l % pp == 0 => Ok(StageLayers {
                pp,
                first: l / pp,
                middle: l / pp,
                last: l / pp,
            }),
            (None, None) => {
                // inner stages of ceil or floor(l / pp) layers, the rest shared by the two ends
                let best = [l.div_ceil(pp), l / pp]
                    .into_iter()
                    .filter_map(|m| {
                        let ends = l.checked_sub(m * (pp - 2))?;
                        split(ends / 2, ends - ends / 2)
                    })
                    .min_by_key(|s| {
                        let min = (0..pp).map(|i| s.of(i)).min().unwrap_or(0);
                        (s.max(), s.max() - min)
                    });
                best.ok_or(bad)
            }
            (Some(f), Some(x)) => split(f, x).ok_or(bad),
            (Some(f), None) => {
                // the other stages share the rest evenly
                let rest = l.checked_sub(f).ok_or(bad)?;
                (rest % (pp - 1) == 0)
                    .then(|| split(f, rest / (pp - 1)))
                    .flatten()
                    .ok_or(bad)
            }
            (None, Some(x)) => {
                let rest = l.checked_sub(x).ok_or(bad)?;
                (rest % (pp - 1) == 0)
                    .then(|| split(rest / (pp - 1), x))
                    .flatten()
                    .ok_or(bad)
            }
        }
    }

    /// Devices of the layout, `tp · cp · pp · dp` (saturating: [`check`](Self::check) refuses a
    /// product beyond u32).
    pub fn gpus(&self) -> u32 {
        self.product().min(u32::MAX as u64) as u32
    }

    fn product(&self) -> u64 {
        self.tp as u64 * self.cp as u64 * self.pp as u64 * self.dp as u64
    }

    /// The grid's sizes in words: `tp 4 × pp 8 × dp 32`, with `× cp N` after tp when cp > 1.
    pub fn grid(&self) -> String {
        let cp = if self.cp > 1 {
            format!(" × cp {}", self.cp)
        } else {
            String::new()
        };
        format!("tp {}{cp} × pp {} × dp {}", self.tp, self.pp, self.dp)
    }

    /// Tokens of each sequence one rank holds: `seq_len / cp`.
    pub fn local_seq(&self, model: &ModelSpec) -> u32 {
        model.seq_len / self.cp.max(1)
    }

    /// Ranks that hold the same weights and reduce their gradients together (and over which ZeRO
    /// shards): the data-parallel and context-parallel ranks, `dp · cp`.
    pub fn dp_cp(&self) -> u32 {
        self.dp * self.cp
    }

    /// Microbatches each pipeline runs per optimizer step (gradient accumulation steps).
    pub fn microbatches(&self) -> u32 {
        self.global_batch / (self.micro_batch * self.dp)
    }

    /// Check the layout against a model and a device count. Allocation-free, so the tuner can call
    /// it on millions of candidates.
    pub fn check(&self, model: &ModelSpec, gpus: u32) -> Result<(), Invalid> {
        for (v, f) in [
            (self.tp, "tp"),
            (self.pp, "pp"),
            (self.dp, "dp"),
            (self.cp, "cp"),
            (self.micro_batch, "micro-batch"),
            (self.global_batch, "global-batch"),
            (self.virtual_stages, "virtual-stages"),
        ] {
            if v == 0 {
                return Err(Invalid::ZeroSize(f));
            }
        }
        if self.zero > 3 {
            return Err(Invalid::Zero { zero: self.zero });
        }
        if self.overlap_tp && !self.sequence_parallel && self.tp > 1 {
            return Err(Invalid::OverlapTpNeedsSp);
        }
        if self.fp8 && self.dtype != Dtype::Bf16 {
            return Err(Invalid::Fp8NeedsBf16);
        }
        if self.product() > u32::MAX as u64 {
            return Err(Invalid::TooManyDevices {
                product: self.product(),
            });
        }
        if self.product() != gpus as u64 {
            return Err(Invalid::Product {
                tp: self.tp,
                pp: self.pp,
                dp: self.dp,
                cp: self.cp,
                gpus,
            });
        }
        if self.cp > 1 {
            if !self.flash_attention {
                return Err(Invalid::CpNeedsFlash);
            }
            if !model.seq_len.is_multiple_of(2 * self.cp) {
                return Err(Invalid::SeqCp {
                    seq_len: model.seq_len,
                    cp: self.cp,
                });
            }
        }
        if !model.heads.is_multiple_of(self.tp) {
            return Err(Invalid::TpHeads {
                tp: self.tp,
                heads: model.heads,
            });
        }
        if !model.kv_heads.is_multiple_of(self.tp) {
            return Err(Invalid::TpKvHeads {
                tp: self.tp,
                kv_heads: model.kv_heads,
            });
        }
        if !model.ffn_hidden.is_multiple_of(self.tp) {
            return Err(Invalid::TpFfn {
                tp: self.tp,
                ffn: model.ffn_hidden,
            });
        }
        let stages = self.stage_layers(model)?;
        if self.virtual_stages > 1 {
            if self.pp == 1 {
                return Err(Invalid::VirtualNeedsPp);
            }
            let per_stage = stages.interleave_slots().ok_or(Invalid::InterleaveUneven {
                pp: self.pp,
                layers: model.layers,
            })?;
            if per_stage % self.virtual_stages != 0 {
                return Err(Invalid::VirtualStages {
                    virtual_stages: self.virtual_stages,
                    layers_per_stage: per_stage,
                });
            }
        }
        let per_step = self.micro_batch as u64 * self.dp as u64;
        if !(self.global_batch as u64).is_multiple_of(per_step) {
            return Err(Invalid::Batch {
                global_batch: self.global_batch,
                micro_batch: self.micro_batch,
                dp: self.dp,
            });
        }
        if self.virtual_stages > 1 && !self.microbatches().is_multiple_of(self.pp) {
            return Err(Invalid::InterleaveMicrobatches {
                microbatches: self.microbatches(),
                pp: self.pp,
            });
        }
        if self.sequence_parallel {
            if self.tp == 1 {
                return Err(Invalid::SequenceParallelTp1);
            }
            if !self.local_seq(model).is_multiple_of(self.tp) {
                return Err(Invalid::SeqTp {
                    seq_len: self.local_seq(model),
                    tp: self.tp,
                });
            }
        }
        Ok(())
    }

    /// Size of one grid dimension.
    pub fn size(&self, d: Dim) -> u32 {
        match d {
            Dim::Tp => self.tp,
            Dim::Dp => self.dp,
            Dim::Pp => self.pp,
        }
    }

    /// Ranks one step of dimension `d` spans in the grid: its size, and for TP the `tp · cp`
    /// block (the context-parallel ranks sit right outside the tensor-parallel ones).
    fn span(&self, d: Dim) -> u32 {
        match d {
            Dim::Tp => self.tp * self.cp,
            _ => self.size(d),
        }
    }

    /// Rank distance between neighbours of a `d` group: the product of the spans of the
    /// dimensions inside `d` in the rank order.
    pub fn stride(&self, d: Dim) -> u32 {
        let mut s = 1;
        for x in self.order.0 {
            if x == d {
                return s;
            }
            s *= self.span(x);
        }
        unreachable!("a RankOrder holds every Dim")
    }

    /// Coordinates (tp, dp, pp) of a global rank (its context-parallel coordinate, with cp > 1,
    /// is `rank / stride(Tp) / tp % cp`).
    pub fn coords(&self, rank: u32) -> (u32, u32, u32) {
        let mut rest = rank;
        let mut c = [0u32; 3];
        for d in self.order.0 {
            let n = self.span(d);
            let v = rest % n;
            rest /= n;
            match d {
                Dim::Tp => c[0] = v % self.tp,
                Dim::Dp => c[1] = v,
                Dim::Pp => c[2] = v,
            }
        }
        (c[0], c[1], c[2])
    }

    /// The context-parallel coordinate of a global rank (0 without context parallelism).
    pub fn cp_coord(&self, rank: u32) -> u32 {
        rank / self.stride(Dim::Tp) / self.tp % self.cp
    }

    /// Global rank of coordinates (tp, cp, dp, pp).
    pub fn rank_cp(&self, tp: u32, cp: u32, dp: u32, pp: u32) -> u32 {
        self.rank(tp + cp * self.tp, dp, pp)
    }

    /// Global rank of coordinates (tp, dp, pp), context-parallel coordinate 0.
    pub fn rank(&self, tp: u32, dp: u32, pp: u32) -> u32 {
        let mut r = 0;
        for d in self.order.0.iter().rev() {
            let v = match d {
                Dim::Tp => tp,
                Dim::Dp => dp,
                Dim::Pp => pp,
            };
            r = r * self.span(*d) + v;
        }
        r
    }
}
