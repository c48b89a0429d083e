//! `exatrain study` and `exatrain export`.

use std::path::PathBuf;

use clap::Args;
use exatrain_spec::{load, ParallelConfig, SpecError};
use exatrain_study::export::{self, Format};
use exatrain_study::report;
use exatrain_study::{Study, StudySpec};
use exatrain_tune::store::write_atomic;

use crate::args::LayoutArgs;

#[derive(Args)]
pub struct StudyArgs {
    /// Models (preset names or files), comma-separated.
    #[arg(long, default_value = "gpt-22b,gpt-175b,gpt-1t")]
    pub model: String,
    /// Cluster preset name or file.
    #[arg(long, default_value = "frontier")]
    pub cluster: String,
    /// Node counts, comma-separated.
    #[arg(long, default_value = "128,384")]
    pub nodes: String,
    /// Global batch (sequences) at the smallest node count [default: 2 per device of the largest count].
    #[arg(long)]
    pub global_batch: Option<u32>,
    /// Training tokens, e.g. 20T, 300B, 1.5e12 [default: --tokens-per-param × parameters].
    #[arg(long)]
    pub tokens: Option<String>,
    /// Tokens per parameter when --tokens is not given (Chinchilla: 20).
    #[arg(long, default_value_t = 20.0)]
    pub tokens_per_param: f64,
    /// Node mean time between failures, hours [default: the cluster's].
    #[arg(long)]
    pub node_mtbf_hours: Option<f64>,
    /// Checkpoint write bandwidth, GB/s [default: the cluster's].
    #[arg(long)]
    pub checkpoint_gbps: Option<f64>,
    /// Folder for report.html and study.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print study.json to stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Search only layouts this framework runs (megatron-lm, megatron-deepspeed, torchtitan), so
    /// that every recommended layout can be exported to it.
    #[arg(long)]
    pub framework: Option<String>,
    /// ZeRO stages to search (comma-separated); `0,1` searches what a TP/PP + ZeRO-1 stack (the
    /// Frontier study's Megatron-DeepSpeed) runs.
    #[arg(long, default_value = "0,1,2,3")]
    pub zero: String,
    /// Do not search flash attention (a stack without it).
    #[arg(long)]
    pub no_flash: bool,
    /// Search layouts whose transformer blocks' linear layers run in FP8 (as `plan --fp8`;
    /// needs a device with an FP8 peak; Megatron-LM is the framework that exports it).
    #[arg(long)]
    pub fp8: bool,
    /// Explain each recommendation against the best layout this framework runs (megatron-lm,
    /// megatron-deepspeed, torchtitan, or `any`), term by term, naming what the recommendation
    /// needs beyond it; with --compare-zero and --compare-no-flash for the stack's other limits.
    #[arg(long)]
    pub compare: Option<String>,
    /// With --compare: the ZeRO stages that stack runs (comma-separated).
    #[arg(long)]
    pub compare_zero: Option<String>,
    /// With --compare: that stack has no flash attention.
    #[arg(long)]
    pub compare_no_flash: bool,
}

/// `20T`, `300B`, `1.5e12`, `7M`.
pub fn parse_tokens(s: &str) -> Result<f64, SpecError> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('B' | 'G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        Some('P') => (&t[..t.len() - 1], 1e15),
        _ => (t, 1.0),
    };
    match num.parse::<f64>().map(|v| v * mul) {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err(SpecError::new(format!(
            "--tokens {s}: the token budget must be positive and finite"
        ))),
        Err(_) => Err(SpecError::new(format!(
            "--tokens {s} is not a number (e.g. 20T, 300B, 1.5e12)"
        ))),
    }
}

fn positive_f(v: Option<f64>, flag: &str) -> Result<Option<f64>, SpecError> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            Err(SpecError::new(format!("--{flag} {x} must be a positive number")))
        }
        _ => Ok(v),
    }
}

