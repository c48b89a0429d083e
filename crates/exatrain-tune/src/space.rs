//! The configuration space: every valid combination of sizes and switches, each distinct layout
//! once.
//!
//! Equivalent configs are dropped at the source: sequence parallelism only with tp > 1, ZeRO > 0
//! only with dp · cp > 1, interleaving only with pp > 1, selective recomputation not with flash
//! attention (flash stores no s×s tensor, so they are the same run), and rank orders that differ
//! only in where size-1 dimensions sit. By default ([`SpaceSpec::launchable`]) the space also
//! leaves out ZeRO-2/3 with pipeline parallelism, which no common framework runs. Context
//! parallelism (`cp` > 1, flash attention only) is considered only while each rank keeps at
//! least [`CP_MIN_LOCAL_SEQ`] tokens of a sequence, a pruning as `launchable` is one: shorter
//! shares run smaller attention kernels and more ring hops for activation memory that TP,
//! PP and recomputation also save (Megatron-LM recommends CP for long sequences).

use exatrain_spec::{Dim, Dtype, Framework, ModelSpec, ParallelConfig, RankOrder, Recompute, StageLayers};

/// The fewest tokens of a sequence a context-parallel rank keeps in the space (4096: with the
/// default seq_len of 2048-4096 the space has no context parallelism, at 8192 cp ≤ 2).
pub const CP_MIN_LOCAL_SEQ: u32 = 4096;

/// What to search over; [`SpaceSpec::new`] gives the whole space the planner understands.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpaceSpec {
    pub gpus: u32,
    /// Global batch sizes (sequences) to consider.
    pub global_batches: Vec<u32>,
    /// Largest micro-batch considered (all divisors of global_batch / dp up to this).
    pub max_micro_batch: u32,
    /// Largest tensor- and pipeline-parallel sizes considered (e.g. 1 and 1 for a trainer that
    /// runs data parallelism only).
    pub max_tp: u32,
    pub max_pp: u32,
    /// Largest context-parallel size considered (1: none); sizes keep at least
    /// [`CP_MIN_LOCAL_SEQ`] tokens per rank. A search stored before context parallelism was
    /// modelled reads as 1, so it resumes over the space it started with.
    #[serde(default = "one")]
    pub max_cp: u32,
    pub zero: Vec<u8>,
    pub recompute: Vec<Recompute>,
    pub sequence_parallel: Vec<bool>,
    pub flash_attention: Vec<bool>,
    /// Consider interleaved schedules (all virtual stage counts that divide the layers per stage).
    pub interleave: bool,
    pub orders: Vec<RankOrder>,
    pub dtype: Dtype,
    pub overlap_dp: bool,
    /// Only layouts the common frameworks run: ZeRO-2/3 only without pipeline parallelism
    /// (DeepSpeed's pipeline engine allows ZeRO-1 only; Megatron-LM has ZeRO-1 only).
    pub launchable: bool,
    /// Only layouts this framework can run ([`Framework::can_run`]), so that the best one can
    /// always be exported to it.
    #[serde(default)]
    pub framework: Option<Framework>,
    /// Also pipeline sizes that do not divide the layers (stages spread as evenly as possible,
    /// [`ParallelConfig::stage_layers`]); off by default, as in Megatron-LM without explicit
    /// first/last stage sizes.
    #[serde(default)]
    pub uneven: bool,
    /// Every layout runs the blocks' linear layers in FP8 (`ParallelConfig::fp8`; the cluster
    /// needs an FP8 peak, and only Megatron-LM is exported with it).
    #[serde(default)]
    pub fp8: bool,
}

fn one() -> u32 {
    1
}

impl SpaceSpec {
    pub fn new(gpus: u32, global_batch: u32) -> Self {
        SpaceSpec {
            gpus,
            global_batches: vec![global_batch],
            max_micro_batch: 16,
            max_tp: u32::MAX,
            max_pp: u32::MAX,
            max_cp: u32::MAX,
            zero: vec![0, 1, 2, 3],
            recompute: Recompute::ALL.to_vec(),
            sequence_parallel: vec![false, true],
            flash_attention: vec![false, true],
            interleave: true,
            orders: RankOrder::ALL.to_vec(),
            dtype: Dtype::Bf16,
            overlap_dp: true,
            launchable: true,
            framework: None,
            uneven: false,
            fp8: false,
        }
    }
}

fn divisors(n: u32) -> impl Iterator<Item = u32> {
    (1..=n).filter(move |d| n.is_multiple_of(*d))
}

