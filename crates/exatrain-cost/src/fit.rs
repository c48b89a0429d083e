//! Calibrating the cost model from measured runs: scale a cluster's efficiency factors so that
//! the planner's time terms match what runs measured, by least squares on the log of each
//! measured term (compute, tensor- and data-parallel communication, optimizer). Pipeline
//! send time is not fitted: a trainer's non-blocking send measures only its start (the
//! transfer shows as the receiver's wait). Runs measured by a framework's log carry only their
//! step time: for them the planner's whole step is compared, and when no run has terms only the
//! two factors a step time can tell apart (compute and link bandwidth) are fitted.
//!
//! The factors are multipliers on the spec's numbers — the stack's compute efficiency, memory bandwidth
//! (element-wise kernels and the optimizer), link bandwidth and link latency (collectives) —
//! fitted by Levenberg–Marquardt on their logarithms with a finite-difference Jacobian, so any
//! nonlinearity of the model (rooflines, ring-vs-tree choice, overlap) is respected. A factor no
//! measured term depends on keeps its value and is reported as not fitted. Pure: no IO.

use exatrain_spec::{ClusterSpec, Framework, ModelSpec, ParallelConfig, SpecError, StackSwitches};
use serde::Serialize;

use crate::{plan, Times};

/// One measured run: the model and layout as the planner should see them, and the mean
/// per-step time terms measured (the busiest rank's).
#[derive(Debug, Clone)]
pub struct Measured {
    pub name: String,
    pub model: ModelSpec,
    pub layout: ParallelConfig,
    /// Measured time terms (zero where not measured).
    pub time_s: Times,
    /// Measured wall time per step, when only that is known (framework logs).
    pub step_s: Option<f64>,
    /// The code that ran it, which the fitted stack is carried to before predicting.
    pub stack: RunStack,
    /// The stack switches the run's code set (a published run's CSV row, a Megatron-LM log's
    /// arguments), applied over the cluster's before predicting; default: the cluster's.
    pub switches: StackSwitches,
}

/// The code that ran a measured run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStack {
    /// The stack the cluster spec names, as it is.
    Cluster,
    /// exatrain's trainer (its reports): no framework whatever the spec names
    /// ([`ClusterSpec::for_trainer`]) — its collectives block, its gradients are fp32 — with the
    /// stack's efficiency as it is.
    Trainer,
    /// A framework (published runs, framework logs): the stack carried to it
    /// ([`ClusterSpec::for_framework`]), so one fit serves runs of several frameworks.
    Framework(Framework),
}

impl Measured {
    /// `c` as this run's code ran on it ([`RunStack`]), with the stack switches the run names.
    pub fn cluster_as_run(&self, c: &ClusterSpec) -> ClusterSpec {
        let mut own = match self.stack {
            RunStack::Cluster => c.clone(),
            RunStack::Trainer => c.for_trainer(),
            RunStack::Framework(f) => c.for_framework(f),
        };
        self.switches.apply(&mut own.stack);
        own
    }
}

/// A multiplier on part of a cluster spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Factor {
    /// the software stack's compute efficiency (`stack.compute_efficiency`: GEMMs, attention);
    /// the device's peak stays as it is, so MFU keeps its meaning
    Compute,
    /// device memory bandwidth (element-wise kernels, attention core, optimizer)
    Memory,
    /// bandwidth of every link and NIC
    Bandwidth,
    /// per-hop latency inside and between nodes
    Latency,
}

pub const FACTORS: [Factor; 4] = [Factor::Compute, Factor::Memory, Factor::Bandwidth, Factor::Latency];

/// Fewest runs a fit of more than the compute factor accepts. Fewer runs known only by their step
/// time (one short run of a framework, the study's method) fit the compute factor alone: one
/// number from one step time.
pub const MIN_RUNS: usize = 3;

impl Factor {
    /// `c` with this factor multiplied by `x`.
    pub fn apply(self, c: &mut ClusterSpec, x: f64) {
        match self {
            Factor::Compute => c.stack.compute_efficiency *= x,
            Factor::Memory => c.device.hbm_gbps *= x,
            Factor::Bandwidth => {
                c.node.links.iter_mut().for_each(|l| l.gbps *= x);
                c.node.nic_gbps *= x;
            }
            Factor::Latency => {
                c.network.intra_latency_us *= x;
                c.network.inter_latency_us *= x;
            }
        }
    }
}

