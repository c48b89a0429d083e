//! Search over expensive black boxes: Bayesian optimization in the spirit of DeepHyper's CBO, and
//! random search as the baseline.
//!
//! - Surrogate: a GP (default) or extra-trees on a numeric encoding of the layout (log2 sizes,
//!   switches, the position of each dimension in the rank order, a few derived quantities such
//!   as the bubble fraction and, given an [`Encoding`] of the model and machine sizes, textbook
//!   memory estimates); the target is ln(throughput).
//! - Mean: with an [`Encoding`] and no prior, a textbook step-time model whose machine constants
//!   are refitted to the trials at every proposal ([`crate::trend`]); the surrogate learns the
//!   residual ln(measured) − ln(trend), so one knob away from the incumbent it predicts what the
//!   terms say (tp 2 → 1 drops the TP bytes) instead of falling back to the average of the
//!   trials. `trend: false` keeps a constant mean.
//! - Acquisition: UCB `μ + κ·σ` plus ln P(runs). Local proposals (two in three) maximize it over
//!   a random subspace of one or two knobs through the best layout seen (LineBO; the knobs that
//!   depend on them follow, as sequence parallelism does when tp becomes 1), with κ
//!   decaying from `kappa` to `kappa_final` over the budget; global ones over a random pool of
//!   the whole space plus hill-climbs from it, at a fixed, exploring `kappa_global`, so the
//!   search keeps looking for other basins (ZeRO-3 without a pipeline vs. Megatron TP × PP).
//! - Random layouts (initial design, pools, the random strategy) pick each knob uniformly
//!   among its valid values, as a configuration-space sampler does.
//! - Failures are observations too. Out of memory is learned by a monotone threshold on the
//!   memory estimate ([`crate::fits`]) when there is one; other failures (and, without an
//!   estimate, out of memory too) by a GP classifier on the encoding. The initial design keeps a
//!   random layout with the probability that it fits.
//! - Parallel trials: q workers; while trials are pending, the surrogate sees them at the worst
//!   observed value (constant liar, CL-min), so concurrent proposals spread out.
//! - Prior (optional): a cost model's prediction for every layout. The initial design is then
//!   the model's best layouts instead of random ones, and the surrogate learns the residual
//!   ln(measured) − ln(predicted), so an untried layout is expected to do what the model says,
//!   corrected by what the trials so far taught.
//! - Reproducible: proposal i draws from an RNG seeded by (seed, i); with one worker a seed
//!   fixes the whole search, and a resumed search proposes what the uninterrupted one would have.

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::Instant;

use exatrain_spec::{Dim, ParallelConfig, SpecError};

use crate::eval::{Evaluator, Outcome};
use crate::exhaustive::cfg_key;
use crate::fits::Fits;
use crate::forest::Forest;
use crate::gp::Gp;
use crate::trend::{self, Trend, TERMS};

/// The surrogate model of the objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surrogate {
    /// Gaussian process with an exponential kernel on the encoding (the default).
    Gp,
    /// Extremely randomized trees (DeepHyper's default surrogate).
    ExtraTrees,
}

enum Model {
    Gp(Gp),
    Trees(Forest),
}

impl Model {
    fn predict(&self, x: &[f64]) -> (f64, f64) {
        match self {
            Model::Gp(g) => g.predict(x),
            Model::Trees(f) => f.predict(x),
        }
    }
}

/// GP length scales per feature of [`features`] (starting points for the marginal-likelihood fit):
/// one doubling of a size, one ZeRO stage, one recompute level, a switch, a rank-order position
/// each count about as one unit; the bubble fraction varies on a scale of ~0.3.
const LENGTHS: [f64; LAYOUT_FEATURES + 4] = [
    1.5, 1.5, 3.0, 1.5, 1.5, 1.5, 1.5, 1.5, 2.0, 1.0, 2.0, 2.0, 2.0, 0.3, 1.5, 1.5, 1.5, 1.5, 1.5, 1.0, 1.0, 1.0, 1.0,
];
use crate::store::Trial;

/// Trials that must have run before the trend is fitted.
const TREND_MIN: usize = 3;

