//! Search over parallel layouts.
//!
//! - [`space`]: every valid, non-equivalent [`ParallelConfig`](exatrain_spec::ParallelConfig) for a
//!   model on a device count, as an iterator;
//! - [`exhaustive`]: the whole space through the cost model, in parallel, keeping the top k, and
//!   the Pareto front of throughput against devices over a range of device counts;
//! - [`bayes`]: Bayesian optimization for expensive black boxes (GP or extra-trees surrogate, UCB
//!   over random subspaces and global pools, constant liar for parallel trials, failures steered
//!   away from), and random search; [`gp`], [`forest`] and [`fits`] (P(fits in memory)) are its models;
//! - [`eval`]: the [`Evaluator`](eval::Evaluator) trait with the cost model and an external command;
//! - [`logs`] and [`framework_eval`]: framework logs as measurements, and trials that run a
//!   framework's exported job;
//! - [`store`]: an fsync'd JSONL trial log that a crashed search resumes from.

pub mod bayes;
pub mod eval;
pub mod exhaustive;
pub mod fits;
pub mod forest;
pub mod framework_eval;
pub mod gp;
pub mod logs;
pub mod space;
pub mod store;
pub mod trend;

/// The median of `v` (the mean of the middle two for an even count; NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}
