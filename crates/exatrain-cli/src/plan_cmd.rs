//! `exatrain plan`.

use clap::Args;
use exatrain_cost::{plan, Plan};
use exatrain_spec::{ClusterSpec, ModelSpec, ParallelConfig, SpecError};

use crate::args::{LayoutArgs, SpecArgs};
use crate::table::{bytes, pct, secs};

#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Plan the model, cluster and layout of a run file (`exatrain export --format exatrain`)
    /// instead of the flags.
    #[arg(long, conflicts_with_all = ["model", "cluster"])]
    pub run: Option<std::path::PathBuf>,
    /// Price the layout as this framework runs it (megatron-lm, megatron-deepspeed,
    /// torchtitan): its kernel efficiency, gradient reduction and accumulation, overlap of the
    /// backward TP collectives, selective recomputation, softmax kernel and loss. Default:
    /// the framework the cluster's stack was measured with (the presets: megatron-lm).
    #[arg(long)]
    pub framework: Option<String>,
}

pub fn run(a: PlanArgs) -> Result<(), SpecError> {
    let (model, cluster, cfg) = match &a.run {
        Some(path) => {
            let at = path.display();
            let text =
                std::fs::read_to_string(path).map_err(|e| SpecError::new(format!("--run {at}: cannot read: {e}")))?;
            let r = exatrain_export::RunFile::parse(&text).map_err(|e| SpecError::new(format!("--run {at}: {e}")))?;
            let cluster = exatrain_spec::load::cluster(&r.cluster)?;
            (r.model, cluster, r.parallel)
        }
        None => {
            let (model, cluster) = a.spec.load()?;
            let cfg = a.layout.config(&model)?;
            (model, cluster, cfg)
        }
    };
    let cluster = match a.framework.as_deref() {
        Some(f) => cluster.for_framework(f.parse()?),
        None => cluster,
    };
    let p = plan(&model, &cluster, &cfg)?;
    if a.json {
        println!("{}", to_json(&model, &cluster, &cfg, &p));
    } else {
        print_human(&model, &cluster, &cfg, &p);
    }
    Ok(())
}

/// Plan fields plus the inputs that produced them.
pub fn to_json(model: &ModelSpec, cluster: &ClusterSpec, cfg: &ParallelConfig, p: &Plan) -> serde_json::Value {
    let mut v = serde_json::to_value(p).expect("plan serializes");
    let o = v.as_object_mut().expect("object");
    o.insert("model".into(), model.name.clone().into());
    o.insert("cluster".into(), cluster.name.clone().into());
    o.insert("gpus".into(), cfg.gpus().into());
    o.insert("config".into(), serde_json::to_value(cfg).expect("config serializes"));
    v
}

pub fn print_human(model: &ModelSpec, cluster: &ClusterSpec, cfg: &ParallelConfig, p: &Plan) {
    println!(
        "{} ({:.1} B params) on {} × {} ({} nodes of {})",
        model.name,
        p.params / 1e9,
        cfg.gpus(),
        cluster.device.name,
        cfg.gpus().div_ceil(cluster.node.devices),
        cluster.node.devices
    );
    let cp = if cfg.cp > 1 {
        format!(" · cp {}", cfg.cp)
    } else {
        String::new()
    };
    println!(
        "layout: tp {}{cp} · pp {} · dp {} | micro-batch {} · global batch {} ({} microbatches) | zero {} | recompute {} | sp {} | virtual stages {} | flash {} | {} | order {}",
        cfg.tp, cfg.pp, cfg.dp, cfg.micro_batch, cfg.global_batch, p.microbatches, cfg.zero,
        cfg.recompute, cfg.sequence_parallel, cfg.virtual_stages, cfg.flash_attention,
        if cfg.fp8 { "bf16 + fp8 linears" } else { cfg.dtype.as_str() }, cfg.order
    );
    let m = &p.memory_bytes;
    println!("\nmemory per device");
    for (k, v) in [
        ("weights", m.weights),
        ("grads", m.grads),
        ("optimizer", m.optimizer),
        ("activations", m.activations),
        ("other", m.other),
        ("total", m.total),
    ] {
        println!("  {k:<12} {:>12}  {}", bytes(v), pct(v, m.total));
    }
    println!("  {:<12} {:>12}", "capacity", bytes(p.capacity_bytes));
    if p.fits {
        println!("  fits, {} free", bytes(p.headroom_bytes));
    } else {
        println!("  DOES NOT FIT: over by {}", bytes(-p.headroom_bytes));
    }
    let t = &p.time_s;
    println!("\nstep time");
    for (k, v) in [
        ("compute", t.compute),
        ("tp_comm", t.tp_comm),
        ("pp_comm", t.pp_comm),
        ("cp_comm", t.cp_comm),
        ("dp_comm", t.dp_comm),
        ("bubble", t.bubble),
        ("optimizer", t.optimizer),
        ("step", p.step_time_s),
    ] {
        if k == "cp_comm" && cfg.cp == 1 {
            continue;
        }
        println!("  {k:<12} {:>12}  {}", secs(v), pct(v, p.step_time_s));
    }
    println!(
        "\nthroughput: {:.0} tokens/s | {} model TFLOP/s per device (MFU {:.1} %) | {} hardware TFLOP/s (HFU {:.1} %)",
        p.tokens_per_s,
        tflops(p.tflops_per_gpu),
        100.0 * p.mfu,
        tflops(p.hfu_tflops_per_gpu),
        100.0 * p.hfu
    );
}

/// Three significant digits, so a CPU's 0.113 TFLOP/s does not print as 0.1.
fn tflops(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}
