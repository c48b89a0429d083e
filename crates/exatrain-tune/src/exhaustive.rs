//! Exhaustive search of the whole space through the cost model, parallel over layout shapes.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use exatrain_cost::{plan, Plan};
use exatrain_spec::{ClusterSpec, ModelSpec, ParallelConfig, RankOrder};
use rayon::prelude::*;

use crate::space::{self, SpaceSpec};

/// A layout and its prediction.
#[derive(Debug, Clone, Copy)]
pub struct Ranked {
    pub cfg: ParallelConfig,
    pub plan: Plan,
}

/// What an exhaustive search saw and kept.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Layouts the cost model evaluated.
    pub evaluated: u64,
    /// Of those, the ones that fit in memory.
    pub feasible: u64,
    /// The best feasible layouts, fastest first.
    pub best: Vec<Ranked>,
}

/// A total order key for tie-breaking, so results do not depend on thread scheduling.
pub fn cfg_key(c: &ParallelConfig) -> u128 {
    let order = RankOrder::ALL.iter().position(|o| *o == c.order).unwrap_or(0) as u128;
    let mut k = c.tp as u128;
    for (v, bits) in [
        (c.pp as u128, 16),
        (c.dp as u128, 24),
        (c.micro_batch as u128, 16),
        (c.global_batch as u128, 24),
        (c.zero as u128, 2),
        (c.recompute as u128, 2),
        (c.sequence_parallel as u128, 1),
        (c.virtual_stages as u128, 8),
        (c.flash_attention as u128, 1),
        (order, 3),
        (c.cp as u128, 8),
    ] {
        k = (k << bits) | v;
    }
    k
}

/// Faster first; equal throughput broken by the config key.
pub fn better(a: &Ranked, b: &Ranked) -> Ordering {
    b.plan
        .tokens_per_s
        .total_cmp(&a.plan.tokens_per_s)
        .then_with(|| cfg_key(&a.cfg).cmp(&cfg_key(&b.cfg)))
}

/// The k best seen so far, kept sorted.
#[derive(Debug, Clone, Default)]
struct TopK {
    k: usize,
    items: Vec<Ranked>,
}

impl TopK {
    fn push(&mut self, r: Ranked) {
        if self.items.len() == self.k {
            if better(&r, self.items.last().expect("k > 0")) != Ordering::Less {
                return;
            }
            self.items.pop();
        }
        let at = self.items.partition_point(|x| better(x, &r) == Ordering::Less);
        self.items.insert(at, r);
    }

    fn merge(mut self, other: TopK) -> TopK {
        for r in other.items {
            self.push(r);
        }
        self
    }
}

/// Evaluate every layout of the space; keep the `top` fastest that fit. `progress` is called with
/// the number of layouts evaluated since its last call.
pub fn search(m: &ModelSpec, c: &ClusterSpec, s: &SpaceSpec, top: usize, progress: &(dyn Fn(u64) + Sync)) -> Summary {
    let top = top.max(1);
    let shapes: Vec<_> = space::shapes(m, s).collect();
    let evaluated = AtomicU64::new(0);
    let feasible = AtomicU64::new(0);
    let best = shapes
        .par_iter()
        .map(|shape| {
            let mut t = TopK {
                k: top,
                items: Vec::new(),
            };
            let (mut n, mut f) = (0u64, 0u64);
            for cfg in space::shape_configs(m, s, *shape) {
                n += 1;
                if let Ok(p) = plan(m, c, &cfg) {
                    if p.fits {
                        f += 1;
                        t.push(Ranked { cfg, plan: p });
                    }
                }
            }
            evaluated.fetch_add(n, AtomicOrdering::Relaxed);
            feasible.fetch_add(f, AtomicOrdering::Relaxed);
            progress(n);
            t
        })
        .reduce(
            || TopK {
                k: top,
                items: Vec::new(),
            },
            TopK::merge,
        );
    Summary {
        evaluated: evaluated.into_inner(),
        feasible: feasible.into_inner(),
        best: best.items,
    }
}

/// One point per device count: the best layout there (None where nothing fits).
#[derive(Debug, Clone)]
pub struct Point {
    pub gpus: u32,
    pub best: Option<Ranked>,
    pub evaluated: u64,
    pub feasible: u64,
    /// Why nothing runs there, when nothing does.
    pub why: Option<String>,
}

/// Best layout for each device count, and the Pareto front of throughput against devices:
/// the counts where no count at most as large gives higher throughput.
pub fn pareto(
    m: &ModelSpec,
    c: &ClusterSpec,
    s: &SpaceSpec,
    gpus: &[u32],
    progress: &(dyn Fn(u64) + Sync),
) -> (Vec<Point>, Vec<u32>) {
    let mut points = Vec::new();
    for &g in gpus {
        let sg = SpaceSpec { gpus: g, ..s.clone() };
        let r = search(m, c, &sg, 1, progress);
        let why = if r.best.is_empty() {
            Some(space::why_empty(m, &sg).unwrap_or_else(|| format!("no layout fits in memory on {g} GPUs")))
        } else {
            None
        };
        points.push(Point {
            gpus: g,
            best: r.best.first().copied(),
            evaluated: r.evaluated,
            feasible: r.feasible,
            why,
        });
    }
    let mut front = Vec::new();
    let mut best_so_far = 0.0;
    let mut sorted: Vec<&Point> = points.iter().collect();
    sorted.sort_by_key(|p| p.gpus);
    for p in sorted {
        if let Some(b) = &p.best {
            if b.plan.tokens_per_s > best_so_far {
                best_so_far = b.plan.tokens_per_s;
                front.push(p.gpus);
            }
        }
    }
    (points, front)
}