/// Which search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Bayes,
    Random,
}

/// Search settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub strategy: Strategy,
    pub surrogate: Surrogate,
    /// Total trials (including resumed ones).
    pub budget: usize,
    /// Random trials before the surrogate takes over.
    pub initial: usize,
    pub seed: u64,
    /// Trials run at once.
    pub parallel: usize,
    /// UCB κ of local proposals, decaying from `kappa` to `kappa_final` over the budget.
    pub kappa: f64,
    pub kappa_final: f64,
    /// UCB κ of global proposals (fixed: they are there to find other basins).
    pub kappa_global: f64,
    pub trees: usize,
    /// Random candidates scored by a global proposal.
    pub pool: usize,
    /// Every n-th proposal is global (the rest search a random subspace through the incumbent).
    pub global_every: u64,
    /// Knobs a local proposal draws to change (1..=radius distinct ones, the others held).
    pub radius: usize,
    /// ln(predicted throughput) per layout of the space (same order), NaN where the model
    /// expects it not to run; None for a cold start.
    pub prior: Option<Vec<f64>>,
    /// The model and machine sizes behind the memory features; None: layout features only.
    pub encoding: Option<Encoding>,
    /// Without a prior but with an encoding: the surrogate's mean is a textbook step-time model
    /// whose machine constants are fitted to the trials ([`crate::trend`]); false: a constant.
    pub trend: bool,
}

impl Settings {
    pub fn new(strategy: Strategy, budget: usize, seed: u64) -> Self {
        Settings {
            strategy,
            surrogate: Surrogate::Gp,
            budget,
            initial: 10,
            seed,
            parallel: 1,
            kappa: 1.96,
            kappa_final: 0.05,
            kappa_global: 3.0,
            trees: 40,
            pool: 2000,
            global_every: 3,
            radius: 2,
            prior: None,
            encoding: None,
            trend: true,
        }
    }
}

/// What the encoding knows about the problem beyond the layout: the model's sizes and the
/// machine's device memory and node size, read from the specs the user gave (never from the
/// objective). With it, [`features`] adds textbook estimates of memory per device (the ZeRO
/// paper's 2 + 2 + 12 bytes per parameter, Korthikanti et al.'s activation bytes per layer) and
/// whether the tensor-parallel group stays inside a node, so the feasibility model sees out of
/// memory as a threshold on one or two numbers instead of a pattern over eight knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Encoding {
    /// parameters of the whole model
    pub params: f64,
    pub layers: f64,
    pub hidden: f64,
    pub heads: f64,
    pub seq: f64,
    /// device memory, bytes
    pub device_bytes: f64,
    pub devices_per_node: u32,
}

impl Encoding {
    pub fn new(m: &exatrain_spec::ModelSpec, c: &exatrain_spec::ClusterSpec) -> Self {
        Encoding {
            params: m.params() as f64,
            layers: m.layers as f64,
            hidden: m.hidden as f64,
            heads: m.heads as f64,
            seq: m.seq_len as f64,
            device_bytes: c.device.hbm_gib * (1u64 << 30) as f64,
            devices_per_node: c.node.devices,
        }
    }

    /// Whether the `dim` groups of a layout each lie inside one node (the ranks a group spans,
    /// size × stride, fit in a node).
    pub fn inside_node(&self, c: &ParallelConfig, dim: Dim) -> bool {
        c.size(dim) * c.stride(dim) <= self.devices_per_node
    }