fn print_study(s: &Study) {
    println!("{} ({}, {:.1} TFLOP/s peak)", s.cluster, s.device, s.peak_tflops);
    println!(
        "\n{:<10} {:>6} {:>6}  {:<64} {:>11} {:>7} {:>8} {:>9} {:>9}",
        "model", "nodes", "GPUs", "best layout (strong)", "tokens/s", "MFU", "weakMFU", "weak eff", "strong eff"
    );
    let pct = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{:.1}%", 100.0 * v));
    for m in &s.models {
        for r in &m.rows {
            println!(
                "{:<10} {:>6} {:>6}  {:<64} {:>11} {:>7} {:>8} {:>9} {:>9}{}",
                m.model,
                r.nodes,
                r.gpus,
                r.strong.as_ref().map_or("–".into(), report::layout),
                r.strong
                    .as_ref()
                    .map_or("–".into(), |p| format!("{:.0}", p.plan.tokens_per_s)),
                pct(r.strong.as_ref().map(|p| p.plan.mfu)),
                pct(r.weak.as_ref().map(|p| p.plan.mfu)),
                pct(r.weak_efficiency),
                pct(r.strong_efficiency),
                r.why.as_ref().map_or(String::new(), |w| format!("  ({w})"))
            );
        }
    }
    for m in &s.models {
        for r in &m.rows {
            if let Some(e) = &r.compared {
                println!(
                    "\n{} at {} nodes against {}",
                    m.model,
                    r.nodes,
                    exatrain_study::explain::sentence(e)
                );
            }
        }
    }
    let heads = [
        "model",
        "nodes",
        "tokens",
        "EFLOPs",
        "days",
        "GPU-hours",
        "node-hours",
        "MWh",
        "MTBF h",
        "ckpt GB",
        "ckpt min",
        "overhead",
        "days+fail",
    ];
    let widths = [10usize, 6, 10, 10, 9, 10, 10, 8, 8, 8, 9, 9, 10];
    let line = |cells: &[String]| {
        let mut out = format!("{:<w$}", cells[0], w = widths[0]);
        for (cell, w) in cells.iter().zip(widths).skip(1) {
            out.push_str(&format!(" {cell:>w$}"));
        }
        out
    };
    println!("\n{}", line(&heads.map(String::from)));
    for m in &s.models {
        for cells in m.rows.iter().filter_map(|r| report::ttt_cells(m, r)) {
            println!("{}", line(&cells));
        }
    }
}

