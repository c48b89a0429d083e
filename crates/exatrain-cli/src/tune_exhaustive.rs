//! `exatrain tune --strategy exhaustive`: the whole space on the cost model (one GPU count, or
//! the Pareto front over several), and the result table every strategy prints.

use exatrain_spec::{ClusterSpec, ModelSpec, SpecError};
use exatrain_tune::exhaustive::{self, Ranked};
use exatrain_tune::space;

use crate::table::{bytes, secs};
use crate::tune_cmd::{progress_bar, space_spec, write_result, TuneArgs};

pub(crate) fn row(r: &Ranked, value: Option<f64>) -> serde_json::Value {
    let mut v = serde_json::to_value(r.cfg).expect("serializes");
    let o = v.as_object_mut().expect("object");
    o.insert("gpus".into(), r.cfg.gpus().into());
    if let serde_json::Value::Object(p) = serde_json::to_value(r.plan).expect("serializes") {
        o.extend(p);
    }
    if let Some(m) = value {
        o.insert("measured".into(), m.into());
    }
    v
}

pub(crate) fn print_table(rows: &[(Ranked, Option<f64>)]) {
    println!(
        "{:>3} {:>3} {:>3} {:>3} {:>5} {:>4} {:>5} {:>4} {:<9} {:>2} {:>2} {:>5} {:<8} {:>10} {:>9} {:>11} {:>6}  compute/tp/pp/cp/dp/bubble/opt %",
        "#",
        "tp",
        "cp",
        "pp",
        "dp",
        "mbs",
        "gbs",
        "zero",
        "recompute",
        "sp",
        "v",
        "flash",
        "order",
        "memory",
        "step",
        "tokens/s",
        "MFU",
    );
    for (i, (r, measured)) in rows.iter().enumerate() {
        let (c, p) = (&r.cfg, &r.plan);
        let t = &p.time_s;
        let f = |x: f64| format!("{:.0}", 100.0 * x / p.step_time_s);
        println!(
            "{:>3} {:>3} {:>3} {:>3} {:>5} {:>4} {:>5} {:>4} {:<9} {:>2} {:>2} {:>5} {:<8} {:>10} {:>9} {:>11.0} {:>5.1}%  {}/{}/{}/{}/{}/{}/{}{}",
            i + 1, c.tp, c.cp, c.pp, c.dp, c.micro_batch, c.global_batch, c.zero, c.recompute.as_str(),
            if c.sequence_parallel { "y" } else { "n" }, c.virtual_stages, if c.flash_attention { "y" } else { "n" },
            c.order.to_string(), bytes(p.memory_bytes.total), secs(p.step_time_s), p.tokens_per_s, 100.0 * p.mfu,
            f(t.compute), f(t.tp_comm), f(t.pp_comm), f(t.cp_comm), f(t.dp_comm), f(t.bubble), f(t.optimizer),
            measured.map_or(String::new(), |m| format!("  measured {m:.1}"))
        );
    }
}

pub(crate) fn exhaustive_cmd(
    a: &TuneArgs,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    gpu_list: &[u32],
) -> Result<(), SpecError> {
    let s = space_spec(a, gpu_list[0])?;
    // priced with the kernel efficiency of the framework searched for
    let cluster = &cluster.for_framework_opt(s.framework);
    if gpu_list.len() > 1 {
        let pb = progress_bar(gpu_list.len() as u64, "device counts");
        let (points, front) = exhaustive::pareto(model, cluster, &s, gpu_list, &|_| {});
        pb.finish_and_clear();
        let out = serde_json::json!({
            "model": model.name, "cluster": cluster.name,
            "evaluated": points.iter().map(|p| p.evaluated).sum::<u64>(),
            "feasible": points.iter().map(|p| p.feasible).sum::<u64>(),
            "points": points.iter().map(|p| serde_json::json!({
                "gpus": p.gpus, "evaluated": p.evaluated, "feasible": p.feasible,
                "best": p.best.as_ref().map(|r| row(r, None)), "why": p.why,
            })).collect::<Vec<_>>(),
            "pareto": front,
        });
        write_result(a, &out)?;
        if a.json {
            println!("{out}");
            return Ok(());
        }
        println!(
            "{:>6} {:>10} {:>8} {:>12} {:>6}  best layout",
            "gpus", "evaluated", "feasible", "tokens/s", "MFU"
        );
        for p in &points {
            if let Some(r) = &p.best {
                println!(
                    "{:>6} {:>10} {:>8} {:>12.0} {:>5.1}%  tp {} pp {} dp {} mbs {} zero {} {} v {}{}{}",
                    p.gpus,
                    p.evaluated,
                    p.feasible,
                    r.plan.tokens_per_s,
                    100.0 * r.plan.mfu,
                    r.cfg.tp,
                    r.cfg.pp,
                    r.cfg.dp,
                    r.cfg.micro_batch,
                    r.cfg.zero,
                    r.cfg.recompute.as_str(),
                    r.cfg.virtual_stages,
                    if r.cfg.sequence_parallel { " sp" } else { "" },
                    if front.contains(&p.gpus) { "  (pareto)" } else { "" }
                );
            }
        }
        // counts with no layout in one line, with the first one's reason (--json lists each)
        let none: Vec<_> = points.iter().filter(|p| p.best.is_none()).collect();
        if let Some(first) = none.first() {
            let list: Vec<String> = none.iter().take(8).map(|p| p.gpus.to_string()).collect();
            println!(
                "{} of {} device counts have no layout ({}{}); e.g. {}: {} (--json gives each reason)",
                none.len(),
                points.len(),
                list.join(", "),
                if none.len() > 8 { ", …" } else { "" },
                first.gpus,
                first.why.as_deref().unwrap_or("no layout fits in memory")
            );
        }
        return Ok(());
    }
    if let Some(why) = space::why_empty(model, &s) {
        return Err(SpecError::new(why));
    }
    let n_shapes = space::shapes(model, &s).count() as u64;
    let pb = progress_bar(n_shapes, "layout shapes");
    let t0 = std::time::Instant::now();
    let r = exhaustive::search(model, cluster, &s, a.top, &|_| pb.inc(1));
    pb.finish_and_clear();
    let dt = t0.elapsed().as_secs_f64();
    let out = serde_json::json!({
        "model": model.name,
        "cluster": cluster.name,
        "evaluated": r.evaluated,
        "feasible": r.feasible,
        "seconds": dt,
        "best": r.best.iter().map(|x| row(x, None)).collect::<Vec<_>>(),
    });
    write_result(a, &out)?;
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} on {} × {}{}: {} layouts evaluated in {:.2} s ({:.1} M/s), {} fit in memory",
        model.name,
        s.gpus,
        cluster.device.name,
        if s.fp8 { " (FP8 linears)" } else { "" },
        r.evaluated,
        dt,
        r.evaluated as f64 / dt / 1e6,
        r.feasible
    );
    if r.best.is_empty() {
        println!("no layout fits in memory on {} GPUs", s.gpus);
        return Ok(());
    }
    let rows: Vec<(Ranked, Option<f64>)> = r.best.into_iter().map(|x| (x, None)).collect();
    print_table(&rows);
    Ok(())
}