    /// (ln static bytes, ln activation bytes, ln their sum) per device relative to its memory,
    /// and 1 when the TP group lies inside a node.
    fn estimates(&self, c: &ParallelConfig) -> [f64; 4] {
        use exatrain_spec::Recompute;
        // ZeRO shards over the dp · cp ranks that hold the same weights
        let (tp, pp, dp) = (c.tp as f64, c.pp as f64, c.dp_cp() as f64);
        let split = |stage: u8| if c.zero >= stage { dp } else { 1.0 };
        let weights = self.params / (tp * pp);
        let stat = weights * (2.0 / split(3) + 2.0 / split(2) + 12.0 / split(1));
        // one layer, one micro-batch: s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes, all of it /t with SP;
        // the attention-score term goes with selective recompute or flash attention; full
        // recompute keeps the block's input only.
        let sbh = self.seq / c.cp as f64 * c.micro_batch as f64 * self.hidden;
        let scores = match (c.recompute, c.flash_attention) {
            (Recompute::None, false) => 5.0 * self.heads * self.seq / self.hidden / tp,
            _ => 0.0,
        };
        let per_layer = match c.recompute {
            Recompute::Full => 2.0 * sbh / if c.sequence_parallel { tp } else { 1.0 },
            _ if c.sequence_parallel => sbh * (34.0 / tp + scores),
            _ => sbh * (10.0 + 24.0 / tp + scores),
        };
        let in_flight = (c.microbatches() as f64).min(pp);
        let act = per_layer * self.layers / pp * in_flight;
        let inside = self.inside_node(c, Dim::Tp);
        let rel = |b: f64| (b / self.device_bytes).ln();
        [rel(stat), rel(act), rel(stat + act), inside as u8 as f64]
    }
}

/// Columns of [`features`] read from the layout alone; the four of [`Encoding::estimates`] follow.
const LAYOUT_FEATURES: usize = 19;
/// The column of [`features`] with ln(estimated memory per device / device memory): the third
/// estimate.
const MEMORY_FEATURE: usize = LAYOUT_FEATURES + 2;

/// Numeric encoding of a layout for the surrogate (the last four columns are zero without an
/// [`Encoding`]).
pub fn features(c: &ParallelConfig, enc: Option<&Encoding>) -> Vec<f64> {
    let l2 = |x: u32| (x as f64).log2();
    let pos = |d: Dim| c.order.0.iter().position(|x| *x == d).unwrap_or(0) as f64;
    let mut f = vec![
        l2(c.tp),
        l2(c.pp),
        l2(c.dp),
        l2(c.micro_batch),
        l2(c.global_batch),
        c.zero as f64,
        c.recompute as u8 as f64,
        c.sequence_parallel as u8 as f64,
        l2(c.virtual_stages),
        c.flash_attention as u8 as f64,
        pos(Dim::Tp),
        pos(Dim::Dp),
        pos(Dim::Pp),
        // Derived from the layout alone (no cost model): what a practitioner knows matters.
        // Pipeline bubble fraction (p − 1)/(v·m):
        (c.pp as f64 - 1.0) / (c.virtual_stages as f64 * c.microbatches() as f64),
        // how many ways the weights and the optimizer state are split:
        l2(c.tp * c.pp) + if c.zero >= 3 { l2(c.dp_cp()) } else { 0.0 },
        l2(c.tp * c.pp) + if c.zero >= 1 { l2(c.dp_cp()) } else { 0.0 },
        // activation pressure: micro-batch, TP/SP sharding, recomputation, microbatches in flight
        l2(c.micro_batch)
            - l2(c.tp) * if c.sequence_parallel { 1.0 } else { 0.7 }
            - match (c.recompute, c.flash_attention) {
                (exatrain_spec::Recompute::Full, _) => 3.0,
                (exatrain_spec::Recompute::Selective, _) | (_, true) => 1.0,
                _ => 0.0,
            }
            + l2(c.microbatches().min(c.pp))
            - l2(c.pp)
            - l2(c.cp),
        l2(c.microbatches()),
        l2(c.cp),
    ];
    debug_assert_eq!(f.len(), LAYOUT_FEATURES);
    f.extend(enc.map_or([0.0; 4], |e| e.estimates(c)));
    f
}

fn rng_for(seed: u64, proposal: u64) -> fastrand::Rng {
    // SplitMix64 of (seed, proposal) so neighbouring proposals get unrelated streams.
    let mut z = seed ^ proposal.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    fastrand::Rng::with_seed(z ^ (z >> 31))
}