/// One fitted (or kept) factor.
#[derive(Debug, Clone, Serialize)]
pub struct FactorFit {
    pub factor: Factor,
    /// the multiplier applied to the input spec (1 when not fitted)
    pub multiplier: f64,
    /// false: no measured term depends on it, so it kept its value
    pub fitted: bool,
}

/// The result of a fit.
#[derive(Debug, Clone, Serialize)]
pub struct Fit {
    #[serde(skip)]
    pub cluster: ClusterSpec,
    pub factors: Vec<FactorFit>,
    pub runs: usize,
    /// measured terms used
    pub terms: usize,
    /// root-mean-square of ln(predicted / measured) over the terms, before and after
    pub rms_log_error_before: f64,
    pub rms_log_error_after: f64,
    /// only whole-step times were measured, so memory and latency were kept: a step time cannot
    /// tell them from compute and bandwidth
    pub step_times_only: bool,
    /// fewer than [`MIN_RUNS`] step times: only the compute factor was fitted (one-shot)
    pub compute_only: bool,
}

/// The time terms compared, by name.
const TERMS: [&str; 5] = ["compute", "tp_comm", "dp_comm", "optimizer", "step"];

/// A run's measured terms, in [`TERMS`] order.
fn measured(run: &Measured) -> [f64; 5] {
    let t = &run.time_s;
    [t.compute, t.tp_comm, t.dp_comm, t.optimizer, run.step_s.unwrap_or(0.0)]
}

fn predict(c: &ClusterSpec, run: &Measured) -> Result<[f64; 5], SpecError> {
    plan(&run.model, &run.cluster_as_run(c), &run.layout)
        .map(|p| {
            let t = p.time_s;
            [t.compute, t.tp_comm, t.dp_comm, t.optimizer, p.step_time_s]
        })
        .map_err(|e| SpecError::new(format!("run {}: the planner rejects its layout: {e}", run.name)))
}

/// Which terms of each run are fitted: measured, and predicted by the base spec (a term the
/// model prices at zero, e.g. a fully hidden reduction, no factor can explain).
fn used_terms(base: &ClusterSpec, runs: &[Measured]) -> Result<Vec<[bool; 5]>, SpecError> {
    runs.iter()
        .map(|run| {
            let p = predict(base, run)?;
            let m = measured(run);
            Ok(std::array::from_fn(|i| m[i] > 0.0 && p[i] > 0.0))
        })
        .collect()
}

/// ln(predicted/measured) of the `used` terms of every run under cluster `c`.
fn residuals(c: &ClusterSpec, runs: &[Measured], used: &[[bool; 5]]) -> Result<Vec<f64>, SpecError> {
    let mut r = Vec::new();
    for (run, u) in runs.iter().zip(used) {
        let p = predict(c, run)?;
        let m = measured(run);
        for i in (0..TERMS.len()).filter(|i| u[*i]) {
            r.push((p[i].max(1e-12) / m[i]).ln());
        }
    }
    Ok(r)
}

fn scaled(base: &ClusterSpec, free: &[Factor], theta: &[f64]) -> ClusterSpec {
    let mut c = base.clone();
    for (f, t) in free.iter().zip(theta) {
        f.apply(&mut c, t.exp());
    }
    c
}

fn rms(r: &[f64]) -> f64 {
    (r.iter().map(|x| x * x).sum::<f64>() / r.len().max(1) as f64).sqrt()
}

/// Solve the small dense system `a x = b` (Gaussian elimination with partial pivoting).
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for row in col + 1..n {
            let f = a[row][col] / a[col][col];
            for k in col..n {
                a[row][k] -= f * a[col][k];
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| a[i][k] * x[k]).sum();
        x[i] = (b[i] - s) / a[i][i];
    }
    Some(x)
}

