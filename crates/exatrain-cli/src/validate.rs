//! `exatrain validate`: the planner against measured runs.

use std::path::PathBuf;

use clap::Args;
use exatrain_cost::{flops, plan};
use exatrain_spec::{load, Framework, ModelFile, ParallelConfig, Recompute, SpecError, StackSwitches, StageLayers};
use exatrain_tune::median;
use serde::{Deserialize, Serialize};

const BUNDLED: &str = include_str!("../../../data/published-runs.csv");

#[derive(Args)]
pub struct ValidateArgs {
    /// CSV with the columns of data/published-runs.csv (default: that file, bundled).
    #[arg(long)]
    pub runs: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also fit the cluster's GEMM efficiency curve (max_efficiency, half_size) to the runs, and
    /// report the fitted values with their in-sample and leave-one-out errors.
    #[arg(long)]
    pub fit: bool,
    /// Report the error per source (the CSV's `source` column): zero-shot (the stack's compute
    /// factor fitted only to the other sources' runs, each on its own cluster; the preset as it
    /// is when no other source is in the file) and one-shot (fitted to the source's smallest run
    /// only, predicting its other runs).
    #[arg(long)]
    pub per_source: bool,
}

/// Names for a one-line message: the first 12, then how many more.
pub fn listed(names: impl IntoIterator<Item = String>) -> String {
    let names: Vec<String> = names.into_iter().collect();
    let shown = names.iter().take(12).cloned().collect::<Vec<_>>().join(", ");
    match names.len().saturating_sub(12) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// One measured run (a row of the CSV).
#[derive(Debug, Clone, Deserialize)]
pub struct Run {
    pub name: String,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub seq: u32,
    pub vocab: u32,
    pub gpus: u32,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub mbs: u32,
    pub gbs: u32,
    /// layers per virtual pipeline stage, or "-"
    pub interleave: String,
    pub recompute: String,
    pub seq_parallel: String,
    pub cluster: String,
    /// hfu_tflops | mfu | tflops | step_s
    pub metric: String,
    pub measured: f64,
    /// where the row was published (a short citation); rows without one form the source "-"
    #[serde(default = "dash")]
    pub source: String,
    /// flash attention: yes | no (default no)
    #[serde(default = "no")]
    pub flash: String,
    /// ZeRO stage (Megatron's distributed optimizer = 1; default 0)
    #[serde(default)]
    pub zero: u8,
    /// TP communication overlap (--tp-comm-overlap): yes | no (default no)
    #[serde(default = "no")]
    pub overlap_tp: String,
    /// data-parallel gradient reduction overlapped with backward (Megatron-LM's
    /// --overlap-grad-reduce, from 2023; Megatron-LM of 2019-2022 reduced after backward):
    /// yes (default) | no. Megatron-DeepSpeed's reduction is its own (`Framework::dp_reduction`)
    #[serde(default = "yes")]
    pub overlap_dp: String,
    /// a model preset ("-": none, the default): its architecture (SwiGLU, GQA, RMSNorm, RoPE,
    /// untied head, …) replaces the GPT-style one the shape columns describe, which must agree
    /// with it (layers, hidden, heads, vocab); `seq` is the run's
    #[serde(default = "dash")]
    pub model: String,
    /// the framework that ran it: megatron-lm (default) | megatron-deepspeed | torchtitan; the
    /// cluster's stack is carried to it (`ClusterSpec::for_framework`)
    #[serde(default = "megatron_lm")]
    pub framework: String,
    /// the attention softmax without flash attention: fused (default: the framework's fused
    /// kernel where its constraints hold) | unfused (the stack had none, as Megatron-LM in 2019)
    #[serde(default = "fused")]
    pub softmax: String,
    /// backward TP collectives overlapped with the column-parallel GEMMs where the framework does
    /// it (`Framework::overlaps_tp_backward`): yes (default) | no (Megatron-LM before September
    /// 2021, BLOOM's and MT-NLG's Megatron-DeepSpeed forks)
    #[serde(default = "yes")]
    pub async_tp: String,
    /// the linears' biases added inside the GELU and dropout-residual kernels (Megatron's bias
    /// fusions, on since September 2020): yes (default) | no (Megatron-LM of 2019)
    #[serde(default = "yes")]
    pub bias_fusion: String,
    /// the transformer blocks' linear layers in FP8 (Transformer Engine, `--fp8-format hybrid`):
    /// yes | no (default)
    #[serde(default = "no")]
    pub fp8: String,
    /// the interleaved pipeline's sends overlapped with compute where the framework does it
    /// (`Framework::overlaps_pp_comm`): yes (default: Megatron-LM's `overlap_p2p_comm`, 2023 on)
    /// | no (the Megatron-LM of 2021-2022)
    #[serde(default = "yes")]
    pub overlap_pp: String,
    /// context-parallel size (Megatron-LM's --context-parallel-size; default 1): `gpus` is
    /// tp · cp · pp · dp
    #[serde(default = "one")]
    pub cp: u32,
}

fn one() -> u32 {
    1
}
fn dash() -> String {
    "-".into()
}
fn no() -> String {
    "no".into()
}
fn yes() -> String {
    "yes".into()
}
fn fused() -> String {
    "fused".into()
}
fn megatron_lm() -> String {
    "megatron-lm".into()
}

/// The columns a runs CSV may have; the first 18 are required.
pub const COLUMNS: [&str; 32] = [
    "name",
    "params_b",
    "layers",
    "hidden",
    "heads",
    "seq",
    "vocab",
    "gpus",
    "tp",
    "pp",
    "dp",
    "mbs",
    "gbs",
    "interleave",
    "recompute",
    "seq_parallel",
    "cluster",
    "metric",
    "measured",
    "source",
    "flash",
    "zero",
    "overlap_tp",
    "framework",
    "overlap_dp",
    "model",
    "softmax",
    "async_tp",
    "bias_fusion",
    "fp8",
    "overlap_pp",
    "cp",
];

const METRICS: &str = "hfu_tflops, mfu, tflops, step_s";

fn yes_no(v: &str, field: &str, run: &str) -> Result<bool, SpecError> {
    match v {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        other => Err(SpecError::new(format!(
            "run {run}: {field} `{other}` is not known (allowed: yes, no)"
        ))),
    }
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub name: String,
    pub metric: String,
    pub measured: f64,
    pub predicted: f64,
    pub rel_error: f64,
}

fn field<T>(r: Result<T, SpecError>, run: &str) -> Result<T, SpecError> {
    r.map_err(|e| SpecError::new(format!("run {run}: {e}")))
}

/// A run turned into the planner's types.
pub struct Case {
    pub model: exatrain_spec::ModelSpec,
    /// the run's cluster as its framework runs it
    pub cluster: exatrain_spec::ClusterSpec,
    pub framework: Framework,
    pub cfg: ParallelConfig,
    pub metric: String,
    pub measured: f64,
}

/// Predict a run's metric from its row.
pub fn predict(run: &Run) -> Result<f64, SpecError> {
    let case = to_case(run)?;
    predict_case(&case, &case.cluster).map_err(|e| SpecError::new(format!("run {}: {e}", run.name)))
}

/// Predict a case's metric on a given cluster (the case's own, or a refitted one).
pub fn predict_case(c: &Case, cluster: &exatrain_spec::ClusterSpec) -> Result<f64, SpecError> {
    let p = plan(&c.model, cluster, &c.cfg)?;
    match c.metric.as_str() {
        "hfu_tflops" => Ok(
            flops::megatron_formula(&c.model, c.cfg.global_batch, c.cfg.recompute == Recompute::Full)
                / p.step_time_s
                / c.cfg.gpus() as f64
                / 1e12,
        ),
        "mfu" => Ok(p.mfu),
        "tflops" => Ok(p.tflops_per_gpu),
        "step_s" => Ok(p.step_time_s),
        other => Err(SpecError::new(format!(
            "metric `{other}` is not known (allowed: {METRICS})"
        ))),
    }
}

/// The seconds one step of a case took, from its measured metric.
pub fn measured_step(c: &Case) -> f64 {
    let gpus = c.cfg.gpus() as f64;
    match c.metric.as_str() {
        "hfu_tflops" => {
            flops::megatron_formula(&c.model, c.cfg.global_batch, c.cfg.recompute == Recompute::Full)
                / (c.measured * 1e12 * gpus)
        }
        "tflops" => flops::model_step(&c.model, c.cfg.global_batch) / (c.measured * 1e12 * gpus),
        "step_s" => c.measured,
        _ => {
            let peak = c.cluster.device.peak_flops(c.cfg.dtype);
            flops::model_step(&c.model, c.cfg.global_batch) / (c.measured * peak * gpus)
        }
    }
}

/// Turn a CSV row into specs, checking every field.
pub fn to_case(run: &Run) -> Result<Case, SpecError> {
    let model = ModelFile {
        name: Some(run.name.clone()),
        layers: Some(run.layers),
        hidden: Some(run.hidden),
        heads: Some(run.heads),
        seq_len: Some(run.seq),
        vocab: Some(run.vocab),
        padded_vocab: Some(run.vocab),
        ..Default::default()
    };
    let model = field(model.resolve(&run.name), &run.name)?;
    let model = match run.model.as_str() {
        "-" | "" => model,
        preset => {
            let mut p = field(exatrain_spec::presets::model(preset), &run.name)?;
            for (what, row, preset_value) in [
                ("layers", run.layers, p.layers),
                ("hidden", run.hidden, p.hidden),
                ("heads", run.heads, p.heads),
                ("vocab", run.vocab, p.vocab),
            ] {
                if row != preset_value {
                    return Err(SpecError::new(format!(
                        "run {}: {what} {row} disagrees with model {preset}'s {preset_value}",
                        run.name
                    )));
                }
            }
            p.name = run.name.clone();
            p.seq_len = model.seq_len;
            p
        }
    };
    let framework: Framework = run.framework.parse().map_err(|_| {
        SpecError::new(format!(
            "run {}: framework `{}` is not known (allowed: {})",
            run.name,
            run.framework,
            Framework::allowed()
        ))
    })?;
    let mut cluster = field(load::cluster(&run.cluster), &run.name)?.for_framework(framework);
    // what the run's code did, over the cluster's stack (`calibrate --fit-runs` prices it so too)
    StackSwitches {
        fused_softmax: Some(match run.softmax.as_str() {
            "fused" => true,
            "unfused" => false,
            other => {
                return Err(SpecError::new(format!(
                    "run {}: softmax `{other}` is not known (allowed: fused, unfused)",
                    run.name
                )))
            }
        }),
        async_tp: Some(yes_no(&run.async_tp, "async_tp", &run.name)?),
        bias_fusion: Some(yes_no(&run.bias_fusion, "bias_fusion", &run.name)?),
        overlap_p2p: Some(yes_no(&run.overlap_pp, "overlap_pp", &run.name)?),
        grad_reduce_bf16: None,
    }
    .apply(&mut cluster.stack);
    let recompute: Recompute = field(run.recompute.parse(), &run.name)?;
    let virtual_stages = match run.interleave.as_str() {
        "-" | "" => 1,
        s => {
            let per: u32 = s
                .parse()
                .map_err(|_| SpecError::new(format!("run {}: interleave `{s}` is not a number or '-'", run.name)))?;
            // the layers (slots, where the split counts the embedding and the loss as layers) of
            // each stage, divided into chunks of `per`
            let slots = StageLayers::default_interleave_slots(&model, run.pp.max(1));
            match slots {
                Some(slots) if per > 0 && run.pp > 1 && slots % per == 0 => slots / per,
                _ => {
                    return Err(SpecError::new(format!(
                        "run {}: interleave {per} layers per virtual stage does not divide {} layers over pp {}",
                        run.name, model.layers, run.pp
                    )))
                }
            }
        }
    };
    let cfg = ParallelConfig {
        zero: run.zero,
        overlap_tp: yes_no(&run.overlap_tp, "overlap_tp", &run.name)?,
        overlap_dp: yes_no(&run.overlap_dp, "overlap_dp", &run.name)?,
        recompute,
        sequence_parallel: yes_no(&run.seq_parallel, "seq_parallel", &run.name)?,
        flash_attention: yes_no(&run.flash, "flash", &run.name)?,
        fp8: yes_no(&run.fp8, "fp8", &run.name)?,
        virtual_stages,
        cp: run.cp,
        ..ParallelConfig::new(run.tp, run.pp, run.dp, run.mbs, run.gbs)
    };
    cfg.check(&model, run.gpus)
        .map_err(|e| SpecError::new(format!("run {}: {e}", run.name)))?;
    if cfg.fp8 {
        cluster
            .device
            .require_fp8()
            .map_err(|e| SpecError::new(format!("run {}: fp8 yes on {}: {e}", run.name, run.cluster)))?;
    }
    if !matches!(run.metric.as_str(), "hfu_tflops" | "mfu" | "tflops" | "step_s") {
        return Err(SpecError::new(format!(
            "run {}: metric `{}` is not known (allowed: {METRICS})",
            run.name, run.metric
        )));
    }
    if !(run.measured.is_finite() && run.measured > 0.0) {
        return Err(SpecError::new(format!(
            "run {}: measured must be a positive number, got {}",
            run.name, run.measured
        )));
    }
    let case = Case {
        model,
        cluster,
        framework,
        cfg,
        metric: run.metric.clone(),
        measured: run.measured,
    };
    // No run beats its devices' peak: the FLOP/s per GPU the metric implies (hardware FLOPs for
    // hfu_tflops, model FLOPs otherwise) over the dense peak (FP8's for an FP8 run) is at most 1.
    let peak = match (case.cfg.fp8, case.cluster.device.fp8()) {
        (true, Some((fp8_peak, _))) => fp8_peak,
        _ => case.cluster.device.peak_flops(case.cfg.dtype),
    };
    let share = match case.metric.as_str() {
        "hfu_tflops" => case.measured * 1e12 / peak,
        _ => {
            flops::model_step(&case.model, case.cfg.global_batch)
                / (measured_step(&case) * case.cfg.gpus() as f64 * peak)
        }
    };
    if !(share <= 1.0) {
        return Err(SpecError::new(format!(
            "run {}: measured {} ({}) means {:.1} % of the devices' peak ({} TFLOP/s on {}): more than a run can reach",
            run.name,
            run.measured,
            run.metric,
            100.0 * share,
            peak / 1e12,
            run.cluster
        )));
    }
    Ok(case)
}

/// Median |relative error| of `cases` on `cluster` with the GEMM curve replaced by `g`.
fn median_error(cases: &[&Case], g: exatrain_spec::GemmEfficiency) -> f64 {
    let errs: Vec<f64> = cases
        .iter()
        .map(|c| {
            let mut cl = c.cluster.clone();
            cl.device.gemm = g;
            predict_case(c, &cl).map_or(f64::INFINITY, |p| ((p - c.measured) / c.measured).abs())
        })
        .collect();
    median(&errs)
}

/// Grid search for the GEMM curve that minimises the median |error| (all cases must share one
/// cluster). Returns the curve.
pub fn fit_gemm(cases: &[&Case]) -> exatrain_spec::GemmEfficiency {
    let mut best = (f64::INFINITY, cases[0].cluster.device.gemm);
    for i in 0..=90 {
        let max_efficiency = 0.50 + 0.005 * i as f64;
        for j in 0..=60 {
            let g = exatrain_spec::GemmEfficiency {
                max_efficiency,
                half_size: 20.0 * j as f64,
            };
            let e = median_error(cases, g);
            if e < best.0 {
                best = (e, g);
            }
        }
    }
    best.1
}

pub fn read_runs(text: &str, origin: &str) -> Result<Vec<Run>, SpecError> {
    let mut rdr = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header = rdr
        .headers()
        .map_err(|e| SpecError::new(format!("{origin}: header: {e}")))?
        .clone();
    for h in header.iter() {
        if !COLUMNS.contains(&h) {
            return Err(SpecError::new(format!(
                "{origin}: column `{h}` is not known (allowed: {})",
                COLUMNS.join(", ")
            )));
        }
    }
    let mut runs = Vec::new();
    for (i, r) in rdr.deserialize().enumerate() {
        let run: Run = r.map_err(|e| {
            // name the column, not csv's field index
            let column = match e.kind() {
                csv::ErrorKind::Deserialize { err, .. } => err.field().and_then(|f| header.get(f as usize)),
                _ => None,
            };
            match (column, e.kind()) {
                (Some(c), csv::ErrorKind::Deserialize { err, .. }) => {
                    SpecError::new(format!("{origin}: row {}: column `{c}`: {}", i + 1, err.kind()))
                }
                _ => SpecError::new(format!("{origin}: row {}: {e}", i + 1)),
            }
        })?;
        runs.push(run);
    }
    if runs.is_empty() {
        return Err(SpecError::new(format!(
            "{origin}: no runs (expected a header and at least one row)"
        )));
    }
    Ok(runs)
}

pub fn run(a: ValidateArgs) -> Result<(), SpecError> {
    let (text, origin) = match &a.runs {
        Some(p) => (
            std::fs::read_to_string(p)
                .map_err(|e| SpecError::new(format!("--runs {}: cannot read: {e}", p.display())))?,
            p.display().to_string(),
        ),
        None => (BUNDLED.to_string(), "data/published-runs.csv".to_string()),
    };
    let runs = read_runs(&text, &origin)?;
    let mut rows = Vec::new();
    for r in &runs {
        let predicted = predict(r)?;
        rows.push(Row {
            name: r.name.clone(),
            metric: r.metric.clone(),
            measured: r.measured,
            predicted,
            rel_error: (predicted - r.measured) / r.measured,
        });
    }
    if a.fit {
        let cases: Vec<Case> = runs.iter().map(to_case).collect::<Result<_, _>>()?;
        // two parameters, and every leave-one-out fit still needs two runs
        if cases.len() < 3 {
            return Err(SpecError::new(format!(
                "--fit needs at least 3 runs (it fits max_efficiency and half_size, and refits them leaving each run out); the file has {}",
                cases.len()
            )));
        }
        let name = &cases[0].cluster.name;
        if let Some(c) = cases.iter().find(|c| &c.cluster.name != name) {
            return Err(SpecError::new(format!(
                "--fit needs runs on one cluster; found {name} and {}",
                c.cluster.name
            )));
        }
        let all: Vec<&Case> = cases.iter().collect();
        let g = fit_gemm(&all);
        let mut loo = Vec::new();
        for i in 0..cases.len() {
            let rest: Vec<&Case> = cases
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, c)| c)
                .collect();
            let gi = fit_gemm(&rest);
            loo.push(median_error(&[&cases[i]], gi));
        }
        println!(
            "fit for {name}: gemm = {{ max_efficiency = {:.3}, half_size = {:.0} }}: in-sample median |error| {:.1} %, leave-one-out median {:.1} %, max {:.1} %",
            g.max_efficiency,
            g.half_size,
            100.0 * median_error(&all, g),
            100.0 * median(&loo),
            100.0 * loo.iter().cloned().fold(0.0, f64::max)
        );
    }
    let per_source = if a.per_source {
        let cases: Vec<Case> = runs.iter().map(to_case).collect::<Result<_, _>>()?;
        let sources: Vec<String> = runs.iter().map(|r| r.source.clone()).collect();
        Some((
            crate::validate_sources::per_source(&cases, &sources)?,
            crate::validate_sources::per_framework(&cases),
        ))
    } else {
        None
    };
    let errs: Vec<f64> = rows.iter().map(|r| r.rel_error.abs()).collect();
    let med = median(&errs);
    let (worst_i, max) = errs
        .iter()
        .enumerate()
        .fold((0, 0.0f64), |acc, (i, &e)| if e > acc.1 { (i, e) } else { acc });
    if a.json {
        let out = serde_json::json!({
            "runs": rows, "median_abs_rel_error": med, "max_abs_rel_error": max,
            "worst": rows[worst_i].name,
            "per_source": per_source.as_ref().map(|p| &p.0),
            "per_framework": per_source.as_ref().map(|p| &p.1),
        });
        println!("{out}");
    } else {
        // the name column as wide as the longest name
        let w = rows.iter().map(|r| r.name.chars().count()).max().unwrap_or(0).max(3);
        println!(
            "{:<w$} {:<11} {:>10} {:>10} {:>8}",
            "run", "metric", "measured", "predicted", "error"
        );
        for r in &rows {
            println!(
                "{:<w$} {:<11} {:>10.2} {:>10.2} {:>+7.1}%",
                r.name,
                r.metric,
                r.measured,
                r.predicted,
                100.0 * r.rel_error
            );
        }
        println!(
            "\nmedian |error| {:.1} %, max |error| {:.1} % ({})",
            100.0 * med,
            100.0 * max,
            rows[worst_i].name
        );
        if let Some((sources, frameworks)) = &per_source {
            println!();
            crate::validate_sources::print(sources);
            crate::validate_sources::print_frameworks(frameworks);
        }
    }
    Ok(())
}