/// The knobs in the order a random layout picks them, each a set of [`features`] columns: tp,
/// pp, global batch, micro-batch, ZeRO, attention mode (recompute × flash), sequence
/// parallelism, virtual stages, rank order, context parallelism (dp follows from tp, pp and cp).
const KNOB_COLUMNS: [&[usize]; 10] = [&[0], &[1], &[4], &[3], &[5], &[6, 9], &[7], &[8], &[10, 11, 12], &[18]];
/// The global batch's place in [`KNOB_COLUMNS`]: a local move may always change it, since a
/// change of dp may leave the old one indivisible.
const GLOBAL_BATCH_KNOB: usize = 2;

/// The space as a tree of knob values (root: tp; leaves: layouts), so a random layout can pick
/// each knob uniformly among the values valid given the ones above it, as a configuration-space
/// sampler (ConfigSpace, DeepHyper) does. Uniform over layouts instead would favour the shapes
/// with many switch combinations (deep pipelines with many interleavings and rank orders).
enum Knobs {
    Node(Vec<Knobs>),
    Leaf(usize),
}

impl Knobs {
    fn build(x: &[Vec<f64>], idx: Vec<usize>, depth: usize) -> Knobs {
        if depth == KNOB_COLUMNS.len() || idx.len() == 1 {
            return Knobs::Leaf(idx[0]);
        }
        let cols = KNOB_COLUMNS[depth];
        let key = |i: usize| cols.iter().map(|&c| x[i][c]).collect::<Vec<f64>>();
        let mut groups: Vec<(Vec<f64>, Vec<usize>)> = Vec::new();
        for i in idx {
            let k = key(i);
            match groups.iter_mut().find(|g| g.0 == k) {
                Some(g) => g.1.push(i),
                None => groups.push((k, vec![i])),
            }
        }
        Knobs::Node(groups.into_iter().map(|g| Knobs::build(x, g.1, depth + 1)).collect())
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> usize {
        match self {
            Knobs::Leaf(i) => *i,
            Knobs::Node(c) => c[rng.usize(..c.len())].sample(rng),
        }
    }
}

/// The search state: the space, its encodings, what has been seen.
struct State<'a> {
    knobs: Knobs,
    space: &'a [ParallelConfig],
    x: Vec<Vec<f64>>,
    keys: Vec<u128>,
    settings: &'a Settings,
    /// (space index, ln value or None for a failure, whether it ran out of memory)
    done: Vec<(usize, Option<f64>, bool)>,
    taken: HashSet<u128>,
    /// ln(predicted throughput) per layout; all zeros without a prior
    prior: Vec<f64>,
    /// The textbook terms of every layout, when the mean is a fitted trend.
    terms: Option<Vec<[f64; TERMS]>>,
}

impl<'a> State<'a> {
    /// A search that has seen nothing yet; `prior` holds one ln value per layout (zeros for none).
    fn new(space: &'a [ParallelConfig], settings: &'a Settings, prior: Vec<f64>) -> Self {
        let x: Vec<Vec<f64>> = space.iter().map(|c| features(c, settings.encoding.as_ref())).collect();
        let terms = match (&settings.encoding, &settings.prior, settings.trend) {
            (Some(e), None, true) => Some(space.iter().map(|c| trend::terms(e, c)).collect()),
            _ => None,
        };
        State {
            terms,
            knobs: Knobs::build(&x, (0..space.len()).collect(), 0),
            keys: space.iter().map(cfg_key).collect(),
            x,
            space,
            settings,
            done: Vec::new(),
            taken: HashSet::new(),
            prior,
        }
    }

    fn index_of(&self, c: &ParallelConfig) -> Option<usize> {
        let k = cfg_key(c);
        self.keys.iter().position(|x| *x == k)
    }

    fn random_free(&self, rng: &mut fastrand::Rng) -> Option<usize> {
        if self.taken.len() >= self.space.len() {
            return None;
        }
        // Knob by knob; when the subtree drawn is used up, uniformly over what is left.
        for _ in 0..64 {
            let i = self.knobs.sample(rng);
            if !self.taken.contains(&self.keys[i]) {
                return Some(i);
            }
        }
        loop {
            let i = rng.usize(..self.space.len());
            if !self.taken.contains(&self.keys[i]) {
                return Some(i);
            }
        }
    }