/// The sizes of one layout; the switches vary on top of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub cp: u32,
    pub global_batch: u32,
    pub micro_batch: u32,
}

/// The options that apply to one shape, and their product.
struct Options {
    shape: Shape,
    zero: Vec<u8>,
    attention: Vec<(Recompute, bool)>,
    sp: Vec<bool>,
    virtual_stages: Vec<u32>,
    orders: Vec<RankOrder>,
}

impl Options {
    fn count(&self) -> usize {
        self.zero.len() * self.attention.len() * self.sp.len() * self.virtual_stages.len() * self.orders.len()
    }

    /// The i-th combination (mixed radix).
    fn get(&self, mut i: usize, s: &SpaceSpec) -> ParallelConfig {
        let mut pick = |n: usize| {
            let k = i % n;
            i /= n;
            k
        };
        let zero = self.zero[pick(self.zero.len())];
        let (recompute, flash_attention) = self.attention[pick(self.attention.len())];
        let sequence_parallel = self.sp[pick(self.sp.len())];
        let virtual_stages = self.virtual_stages[pick(self.virtual_stages.len())];
        let order = self.orders[pick(self.orders.len())];
        let Shape {
            tp,
            pp,
            dp,
            cp,
            global_batch,
            micro_batch,
        } = self.shape;
        ParallelConfig {
            tp,
            pp,
            dp,
            cp,
            micro_batch,
            global_batch,
            zero,
            recompute,
            sequence_parallel,
            virtual_stages,
            flash_attention,
            dtype: s.dtype,
            fp8: s.fp8,
            overlap_dp: s.overlap_dp,
            overlap_tp: false,
            order,
            first_stage_layers: None,
            last_stage_layers: None,
            dp_bucket: None,
        }
    }
}

/// Orders that place the dimensions of size > 1 differently: one representative each.
fn distinct_orders(orders: &[RankOrder], tp: u32, pp: u32, dp: u32) -> Vec<RankOrder> {
    let size = |d: Dim| match d {
        Dim::Tp => tp,
        Dim::Dp => dp,
        Dim::Pp => pp,
    };
    let mut keys: Vec<Vec<Dim>> = Vec::new();
    let mut out = Vec::new();
    for o in orders {
        let key: Vec<Dim> = o.0.iter().copied().filter(|d| size(*d) > 1).collect();
        if !keys.contains(&key) {
            keys.push(key);
            out.push(*o);
        }
    }
    out
}

/// The context-parallel sizes of the space for a model: 1, and the sizes up to `max_cp` that
/// split a sequence into `2·cp` equal chunks of at least [`CP_MIN_LOCAL_SEQ`] tokens per rank.
pub fn cp_sizes(m: &ModelSpec, s: &SpaceSpec) -> Vec<u32> {
    let with_flash = s.flash_attention.contains(&true);
    (1..=s.max_cp.min(m.seq_len))
        .filter(|&cp| cp == 1 || (with_flash && m.seq_len.is_multiple_of(2 * cp) && m.seq_len / cp >= CP_MIN_LOCAL_SEQ))
        .collect()
}

/// The (tp, cp, pp, dp, global batch, micro-batch) shapes that divide the model and the batch.
pub fn shapes<'a>(m: &'a ModelSpec, s: &'a SpaceSpec) -> impl Iterator<Item = Shape> + 'a {
    let gpus = s.gpus;
    divisors(gpus)
        .filter(move |tp| {
            *tp <= s.max_tp
                && m.heads.is_multiple_of(*tp)
                && m.kv_heads.is_multiple_of(*tp)
                && m.ffn_hidden.is_multiple_of(*tp)
        })
        .flat_map(move |tp| {
            cp_sizes(m, s)
                .into_iter()
                .filter(move |cp| (gpus / tp).is_multiple_of(*cp))
                .map(move |cp| (tp, cp))
        })
        .flat_map(move |(tp, cp)| {
            divisors(gpus / tp / cp)
                .filter(move |pp| *pp <= s.max_pp && (m.layers.is_multiple_of(*pp) || (s.uneven && *pp <= m.layers)))
                .map(move |pp| (tp, cp, pp, gpus / tp / cp / pp))
        })
        .flat_map(move |(tp, cp, pp, dp)| {
            s.global_batches
                .iter()
                .filter(move |gb| *gb % dp == 0)
                .flat_map(move |&gb| {
                    divisors(gb / dp)
                        .filter(move |mb| *mb <= s.max_micro_batch)
                        .map(move |micro_batch| Shape {
                            tp,
                            pp,
                            dp,
                            cp,
                            global_batch: gb,
                            micro_batch,
                        })
                })
        })
}

