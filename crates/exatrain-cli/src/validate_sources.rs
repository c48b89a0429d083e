//! `exatrain validate --per-source`: how well the planner predicts a source's runs that it was
//! never fitted to (zero-shot), and after one short run of that source (one-shot).
//!
//! The part of a cluster spec fitted here is its compute factor (the stack's kernel efficiency
//! relative to the spec: `calibrate`'s `Factor::Compute`), one number, so that a single run
//! determines it. Zero-shot: fitted to the runs of every *other* source that ran on the same
//! framework, or of every other source when none did (leave-one-source-out; each run on its own
//! cluster, carried to its framework). Any device counts: a preset's GEMM curve is the bare
//! matmul's (its measured ceiling) and the factor is the stack's share of it, so Selene's A100
//! runs inform the H100 and V100 sources too. One-shot:
//! fitted to the source's smallest run (fewest GPUs, then fewest parameters) alone, then the
//! source's other runs are predicted.

use exatrain_cost::fit::Factor;
use exatrain_spec::{ClusterSpec, Framework, SpecError};
use exatrain_tune::median;
use serde::Serialize;

use crate::validate::{measured_step, predict_case, Case};

/// One source's errors (fractions, signed per run).
#[derive(Debug, Serialize)]
pub struct SourceRow {
    pub source: String,
    pub cluster: String,
    pub runs: usize,
    /// runs of other sources the zero-shot factor was fitted to (0: the preset as it is, when the
    /// file holds one source)
    pub zero_shot_fitted_to: usize,
    pub zero_shot_compute_factor: f64,
    pub zero_shot_errors: Vec<f64>,
    /// the run of each zero-shot error: the source's runs, in the file's order
    pub zero_shot_runs: Vec<String>,
    /// the run the one-shot factor was fitted to
    pub one_shot_run: String,
    pub one_shot_compute_factor: f64,
    /// errors on the source's other runs (empty when it has one run)
    pub one_shot_errors: Vec<f64>,
    /// the run of each one-shot error
    pub one_shot_runs: Vec<String>,
}

fn scaled(base: &ClusterSpec, x: f64) -> ClusterSpec {
    let mut c = base.clone();
    Factor::Compute.apply(&mut c, x);
    c
}

/// Sum of squared log errors of the predicted step times, each run on its own cluster × factor.
fn loss(cases: &[&Case], x: f64) -> f64 {
    cases
        .iter()
        .map(
            |k| match exatrain_cost::plan(&k.model, &scaled(&k.cluster, x), &k.cfg) {
                Ok(p) => (p.step_time_s / measured_step(k)).ln().powi(2),
                Err(_) => f64::INFINITY,
            },
        )
        .sum()
}

/// The compute factor (0.25..4) that best fits `cases`' step times: golden-section search on its
/// logarithm (a step time falls monotonically with the factor, so the loss has one minimum).
pub fn fit_compute(cases: &[&Case]) -> f64 {
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (0.25f64.ln(), 4f64.ln());
    for _ in 0..60 {
        let c = b - g * (b - a);
        let d = a + g * (b - a);
        if loss(cases, c.exp()) <= loss(cases, d.exp()) {
            b = d;
        } else {
            a = c;
        }
    }
    ((a + b) / 2.0).exp()
}

fn errors(cases: &[&Case], cluster: &ClusterSpec) -> Result<Vec<f64>, SpecError> {
    cases
        .iter()
        .map(|c| predict_case(c, cluster).map(|p| (p - c.measured) / c.measured))
        .collect()
}

