//! Scaling studies on top of the planner and the tuner: the best layout at each node count, weak
//! and strong scaling, time-to-train with failures and checkpoints ([`ttt`]), the HTML report
//! ([`report`]) and launch scripts for the frameworks users run ([`export`]).
//!
//! [`study`] is pure (no IO); the report and the files are written at the CLI's edge.

/// Launch scripts: the `exatrain-export` crate.
pub use exatrain_export as export;
pub mod explain;
pub mod fidelity;
pub mod report;
pub mod ttt;

use exatrain_cost::Plan;
use exatrain_spec::{ClusterSpec, ModelSpec, ParallelConfig};
use exatrain_tune::exhaustive;
use exatrain_tune::space::{self, SpaceSpec};
use serde::Serialize;

pub use ttt::{CheckpointCost, TimeToTrain};

/// The best layout found for one (model, node count, global batch).
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub global_batch: u32,
    pub config: ParallelConfig,
    pub plan: Plan,
}

/// One node count of a model's study.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub nodes: u32,
    pub gpus: u32,
    /// Weak scaling: global batch grown with the node count.
    pub weak: Option<Point>,
    /// Strong scaling: the global batch of the smallest count.
    pub strong: Option<Point>,
    /// Per-device throughput relative to the smallest count that has a layout, weak scaling.
    pub weak_efficiency: Option<f64>,
    /// Per-device throughput relative to the smallest count that has a layout, strong scaling.
    pub strong_efficiency: Option<f64>,
    /// Time to train on the strong-scaling layout (the fixed, chosen global batch).
    pub time_to_train: Option<TimeToTrain>,
    /// Why this count has no layout, when it has none.
    pub why: Option<String>,
    /// The strong-scaling recommendation against `StudySpec::compare`'s stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compared: Option<explain::Explanation>,
}

/// A model across node counts.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStudy {
    pub model: String,
    pub params: f64,
    /// Global batch at the smallest node count (sequences).
    pub global_batch: u32,
    /// Training tokens.
    pub tokens: f64,
    /// Model FLOPs of the whole training run.
    pub total_flops: f64,
    pub rows: Vec<Row>,
}

/// The whole study.
#[derive(Debug, Clone, Serialize)]
pub struct Study {
    pub cluster: String,
    pub device: String,
    pub peak_tflops: f64,
    pub nodes: Vec<u32>,
    pub models: Vec<ModelStudy>,
}

/// What to study.
#[derive(Debug, Clone)]
pub struct StudySpec {
    pub nodes: Vec<u32>,
    /// Global batch at the smallest node count; default 2 sequences per device of the largest
    /// count, so that strong scaling has a layout at every count.
    pub global_batch: Option<u32>,
    /// Training tokens, or `tokens_per_param × params` when None.
    pub tokens: Option<f64>,
    pub tokens_per_param: f64,
    pub node_mtbf_hours: Option<f64>,
    pub checkpoint_write_gbps: Option<f64>,
    /// The stack whose layouts are searched ([`explain::Stack::any`]: the whole space; ZeRO
    /// 0/1 without flash attention on Megatron-DeepSpeed: what the Frontier study ran).
    pub search: explain::Stack,
    /// Explain each strong-scaling recommendation against the best layout this stack runs.
    pub compare: Option<explain::Stack>,
}

fn best(m: &ModelSpec, c: &ClusterSpec, gpus: u32, gb: u32, spec: &StudySpec) -> Result<Point, String> {
    best_on(m, c, gpus, gb, &spec.search)
}

/// The best layout of `gpus` GPUs and batch `gb` among those `stack` runs, priced with the
/// kernel efficiency of the stack's framework (`ClusterSpec::for_framework`).
fn best_on(m: &ModelSpec, c: &ClusterSpec, gpus: u32, gb: u32, stack: &explain::Stack) -> Result<Point, String> {
    let c = &c.for_framework_opt(stack.framework);
    let mut s = SpaceSpec {
        framework: stack.framework,
        zero: stack.zero.clone(),
        fp8: stack.fp8,
        ..SpaceSpec::new(gpus, gb)
    };
    if !stack.flash_attention {
        s.flash_attention = vec![false];
    }
    if let Some(why) = space::why_empty(m, &s) {
        return Err(why);
    }
    let r = exhaustive::search(m, c, &s, 1, &|_| {});
    match r.best.first() {
        Some(b) => Ok(Point {
            global_batch: gb,
            config: b.cfg,
            plan: b.plan,
        }),
        None => Err(format!(
            "no layout of {gpus} GPUs fits {} in memory ({} layouts tried)",
            m.name, r.evaluated
        )),
    }
}