    /// Layouts at most `radius` knobs of [`KNOB_COLUMNS`] away from `i` (attention mode is one
    /// knob since flash excludes selective); a change of the global batch alone does not count,
    /// it follows from dp.
    fn neighbours(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let xi = &self.x[i];
        self.x.iter().enumerate().filter_map(move |(j, xj)| {
            let moved = KNOB_COLUMNS
                .iter()
                .enumerate()
                .filter(|(k, cols)| *k != GLOBAL_BATCH_KNOB && cols.iter().any(|&f| xi[f] != xj[f]))
                .count();
            (j != i && moved <= self.settings.radius).then_some(j)
        })
    }

    /// The untried layouts through `b` along the knobs `free`: for each combination of their
    /// values other than `b`'s, the layouts that keep as many of the other knobs as the space
    /// allows (a conditional knob follows: tp 2 → 1 drops sequence parallelism, pp 2 → 1 drops
    /// interleaving, pp 1 → 2 may need a lower ZeRO stage).
    fn subspace(&self, b: usize, free: &[usize]) -> Vec<usize> {
        let xb = &self.x[b];
        let differs = |j: usize, cols: &[usize]| cols.iter().any(|&c| self.x[j][c] != xb[c]);
        let mut groups: std::collections::HashMap<Vec<u64>, (usize, Vec<usize>)> = Default::default();
        for j in (0..self.space.len()).filter(|j| !self.taken.contains(&self.keys[*j])) {
            if !free.iter().any(|&k| differs(j, KNOB_COLUMNS[k])) {
                continue; // not a move along the free knobs
            }
            let key: Vec<u64> = free
                .iter()
                .flat_map(|&k| KNOB_COLUMNS[k].iter().map(move |&c| self.x[j][c].to_bits()))
                .collect();
            let moved = KNOB_COLUMNS
                .iter()
                .enumerate()
                .filter(|(k, cols)| !free.contains(k) && differs(j, cols))
                .count();
            let g = groups.entry(key).or_insert((usize::MAX, Vec::new()));
            if moved < g.0 {
                *g = (moved, vec![j]);
            } else if moved == g.0 {
                g.1.push(j);
            }
        }
        let mut out: Vec<usize> = groups.into_values().flat_map(|g| g.1).collect();
        out.sort_unstable();
        out
    }

    /// The memory threshold model fitted to the trials so far; None without an [`Encoding`].
    fn fits(&self) -> Option<Fits> {
        self.settings.encoding?;
        let obs: Vec<(f64, bool)> = self
            .done
            .iter()
            .filter(|d| d.1.is_some() || d.2)
            .map(|&(i, v, _)| (self.x[i][MEMORY_FEATURE], v.is_some()))
            .collect();
        Some(Fits::fit(&obs))
    }

    /// ln(throughput) of every layout by the textbook trend fitted to the trials that ran; None
    /// without terms or before [`TREND_MIN`] trials ran.
    fn trend(&self) -> Option<Vec<f64>> {
        let terms = self.terms.as_ref()?;
        let (rows, secs): (Vec<[f64; TERMS]>, Vec<f64>) = self
            .done
            .iter()
            .filter_map(|&(i, v, _)| v.map(|v| (terms[i], (-v).exp())))
            .unzip();
        if rows.len() < TREND_MIN {
            return None;
        }
        let fit = Trend::fit(&rows, &secs)?;
        let ln: Vec<Option<f64>> = terms.iter().map(|t| fit.ln_throughput(t)).collect();
        let floor = ln.iter().flatten().cloned().fold(f64::INFINITY, f64::min);
        Some(ln.into_iter().map(|v| v.unwrap_or(floor)).collect())
    }

    /// The untried layout the prior rates best (ties: the smaller key).
    fn best_by_prior(&self) -> Option<usize> {
        (0..self.space.len())
            .filter(|i| !self.taken.contains(&self.keys[*i]))
            .max_by(|a, b| {
                self.prior[*a]
                    .total_cmp(&self.prior[*b])
                    .then_with(|| self.keys[*b].cmp(&self.keys[*a]))
            })
    }