pub fn run_study(a: StudyArgs) -> Result<(), SpecError> {
    let models = a
        .model
        .split(',')
        .map(|m| load::model(m.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let cluster = load::cluster(&a.cluster)?;
    if a.fp8 {
        cluster.device.require_fp8()?;
    }
    let nodes = a
        .nodes
        .split(',')
        .map(|n| match n.trim().parse::<u32>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(SpecError::new(format!("--nodes {n} is not a positive integer"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if a.global_batch == Some(0) {
        return Err(SpecError::new("--global-batch must be a positive integer"));
    }
    if !(a.tokens_per_param.is_finite() && a.tokens_per_param > 0.0) {
        return Err(SpecError::new(
            "--tokens-per-param: the token budget must be positive and finite",
        ));
    }
    let compare = match (&a.compare, &a.compare_zero, a.compare_no_flash) {
        (None, None, false) => None,
        (None, _, _) => {
            return Err(SpecError::new(format!(
                "--compare-zero and --compare-no-flash go with --compare FRAMEWORK ({}, any)",
                exatrain_spec::Framework::allowed()
            )))
        }
        (Some(f), zero, no_flash) => Some(exatrain_study::explain::Stack {
            framework: if f == "any" {
                None
            } else {
                Some(f.parse().map_err(|_: SpecError| {
                    SpecError::new(format!(
                        "--compare {f} is not known (allowed: {}, any)",
                        exatrain_spec::Framework::allowed()
                    ))
                })?)
            },
            zero: crate::tune_cmd::zero_stages(zero.as_deref().unwrap_or("0,1,2,3"))
                .map_err(|e| SpecError::new(e.0.replacen("--zero", "--compare-zero", 1)))?,
            flash_attention: !no_flash,
            // the stack compared against trains in bf16: an FP8 recommendation names FP8 as a need
            fp8: false,
        }),
    };
    let spec = StudySpec {
        nodes,
        global_batch: a.global_batch,
        tokens: a.tokens.as_deref().map(parse_tokens).transpose()?,
        tokens_per_param: a.tokens_per_param,
        node_mtbf_hours: positive_f(a.node_mtbf_hours, "node-mtbf-hours")?,
        checkpoint_write_gbps: positive_f(a.checkpoint_gbps, "checkpoint-gbps")?,
        search: exatrain_study::explain::Stack {
            framework: a.framework.as_deref().map(str::parse).transpose()?,
            zero: crate::tune_cmd::zero_stages(&a.zero)?,
            flash_attention: !a.no_flash,
            fp8: a.fp8,
        },
        compare,
    };
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| SpecError::new(format!("--out {}: cannot create: {e}", dir.display())))?;
    }
    let study = exatrain_study::study(&models, &cluster, &spec);
    let json = serde_json::to_string_pretty(&study).expect("study serializes");
    if let Some(dir) = &a.out {
        write_atomic(&dir.join("study.json"), json.as_bytes())?;
        write_atomic(&dir.join("report.html"), report::html(&study, &json).as_bytes())?;
    }
    if a.json {
        println!("{json}");
    } else {
        print_study(&study);
        if let Some(dir) = &a.out {
            println!(
                "\nwrote {} and {}",
                dir.join("report.html").display(),
                dir.join("study.json").display()
            );
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct ExportArgs {
    /// megatron-lm, megatron-deepspeed, torchtitan (a complete job for that framework), slurm
    /// (megatron-lm with --launcher slurm) or exatrain (a run file `plan --run` reads).
    #[arg(long, default_value = "megatron-lm")]
    pub format: String,
    /// How the job starts: torchrun (launch.sh, once per node) or slurm (job.sbatch + rank.sh,
    /// one task per GPU, with the cluster's [launch] settings).
    #[arg(long, default_value = "torchrun")]
    pub launcher: String,
    /// Model preset or file (ignored with --from, which names its model).
    #[arg(long, default_value = "gpt-175b")]
    pub model: String,
    #[arg(long, default_value = "frontier")]
    pub cluster: String,
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Take the layout from a `tune --out` tune.json or a `study --out` study.json.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// With --from tune.json: which of the best layouts (0 = fastest).
    #[arg(long, default_value_t = 0)]
    pub pick: usize,
    /// With --from study.json: the node count (default: the first that has a layout).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Write the files into this folder instead of printing them.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The layout fields of a result row (which also carries plan fields): exactly the keys a
/// `ParallelConfig` serializes to.
fn config_of(v: &serde_json::Value, origin: &str) -> Result<ParallelConfig, SpecError> {
    // every field's name, the optional ones (skipped when unset) set so that they are listed
    let all = ParallelConfig {
        fp8: true,
        overlap_tp: true,
        first_stage_layers: Some(1),
        last_stage_layers: Some(1),
        dp_bucket: Some(1),
        ..ParallelConfig::new(1, 1, 1, 1, 1)
    };
    let fields = serde_json::to_value(all).expect("config serializes");
    let mut o = serde_json::Map::new();
    for k in fields.as_object().expect("object").keys() {
        if let Some(x) = v.get(k) {
            o.insert(k.clone(), x.clone());
        }
    }
    serde_json::from_value(serde_json::Value::Object(o))
        .map_err(|e| SpecError::new(format!("--from {origin}: layout: {e}")))
}

pub fn run_export(a: ExportArgs) -> Result<(), SpecError> {
    let format: Format = a.format.parse()?;
    let launcher: export::Launcher = a.launcher.parse()?;
    let (model, cluster, cfg) = match &a.from {
        None => {
            let model = load::model(&a.model)?;
            let cluster = load::cluster(&a.cluster)?;
            let cfg = a.layout.config(&model)?;
            (model, cluster, cfg)
        }
        Some(path) => {
            let origin = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .map_err(|e| SpecError::new(format!("--from {origin}: cannot read: {e}")))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| SpecError::new(format!("--from {origin}: {e}")))?;
            if let Some(best) = v.get("best").and_then(|b| b.as_array()) {
                let row = best.get(a.pick).ok_or_else(|| {
                    SpecError::new(format!(
                        "--pick {} is out of range ({} layouts in {origin})",
                        a.pick,
                        best.len()
                    ))
                })?;
                let name = v.get("model").and_then(|m| m.as_str()).unwrap_or(&a.model);
                let cl = v.get("cluster").and_then(|m| m.as_str()).unwrap_or(&a.cluster);
                (load::model(name)?, load::cluster(cl)?, config_of(row, &origin)?)
            } else if let Some(models) = v.get("models").and_then(|m| m.as_array()) {
                let m = models
                    .iter()
                    .find(|m| m["model"] == a.model.as_str())
                    .or(models.first())
                    .ok_or_else(|| SpecError::new(format!("--from {origin}: no models in the study")))?;
                let rows = m["rows"].as_array().cloned().unwrap_or_default();
                let row = rows
                    .iter()
                    .find(|r| a.nodes.is_none_or(|n| r["nodes"] == n) && !r["strong"].is_null())
                    .ok_or_else(|| {
                        SpecError::new(match a.nodes {
                            Some(n) => format!(
                                "--from {origin}: no layout for --nodes {n} in the study (its node counts: {})",
                                rows.iter()
                                    .filter(|r| !r["strong"].is_null())
                                    .filter_map(|r| r["nodes"].as_u64())
                                    .map(|n| n.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                            None => format!("--from {origin}: the study has no layout"),
                        })
                    })?;
                let cl = v.get("cluster").and_then(|c| c.as_str()).unwrap_or(&a.cluster);
                let name = m["model"].as_str().unwrap_or(&a.model);
                (
                    load::model(name)?,
                    load::cluster(cl)?,
                    config_of(&row["strong"]["config"], &origin)?,
                )
            } else {
                return Err(SpecError::new(format!(
                    "--from {origin}: neither a tune.json (\"best\") nor a study.json (\"models\")"
                )));
            }
        }
    };
    let files = export::export(&model, &cluster, &cfg, format, launcher)?;
    match &a.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| SpecError::new(format!("--out {}: cannot create: {e}", dir.display())))?;
            for f in &files {
                write_atomic(&dir.join(&f.name), f.contents.as_bytes())?;
                println!("wrote {}", dir.join(&f.name).display());
            }
        }
        None => {
            for f in &files {
                if files.len() > 1 {
                    println!("# ---- {} ----", f.name);
                }
                print!("{}", f.contents);
            }
        }
    }
    Ok(())
}