/// Zero-shot and one-shot errors of every source in `cases` (`sources[i]` is case i's source).
pub fn per_source(cases: &[Case], sources: &[String]) -> Result<Vec<SourceRow>, SpecError> {
    let mut names: Vec<&String> = sources.iter().collect();
    names.sort();
    names.dedup();
    let mut rows = Vec::new();
    for s in names {
        let mine: Vec<&Case> = cases
            .iter()
            .zip(sources)
            .filter(|(_, x)| *x == s)
            .map(|(c, _)| c)
            .collect();
        let cluster = mine[0].cluster.name.clone();
        if let Some(c) = mine.iter().find(|c| c.cluster.name != cluster) {
            return Err(SpecError::new(format!(
                "--per-source: source {s} ran on {cluster} and on {}: give each machine's runs their own source",
                c.cluster.name
            )));
        }
        let base = mine[0].cluster.clone();
        // leave-one-source-out: the other sources of this source's framework when there are
        // any (the framework's constant then cancels), else every other source
        let others_of = |same: bool| -> Vec<&Case> {
            cases
                .iter()
                .zip(sources)
                .filter(|(c, x)| *x != s && (!same || c.framework == mine[0].framework))
                .map(|(c, _)| c)
                .collect()
        };
        let same = others_of(true);
        let others = if same.is_empty() { others_of(false) } else { same };
        let zero = if others.is_empty() { 1.0 } else { fit_compute(&others) };
        let zero_shot_errors = errors(&mine, &scaled(&base, zero))?;
        let smallest = mine
            .iter()
            .copied()
            .min_by(|a, b| {
                (a.cfg.gpus(), a.model.params())
                    .partial_cmp(&(b.cfg.gpus(), b.model.params()))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .expect("a source has a run");
        let one = fit_compute(&[smallest]);
        let rest: Vec<&Case> = mine.iter().copied().filter(|c| !std::ptr::eq(*c, smallest)).collect();
        rows.push(SourceRow {
            source: s.clone(),
            cluster,
            runs: mine.len(),
            zero_shot_fitted_to: others.len(),
            zero_shot_compute_factor: zero,
            zero_shot_errors,
            zero_shot_runs: mine.iter().map(|c| c.model.name.clone()).collect(),
            one_shot_run: smallest.model.name.clone(),
            one_shot_compute_factor: one,
            one_shot_errors: errors(&rest, &scaled(&base, one))?,
            one_shot_runs: rest.iter().map(|c| c.model.name.clone()).collect(),
        });
    }
    Ok(rows)
}

/// One framework's stack factor, fitted to all of its runs of one precision (each on its own
/// cluster, carried to the framework by `Framework::compute_efficiency`): 1 when that constant
/// agrees with the runs. FP8 runs get a row of their own: their factor also carries the error of
/// the device's FP8 GEMM curve, which was fitted to a GEMM benchmark, not to training runs.
#[derive(Debug, Serialize)]
pub struct FrameworkRow {
    pub framework: String,
    /// the runs' linear layers ran in FP8 (`ParallelConfig.fp8`)
    pub fp8: bool,
    pub runs: usize,
    pub compute_factor: f64,
}

/// The stack factor of every framework and precision in `cases`, fitted to all its runs.
pub fn per_framework(cases: &[Case]) -> Vec<FrameworkRow> {
    Framework::ALL
        .into_iter()
        .flat_map(|f| [(f, false), (f, true)])
        .filter_map(|(f, fp8)| {
            let mine: Vec<&Case> = cases.iter().filter(|c| c.framework == f && c.cfg.fp8 == fp8).collect();
            (!mine.is_empty()).then(|| FrameworkRow {
                framework: f.name().to_string(),
                fp8,
                runs: mine.len(),
                compute_factor: fit_compute(&mine),
            })
        })
        .collect()
}

/// The per-framework line `validate --per-source` prints under its table.
pub fn print_frameworks(rows: &[FrameworkRow]) {
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            let fp8 = if r.fp8 { " fp8" } else { "" };
            format!("{}{fp8} ×{:.3} ({} runs)", r.framework, r.compute_factor, r.runs)
        })
        .collect();
    println!(
        "stack factor fitted to all of each framework's runs, bf16 and fp8 apart (1 = Framework::compute_efficiency agrees): {}",
        parts.join(", ")
    );
}

fn med_max(e: &[f64]) -> (f64, f64) {
    let a: Vec<f64> = e.iter().map(|x| x.abs()).collect();
    (median(&a), a.iter().cloned().fold(0.0, f64::max))
}

/// The table `validate --per-source` prints.
pub fn print(rows: &[SourceRow]) {
    // the source and cluster columns as wide as their longest names
    let width = |f: fn(&SourceRow) -> &str, head: &str| {
        rows.iter()
            .map(|r| f(r).chars().count())
            .chain([head.len()])
            .max()
            .unwrap_or(0)
    };
    let (ws, wc) = (width(|r| &r.source, "source"), width(|r| &r.cluster, "cluster"));
    println!(
        "{:<ws$} {:<wc$} {:>4}  {:>24}  {:>9} {:>8}  {:>17}  {:>9} {:>8}",
        "source", "cluster", "runs", "zero-shot: factor from", "median", "max", "one-shot: factor", "median", "max"
    );
    let (mut all0, mut all1) = (Vec::new(), Vec::new());
    for r in rows {
        let (m0, x0) = med_max(&r.zero_shot_errors);
        let from = if r.zero_shot_fitted_to == 0 {
            "preset ×1.000".to_string()
        } else {
            format!(
                "{} other runs ×{:.3}",
                r.zero_shot_fitted_to, r.zero_shot_compute_factor
            )
        };
        let one = if r.one_shot_errors.is_empty() {
            format!("{:>17}  {:>9} {:>8}", "(one run)", "-", "-")
        } else {
            let (m1, x1) = med_max(&r.one_shot_errors);
            format!(
                "{:>17}  {:>8.1}% {:>7.1}%",
                format!("×{:.3}", r.one_shot_compute_factor),
                100.0 * m1,
                100.0 * x1
            )
        };
        println!(
            "{:<ws$} {:<wc$} {:>4}  {:>24}  {:>8.1}% {:>7.1}%  {one}",
            r.source,
            r.cluster,
            r.runs,
            from,
            100.0 * m0,
            100.0 * x0
        );
        all0.extend(r.zero_shot_errors.iter().zip(&r.zero_shot_runs));
        all1.extend(r.one_shot_errors.iter().zip(&r.one_shot_runs));
    }
    // the median and the largest |error| of a list, with the largest's run
    let summary = |all: &[(&f64, &String)]| {
        let errors: Vec<f64> = all.iter().map(|(e, _)| **e).collect();
        let (m, x) = med_max(&errors);
        let worst = all
            .iter()
            .max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()))
            .map_or(String::new(), |(_, run)| format!(", {run}"));
        format!(
            "median |error| {:.1} %, max {:.1} % ({} runs{worst})",
            100.0 * m,
            100.0 * x,
            all.len()
        )
    };
    println!(
        "\nall sources: zero-shot {}; one-shot {}",
        summary(&all0),
        summary(&all1)
    );
}