    /// Proposal number `n`, with `pending` space indices still running.
    fn propose(&self, n: u64, pending: &[usize]) -> Option<usize> {
        let mut rng = rng_for(self.settings.seed, n);
        if self.settings.strategy == Strategy::Random {
            return self.random_free(&mut rng);
        }
        let any_ran = self.done.iter().any(|d| d.1.is_some());
        if self.done.len() + pending.len() < self.settings.initial || !any_ran {
            return match (&self.settings.prior, self.fits()) {
                (Some(_), _) => self.best_by_prior(),
                (None, None) => self.random_free(&mut rng),
                // a random layout, kept with the probability that it fits (a few draws at most)
                (None, Some(f)) => {
                    let mut pick = self.random_free(&mut rng);
                    for _ in 0..50 {
                        match pick {
                            Some(i) if rng.f64() > f.p(self.x[i][MEMORY_FEATURE]) => pick = self.random_free(&mut rng),
                            _ => break,
                        }
                    }
                    pick
                }
            };
        }
        // Targets are residuals from the prior, or from the fitted trend (the plain ln values
        // without either).
        let trend = self.trend();
        let prior: &[f64] = trend.as_deref().unwrap_or(&self.prior);
        let successes: Vec<f64> = self
            .done
            .iter()
            .filter_map(|&(i, v, _)| v.map(|v| v - prior[i]))
            .collect();
        let lo = successes.iter().cloned().fold(f64::INFINITY, f64::min);
        // Two surrogates: ln(throughput) on the trials that ran (pending ones at the worst value:
        // the constant liar), and the probability that a layout runs at all (fits, does not crash).
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut xf = Vec::new();
        let mut yf = Vec::new();
        // With a memory estimate, out of memory is the monotone threshold model's to learn and
        // the GP classifier learns the other failures only.
        let fits = self.fits();
        for &(i, v, oom) in &self.done {
            if let Some(v) = v {
                xs.push(self.x[i].clone());
                ys.push(v - prior[i]);
            }
            xf.push(self.x[i].clone());
            yf.push(if v.is_some() || (oom && fits.is_some()) {
                1.0
            } else {
                0.0
            });
        }
        for &i in pending {
            xs.push(self.x[i].clone());
            ys.push(lo);
        }
        let model = |x: &[Vec<f64>], y: &[f64], rng: &mut fastrand::Rng| match self.settings.surrogate {
            Surrogate::Gp => Model::Gp(Gp::fit_ard(x, y, &LENGTHS, 1e-3)),
            Surrogate::ExtraTrees => Model::Trees(Forest::fit(x, y, self.settings.trees, 1, rng)),
        };
        let value = model(&xs, &ys, &mut rng);
        let runs = model(&xf, &yf, &mut rng);
        let progress = (n as f64 / self.settings.budget.max(1) as f64).min(1.0);
        let global = self.settings.global_every > 0 && n % self.settings.global_every == self.settings.global_every - 1;
        let kappa = if global {
            self.settings.kappa_global
        } else {
            self.settings.kappa * (self.settings.kappa_final / self.settings.kappa).powf(progress)
        };
        let score = |i: usize| {
            let (residual, sigma) = value.predict(&self.x[i]);
            let mu = prior[i] + residual;
            // Optimistic about feasibility too: an untried region is not written off.
            let (p_run, p_sigma) = runs.predict(&self.x[i]);
            let p_fit = fits.map_or(1.0, |f| f.p(self.x[i][MEMORY_FEATURE]));
            mu + kappa * sigma + (p_run + kappa * p_sigma).clamp(0.01, 1.0).ln() + p_fit.max(0.01).ln()
        };

        // Local proposals search a random subspace through the incumbent (as LineBO, Kirschner
        // et al. 2019): the untried layouts that differ from it in at most `radius` knobs drawn at
        // random (dp and the global batch follow). Drawing knobs, not layouts, spends local
        // trials evenly over the knobs instead of in proportion to how many values each has (a
        // deep pipeline has dozens of interleavings and rank orders). Every `global_every`-th
        // proposal scores a random pool of the whole space plus hill-climbs of the acquisition
        // from it, so the search can leave a basin.
        let mut best: Vec<(usize, f64)> = self.done.iter().filter_map(|&(i, v, _)| v.map(|v| (i, v))).collect();
        best.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut scored: Vec<(usize, f64)> = Vec::new();
        if let (false, Some(&(b, _))) = (global, best.first()) {
            for _ in 0..16 {
                let count = rng.usize(1..=self.settings.radius.max(1));
                let free: Vec<usize> = (0..count)
                    .map(|_| rng.usize(..KNOB_COLUMNS.len()))
                    .chain([GLOBAL_BATCH_KNOB])
                    .collect();
                scored.extend(self.subspace(b, &free).into_iter().map(|j| (j, score(j))));
                if !scored.is_empty() {
                    break;
                }
            }
        }
        if scored.is_empty() {
            let mut pool: Vec<(usize, f64)> = (0..self.settings.pool)
                .filter_map(|_| self.random_free(&mut rng))
                .map(|i| (i, score(i)))
                .collect();
            pool.sort_by(|a, b| b.1.total_cmp(&a.1));
            for &(start, start_score) in pool.iter().take(3) {
                let (mut at, mut at_score) = (start, start_score);
                for _ in 0..8 {
                    let step = self
                        .neighbours(at)
                        .filter(|j| !self.taken.contains(&self.keys[*j]))
                        .map(|j| (j, score(j)))
                        .max_by(|a, b| a.1.total_cmp(&b.1));
                    match step {
                        Some((j, sj)) if sj > at_score => (at, at_score) = (j, sj),
                        _ => break,
                    }
                }
                scored.push((at, at_score));
            }
            scored.extend(pool);
        }
        let pick = scored
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| self.keys[b.0].cmp(&self.keys[a.0])));
        pick.map(|p| p.0).or_else(|| self.random_free(&mut rng))
    }
}