fn options(m: &ModelSpec, s: &SpaceSpec, shape: Shape) -> Options {
    let Shape {
        tp,
        pp,
        dp,
        cp,
        global_batch,
        micro_batch,
    } = shape;
    // ZeRO shards over the dp · cp ranks that hold the same weights
    let zero: Vec<u8> = if dp * cp == 1 {
        vec![0]
    } else {
        s.zero
            .iter()
            .copied()
            .filter(|z| *z <= 3 && !(s.launchable && pp > 1 && *z >= 2))
            .collect()
    };
    let mut attention = Vec::new();
    for &flash in &s.flash_attention {
        for &r in &s.recompute {
            // context parallelism runs flash attention only
            if !(flash && r == Recompute::Selective) && (flash || cp == 1) {
                attention.push((r, flash));
            }
        }
    }
    let sp: Vec<bool> = if tp == 1 || !(m.seq_len / cp).is_multiple_of(tp) {
        vec![false]
    } else {
        s.sequence_parallel.clone()
    };
    let microbatches = global_batch / (micro_batch * dp);
    // interleaving needs equal stages, or (Megatron-LM's split that counts the embedding and the
    // loss as layers) inner stages one layer longer than the two ends: the default split's slots
    let per_stage = StageLayers::default_interleave_slots(m, pp);
    let virtual_stages: Vec<u32> = match per_stage {
        Some(per) if pp > 1 && s.interleave && microbatches % pp == 0 => divisors(per).collect(),
        _ => vec![1],
    };
    Options {
        shape,
        zero,
        attention,
        sp,
        virtual_stages,
        orders: distinct_orders(&s.orders, tp * cp, pp, dp),
    }
}

/// Every valid, distinct layout of one shape, lazily.
pub fn shape_configs<'a>(
    m: &'a ModelSpec,
    s: &'a SpaceSpec,
    shape: Shape,
) -> impl Iterator<Item = ParallelConfig> + 'a {
    let o = options(m, s, shape);
    (0..o.count())
        .map(move |i| o.get(i, s))
        .filter(move |c| c.check(m, s.gpus).is_ok())
        .filter(move |c| s.framework.is_none_or(|f| f.can_run(m, c).is_ok()))
}

/// Every valid, distinct layout of the space, lazily.
pub fn configs<'a>(m: &'a ModelSpec, s: &'a SpaceSpec) -> impl Iterator<Item = ParallelConfig> + 'a {
    shapes(m, s).flat_map(move |shape| shape_configs(m, s, shape))
}

/// Why a device count admits no layout at all, in words (None when some layout exists).
pub fn why_empty(m: &ModelSpec, s: &SpaceSpec) -> Option<String> {
    if configs(m, s).next().is_some() {
        return None;
    }
    if let Some(f) = s.framework {
        let any = SpaceSpec {
            framework: None,
            ..s.clone()
        };
        let first = configs(m, &any).next();
        if let Some(c) = first {
            let why = f.can_run(m, &c).err().unwrap_or_default();
            return Some(format!(
                "{f} can run none of the layouts of {} GPUs (e.g. tp {} pp {} dp {}: {why})",
                s.gpus, c.tp, c.pp, c.dp
            ));
        }
    }
    let gpus = s.gpus;
    let cells: Vec<String> = divisors(gpus)
        .filter(|tp| m.heads.is_multiple_of(*tp) && m.kv_heads.is_multiple_of(*tp) && m.ffn_hidden.is_multiple_of(*tp))
        .flat_map(|tp| {
            divisors(gpus / tp)
                .filter(|pp| m.layers.is_multiple_of(*pp))
                .map(move |pp| (tp, pp))
        })
        .map(|(tp, pp)| format!("({tp}, {pp}, {})", gpus / tp / pp))
        .collect();
    let batches: Vec<String> = s.global_batches.iter().map(|g| g.to_string()).collect();
    let shown = if cells.len() > 6 {
        format!("{}, … ({} in all)", cells[..6].join(", "), cells.len())
    } else {
        cells.join(", ")
    };
    Some(format!(
        "no (tp, pp) divides {} layers and {} heads into {gpus} GPUs with a data-parallel size that divides global batch {} into micro-batches ≤ {} (candidates (tp, pp, dp): {})",
        m.layers,
        m.heads,
        batches.join(", "),
        s.max_micro_batch,
        shown
    ))
}