/// Fit `base`'s factors to `runs`. Errors: no runs, fewer than [`MIN_RUNS`] runs with measured
/// time terms (trainer reports), a layout the planner rejects, or nothing measured. One or two
/// runs known only by their step time fit the compute factor alone.
pub fn fit(base: &ClusterSpec, runs: &[Measured]) -> Result<Fit, SpecError> {
    if runs.is_empty() {
        return Err(SpecError::new("calibrate --fit: no runs given"));
    }
    let used = used_terms(base, runs)?;
    // step times alone cannot tell memory and latency from compute and bandwidth
    let step_times_only = used.iter().all(|u| !u[..4].iter().any(|x| *x));
    if runs.len() < MIN_RUNS && !step_times_only {
        return Err(SpecError::new(format!(
            "calibrate --fit: {} run report(s) given, at least {MIN_RUNS} needed to fit {} factors \
             (compute, memory, link bandwidth, latency) — run `exatrain train --report` on more layouts",
            runs.len(),
            FACTORS.len()
        )));
    }
    let compute_only = runs.len() < MIN_RUNS;
    let residuals = |c: &ClusterSpec| residuals(c, runs, &used);
    let r0 = residuals(base)?;
    if r0.is_empty() {
        return Err(SpecError::new(
            "calibrate --fit: the reports measured no time term that the planner prices",
        ));
    }
    // which factors some measured term depends on
    let h = 0.05f64;
    let sens = |f: Factor| -> Result<f64, SpecError> {
        let mut c = base.clone();
        f.apply(&mut c, h.exp());
        let r = residuals(&c)?;
        Ok(r.iter().zip(&r0).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max))
    };
    let mut free = Vec::new();
    for f in FACTORS {
        if (step_times_only && matches!(f, Factor::Memory | Factor::Latency)) || (compute_only && f != Factor::Compute)
        {
            continue;
        }
        if sens(f)? > 1e-4 {
            free.push(f);
        }
    }
    let mut theta = vec![0.0f64; free.len()];
    let mut r = r0.clone();
    let mut lambda = 1e-3;
    for _ in 0..60 {
        if free.is_empty() {
            break;
        }
        // Jacobian by forward differences in log space
        let cols: Vec<Vec<f64>> = (0..free.len())
            .map(|j| {
                let mut t = theta.clone();
                t[j] += 1e-4;
                residuals(&scaled(base, &free, &t)).map(|rj| rj.iter().zip(&r).map(|(a, b)| (a - b) / 1e-4).collect())
            })
            .collect::<Result<_, _>>()?;
        let n = free.len();
        let jtj: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|k| cols[i].iter().zip(&cols[k]).map(|(a, b)| a * b).sum())
                    .collect()
            })
            .collect();
        let jtr: Vec<f64> = (0..n)
            .map(|i| -cols[i].iter().zip(&r).map(|(a, b)| a * b).sum::<f64>())
            .collect();
        let mut improved = false;
        for _ in 0..10 {
            let mut a = jtj.clone();
            for (i, row) in a.iter_mut().enumerate() {
                row[i] += lambda * (jtj[i][i] + 1e-12);
            }
            let Some(step) = solve(a, jtr.clone()) else {
                lambda *= 10.0;
                continue;
            };
            let t: Vec<f64> = theta
                .iter()
                .zip(&step)
                .map(|(a, b)| (a + b).clamp(-12.0, 12.0))
                .collect();
            let rt = residuals(&scaled(base, &free, &t))?;
            if rms(&rt) < rms(&r) {
                let gain = rms(&r) - rms(&rt);
                (theta, r) = (t, rt);
                lambda = (lambda / 3.0).max(1e-9);
                improved = gain > 1e-10;
                break;
            }
            lambda *= 10.0;
        }
        if !improved {
            break;
        }
    }
    let cluster = scaled(base, &free, &theta);
    let factors = FACTORS
        .iter()
        .map(|&f| match free.iter().position(|x| *x == f) {
            Some(j) => FactorFit {
                factor: f,
                multiplier: theta[j].exp(),
                fitted: true,
            },
            None => FactorFit {
                factor: f,
                multiplier: 1.0,
                fitted: false,
            },
        })
        .collect();
    Ok(Fit {
        cluster,
        factors,
        runs: runs.len(),
        terms: r.len(),
        rms_log_error_before: rms(&r0),
        rms_log_error_after: rms(&r),
        step_times_only,
        compute_only,
    })
}