/// Run a search over `space` until `settings.budget` trials have finished. `history` holds the
/// trials of a resumed search (they are not re-run); `record` is called on each new trial as it
/// finishes (append it to the store there) and may stop the search with an error.
pub fn run(
    space: &[ParallelConfig],
    eval: &dyn Evaluator,
    settings: &Settings,
    history: Vec<Trial>,
    record: &mut dyn FnMut(&Trial) -> Result<(), SpecError>,
) -> Result<Vec<Trial>, SpecError> {
    if space.is_empty() {
        return Err(SpecError::new("the search space is empty"));
    }
    let prior = match &settings.prior {
        None => vec![0.0; space.len()],
        Some(p) if p.len() != space.len() => {
            return Err(SpecError::new(format!(
                "the prior rates {} layouts, the space has {}",
                p.len(),
                space.len()
            )))
        }
        Some(p) => {
            // a layout the model expects to fail is rated below the worst it expects to run
            let worst = p
                .iter()
                .cloned()
                .filter(|v| v.is_finite())
                .fold(f64::INFINITY, f64::min);
            let floor = if worst.is_finite() {
                worst - std::f64::consts::LN_2
            } else {
                0.0
            };
            p.iter().map(|v| if v.is_finite() { *v } else { floor }).collect()
        }
    };
    let mut st = State::new(space, settings, prior);
    let mut trials = Vec::new();
    let mut next_id = 0u64;
    for t in history {
        let Some(i) = st.index_of(&t.config) else {
            return Err(SpecError::new(format!(
                "resumed trial {} ({:?}) is not in this search's space: was the store made by another search?",
                t.id, t.config
            )));
        };
        st.taken.insert(st.keys[i]);
        st.done
            .push((i, t.outcome.value().map(f64::ln), t.outcome.is_out_of_memory()));
        next_id = next_id.max(t.id + 1);
        trials.push(t);
    }
    let budget = settings.budget.min(space.len());
    let q = settings.parallel.max(1);
    let (job_tx, job_rx) = mpsc::channel::<(u64, usize)>();
    let job_rx = std::sync::Mutex::new(job_rx);
    let (res_tx, res_rx) = mpsc::channel::<(u64, usize, Outcome, f64)>();
    std::thread::scope(|scope| -> Result<(), SpecError> {
        for _ in 0..q {
            let res_tx = res_tx.clone();
            let job_rx = &job_rx;
            scope.spawn(move || loop {
                let job = job_rx.lock().expect("job queue").recv();
                let Ok((id, i)) = job else { return };
                let t0 = Instant::now();
                let outcome = eval.evaluate(&space[i], id);
                if res_tx.send((id, i, outcome, t0.elapsed().as_secs_f64())).is_err() {
                    return;
                }
            });
        }
        drop(res_tx);
        let mut pending: Vec<(u64, usize)> = Vec::new();
        let result = (|| loop {
            while pending.len() < q && st.done.len() + pending.len() < budget {
                let idx: Vec<usize> = pending.iter().map(|p| p.1).collect();
                let Some(i) = st.propose(next_id, &idx) else {
                    break;
                };
                st.taken.insert(st.keys[i]);
                pending.push((next_id, i));
                job_tx.send((next_id, i)).expect("workers alive");
                next_id += 1;
            }
            if pending.is_empty() {
                return Ok(());
            }
            let (id, i, outcome, seconds) = res_rx.recv().expect("a worker answers");
            pending.retain(|p| p.0 != id);
            st.done
                .push((i, outcome.value().map(f64::ln), outcome.is_out_of_memory()));
            let t = Trial {
                id,
                config: space[i],
                outcome,
                seconds,
            };
            record(&t)?;
            trials.push(t);
        })();
        drop(job_tx); // workers finish their current trial and exit
        result
    })?;
    Ok(trials)
}