/// Study one model on one cluster.
pub fn study_model(m: &ModelSpec, c: &ClusterSpec, s: &StudySpec) -> ModelStudy {
    let mut nodes = s.nodes.clone();
    nodes.sort_unstable();
    nodes.dedup();
    let per_node = c.node.devices;
    let n0 = nodes[0];
    let gb0 = s.global_batch.unwrap_or(2 * nodes[nodes.len() - 1] * per_node);
    let tokens = s.tokens.unwrap_or(s.tokens_per_param * m.params() as f64);
    let mut rows: Vec<Row> = nodes
        .iter()
        .map(|&n| {
            let gpus = n * per_node;
            // Weak scaling grows the batch with the machine; rounded to whole sequences.
            let gb_weak = ((gb0 as u64 * n as u64) / n0 as u64).max(1) as u32;
            let weak = best(m, c, gpus, gb_weak, s);
            let strong = best(m, c, gpus, gb0, s);
            let why = match (&weak, &strong) {
                (Err(a), Err(b)) if a == b => Some(a.clone()),
                (Err(a), Err(b)) => Some(format!("weak: {a}; strong: {b}")),
                (Err(a), Ok(_)) => Some(format!("weak: {a}")),
                (Ok(_), Err(b)) => Some(format!("strong: {b}")),
                _ => None,
            };
            let time_to_train = strong
                .as_ref()
                .ok()
                .map(|p| ttt::time_to_train(m, c, p.config.dtype, gpus, p.plan.tokens_per_s, tokens, s));
            let compared = match (&strong, &s.compare) {
                (Ok(p), Some(stack)) => Some(explain::explain(
                    m,
                    p,
                    stack,
                    s.search.framework.map_or(c.stack.framework, Some),
                    best_on(m, c, gpus, gb0, stack),
                )),
                _ => None,
            };
            Row {
                nodes: n,
                gpus,
                compared,
                weak: weak.ok(),
                strong: strong.ok(),
                weak_efficiency: None,
                strong_efficiency: None,
                time_to_train,
                why,
            }
        })
        .collect();
    // The baseline is the smallest count that has a layout.
    let base = |pick: fn(&Row) -> Option<&Point>| {
        rows.iter()
            .find_map(|r| pick(r).map(|p| p.plan.tokens_per_s / r.gpus as f64))
    };
    let base_weak = base(|r| r.weak.as_ref());
    let base_strong = base(|r| r.strong.as_ref());
    for r in &mut rows {
        r.weak_efficiency = scaling_efficiency(base_weak, r.weak.as_ref().map(|p| p.plan.tokens_per_s), r.gpus);
        r.strong_efficiency = scaling_efficiency(base_strong, r.strong.as_ref().map(|p| p.plan.tokens_per_s), r.gpus);
    }
    let total_flops = exatrain_cost::flops::model_step(m, 1) / m.seq_len as f64 * tokens;
    ModelStudy {
        model: m.name.clone(),
        params: m.params() as f64,
        global_batch: gb0,
        tokens,
        total_flops,
        rows,
    }
}

/// Throughput per device relative to the baseline's per-device throughput.
pub fn scaling_efficiency(base_per_device: Option<f64>, throughput: Option<f64>, devices: u32) -> Option<f64> {
    match (base_per_device, throughput) {
        (Some(b), Some(t)) if b > 0.0 => Some(t / devices as f64 / b),
        _ => None,
    }
}

/// Study several models.
pub fn study(models: &[ModelSpec], c: &ClusterSpec, s: &StudySpec) -> Study {
    let mut nodes = s.nodes.clone();
    nodes.sort_unstable();
    nodes.dedup();
    Study {
        cluster: c.name.clone(),
        device: c.device.name.clone(),
        peak_tflops: c.device.peak_tflops_bf16,
        nodes,
        models: models.iter().map(|m| study_model(m, c, s)).collect(),
    }
}
