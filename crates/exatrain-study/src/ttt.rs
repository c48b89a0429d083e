//! Time to train, with failures and checkpoints.
//!
//! A run of `nodes` nodes fails on average every `M = node_mtbf / nodes`. Checkpointing every `τ`
//! of work, each write taking `δ`, and each failure costing a restart `R` plus the work since the
//! last checkpoint, Daly's model ("A higher order estimate of the optimum checkpoint interval for
//! restart dumps", FGCS 2006) gives the expected wall time `T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ`
//! for a failure-free time `T_s`, and the optimum interval
//! `τ = √(2δM)·[1 + ⅓·√(δ/2M) + (δ/2M)/9] − δ` (for δ < 2M; else τ = M), which for δ ≪ M is
//! Young's `√(2δM)`.

use exatrain_spec::{ClusterSpec, Dtype, ModelSpec};
use serde::Serialize;

use crate::StudySpec;

/// Young's interval `√(2δM)`.
pub fn young_interval(delta: f64, mtbf: f64) -> f64 {
    (2.0 * delta * mtbf).sqrt()
}

/// Daly's higher-order optimum interval.
pub fn daly_interval(delta: f64, mtbf: f64) -> f64 {
    if delta >= 2.0 * mtbf {
        return mtbf;
    }
    let r = delta / (2.0 * mtbf);
    (2.0 * delta * mtbf).sqrt() * (1.0 + r.sqrt() / 3.0 + r / 9.0) - delta
}

/// Daly's expected wall time for `solve` seconds of failure-free work.
pub fn expected_wall_time(solve: f64, tau: f64, delta: f64, restart: f64, mtbf: f64) -> f64 {
    mtbf * (restart / mtbf).exp() * ((tau + delta) / mtbf).exp_m1() * solve / tau
}

/// The checkpoint side of a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckpointCost {
    /// Weights + optimizer state.
    pub bytes: f64,
    pub write_s: f64,
    /// Mean time between failures of the whole allocation.
    pub system_mtbf_hours: f64,
    pub interval_s: f64,
    pub restart_s: f64,
    /// (expected wall time / failure-free time) − 1.
    pub overhead: f64,
    pub effective_days: f64,
}

/// Time, cost and energy of one training run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimeToTrain {
    pub tokens: f64,
    /// Failure-free.
    pub seconds: f64,
    pub days: f64,
    pub gpu_hours: f64,
    pub node_hours: f64,
    /// Megawatt-hours, where the cluster gives power per node.
    pub energy_mwh: Option<f64>,
    /// Where the cluster (or the study) gives a node MTBF and a checkpoint bandwidth.
    pub checkpoint: Option<CheckpointCost>,
}

/// Bytes of a restartable checkpoint: weights in the training dtype + optimizer state.
pub fn checkpoint_bytes(m: &ModelSpec, dtype: Dtype) -> f64 {
    m.params() as f64 * (dtype.bytes() + dtype.optimizer_bytes())
}

pub fn time_to_train(
    m: &ModelSpec,
    c: &ClusterSpec,
    dtype: Dtype,
    gpus: u32,
    tokens_per_s: f64,
    tokens: f64,
    s: &StudySpec,
) -> TimeToTrain {
    let seconds = tokens / tokens_per_s;
    let nodes = gpus.div_ceil(c.node.devices) as f64;
    let node_hours = seconds / 3600.0 * nodes;
    let mtbf = s.node_mtbf_hours.or(c.system.node_mtbf_hours);
    let bw = s.checkpoint_write_gbps.or(c.system.checkpoint_write_gbps);
    let checkpoint = match (mtbf, bw) {
        (Some(node_mtbf), Some(bw)) => {
            let bytes = checkpoint_bytes(m, dtype);
            let delta = bytes / (bw * 1e9);
            let system = node_mtbf * 3600.0 / nodes;
            let tau = daly_interval(delta, system);
            let restart = c.system.restart_s.unwrap_or(0.0);
            let wall = expected_wall_time(seconds, tau, delta, restart, system);
            Some(CheckpointCost {
                bytes,
                write_s: delta,
                system_mtbf_hours: system / 3600.0,
                interval_s: tau,
                restart_s: restart,
                overhead: wall / seconds - 1.0,
                effective_days: wall / 86400.0,
            })
        }
        _ => None,
    };
    TimeToTrain {
        tokens,
        seconds,
        days: seconds / 86400.0,
        gpu_hours: seconds / 3600.0 * gpus as f64,
        node_hours,
        energy_mwh: c.system.node_power_kw.map(|kw| kw * node_hours / 1000.0),
        checkpoint,
    }
}