/// Trials needed until the best value seen is within `tol` (relative) of `optimum`; None if never.
pub fn trials_to_reach(trials: &[Trial], optimum: f64, tol: f64) -> Option<usize> {
    let mut best = f64::NEG_INFINITY;
    for (n, t) in trials.iter().enumerate() {
        if let Some(v) = t.outcome.value() {
            best = best.max(v);
        }
        if best >= optimum * (1.0 - tol) {
            return Some(n + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{self, SpaceSpec};
    use exatrain_spec::presets;

    #[test]
    fn a_subspace_lets_conditional_knobs_follow() {
        let m = presets::model("gpt-22b").unwrap();
        let space: Vec<ParallelConfig> = space::configs(&m, &SpaceSpec::new(128, 1024)).collect();
        let settings = Settings::new(Strategy::Bayes, 10, 0);
        let st = State::new(&space, &settings, vec![0.0; space.len()]);
        let find = |f: &dyn Fn(&ParallelConfig) -> bool| space.iter().position(f).unwrap();
        // tp 2 with sequence parallelism, pp 2 interleaved: along tp, tp 1 (no SP) is reachable,
        // along pp, pp 1 (no interleaving) is, and nothing else changes that need not
        let b = find(&|c| c.tp == 2 && c.pp == 2 && c.sequence_parallel && c.virtual_stages == 4 && c.zero == 1);
        let base = space[b];
        let along_tp: Vec<ParallelConfig> = st
            .subspace(b, &[0, GLOBAL_BATCH_KNOB])
            .iter()
            .map(|&j| space[j])
            .collect();
        assert!(along_tp.iter().any(|c| c.tp == 1 && !c.sequence_parallel));
        assert!(along_tp
            .iter()
            .all(|c| c.tp != 2 && c.pp == 2 && c.zero == 1 && c.micro_batch == base.micro_batch));
        assert!(
            along_tp.iter().all(|c| c.tp == 1 || c.sequence_parallel),
            "SP kept where it exists"
        );
        let along_pp: Vec<ParallelConfig> = st
            .subspace(b, &[1, GLOBAL_BATCH_KNOB])
            .iter()
            .map(|&j| space[j])
            .collect();
        assert!(along_pp.iter().any(|c| c.pp == 1 && c.virtual_stages == 1));
        assert!(along_pp.iter().all(|c| c.pp != 2 && c.tp == 2));
        // along two knobs at once: pp 1 with ZeRO-3 (ZeRO-2/3 only without a pipeline)
        let pp_zero: Vec<ParallelConfig> = st
            .subspace(b, &[1, 4, GLOBAL_BATCH_KNOB])
            .iter()
            .map(|&j| space[j])
            .collect();
        assert!(pp_zero.iter().any(|c| c.pp == 1 && c.zero == 3));
    }
}
