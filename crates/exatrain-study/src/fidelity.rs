//! Predicted against measured, term by term: for every trainer report (`exatrain train
//! --report`, which holds the measured aggregate and the planner's prediction for the same
//! layout under the same names), the relative error of each memory category, each collective
//! kind's bytes, each time term and the step time; a summary per term; and an HTML page with a
//! predicted-vs-measured scatter plot. Pure: the CLI reads the files.

use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

/// The compared terms: (name, path to the measured value, path to the predicted value).
const TERMS: [(&str, &str, &str); 17] = [
    (
        "memory.weights",
        "/measured/memory_bytes/weights",
        "/planned/memory_bytes/weights",
    ),
    (
        "memory.grads",
        "/measured/memory_bytes/grads",
        "/planned/memory_bytes/grads",
    ),
    (
        "memory.optimizer",
        "/measured/memory_bytes/optimizer",
        "/planned/memory_bytes/optimizer",
    ),
    (
        "memory.activations",
        "/measured/memory_bytes/activations",
        "/planned/memory_bytes/activations",
    ),
    ("bytes.tp", "/measured/comm_bytes/tp", "/planned/comm_bytes/tp"),
    ("bytes.pp", "/measured/comm_bytes/pp", "/planned/comm_bytes/pp"),
    ("bytes.dp", "/measured/comm_bytes/dp", "/planned/comm_bytes/dp"),
    ("bytes.cp", "/measured/comm_bytes/cp", "/planned/comm_bytes/cp"),
    ("time.compute", "/measured/time_s/compute", "/planned/time_s/compute"),
    ("time.tp_comm", "/measured/time_s/tp_comm", "/planned/time_s/tp_comm"),
    ("time.pp_comm", "/measured/time_s/pp_comm", "/planned/time_s/pp_comm"),
    ("time.cp_comm", "/measured/time_s/cp_comm", "/planned/time_s/cp_comm"),
    ("time.dp_comm", "/measured/time_s/dp_comm", "/planned/time_s/dp_comm"),
    ("time.bubble", "/measured/time_s/bubble", "/planned/time_s/bubble"),
    (
        "time.optimizer",
        "/measured/time_s/optimizer",
        "/planned/time_s/optimizer",
    ),
    ("time.step", "/measured/step_s", "/planned/step_time_s"),
    // framework logs only: the framework's peak allocated memory against the planner's total
    (
        "memory.peak",
        "/measured/memory_peak_bytes",
        "/planned/memory_bytes/total",
    ),
];

/// The terms context parallelism added: a report from before it has neither, read as 0.
const SINCE_CP: [&str; 2] = ["bytes.cp", "time.cp_comm"];

/// One term of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub run: String,
    pub term: String,
    pub predicted: f64,
    pub measured: f64,
    /// (predicted − measured) / measured; None when the measurement is 0
    pub rel_error: Option<f64>,
    /// |rel_error| above the tolerance (or a prediction where nothing was measured)
    pub flagged: bool,
}

/// Per term over all runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub term: String,
    pub runs: usize,
    pub median_abs_error: f64,
    pub max_abs_error: f64,
    pub flagged: usize,
}

/// What one report ran: its model, cluster (of the prediction) and layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunInfo {
    pub run: String,
    pub model: String,
    pub cluster: String,
    pub layout: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fidelity {
    pub tolerance: f64,
    pub runs: Vec<RunInfo>,
    pub rows: Vec<Row>,
    pub summary: Vec<Summary>,
}

/// A report's layout in one line: tp/cp/pp/dp, micro-batch, ZeRO, recompute, SP, chunks, FP8.
fn layout_line(rep: &Value) -> String {
    let l = &rep["layout"];
    let n = |k: &str| l[k].as_u64().map_or("?".into(), |x| x.to_string());
    format!(
        "tp {}{} · pp {} · dp {} · mbs {} · gbs {} · zero {} · recompute {}{}{}{}",
        n("tp"),
        match l["cp"].as_u64() {
            Some(c) if c > 1 => format!(" · cp {c}"),
            _ => String::new(),
        },
        n("pp"),
        n("dp"),
        n("micro_batch"),
        n("global_batch"),
        n("zero"),
        l["recompute"].as_str().unwrap_or("?"),
        if l["sequence_parallel"].as_bool() == Some(true) {
            " · sp"
        } else {
            ""
        },
        match l["virtual_stages"].as_u64() {
            Some(v) if v > 1 => format!(" · v {v}"),
            _ => String::new(),
        },
        if l["fp8"].as_bool() == Some(true) {
            " · fp8"
        } else {
            ""
        }
    )
}

/// Compare every (name, report) pair; a report missing a term is an error naming it.
pub fn compare(runs: &[(String, Value)], tolerance: f64) -> Result<Fidelity, String> {
    let mut rows = Vec::new();
    for (name, rep) in runs {
        for (term, m, p) in TERMS {
            let get = |path: &str| match rep.pointer(path) {
                None if SINCE_CP.contains(&term) => Ok(0.0),
                x => x
                    .and_then(Value::as_f64)
                    .ok_or_else(|| format!("{name}: no number at {path} (not an `exatrain train --report` file?)")),
            };
            // a framework log measures the step (and maybe peak memory), not the terms
            let partial = rep.get("framework_log").is_some() || term == "memory.peak";
            if partial && rep.pointer(m).is_none_or(Value::is_null) {
                continue;
            }
            let (measured, predicted) = (get(m)?, get(p)?);
            if measured == 0.0 && predicted == 0.0 {
                continue; // a term the layout does not have
            }
            let rel_error = (measured != 0.0).then(|| (predicted - measured) / measured);
            rows.push(Row {
                run: name.clone(),
                term: term.to_string(),
                predicted,
                measured,
                rel_error,
                flagged: rel_error.is_none_or(|e| e.abs() > tolerance),
            });
        }
    }
    let summary = TERMS
        .iter()
        .filter_map(|(term, _, _)| {
            let mut errs: Vec<f64> = rows
                .iter()
                .filter(|r| r.term == *term)
                .filter_map(|r| r.rel_error.map(f64::abs))
                .collect();
            let n = rows.iter().filter(|r| r.term == *term).count();
            if n == 0 {
                return None;
            }
            errs.sort_by(|a, b| a.total_cmp(b));
            let median = if errs.is_empty() {
                f64::NAN
            } else {
                errs[errs.len() / 2]
            };
            Some(Summary {
                term: term.to_string(),
                runs: n,
                median_abs_error: median,
                max_abs_error: errs.last().copied().unwrap_or(f64::NAN),
                flagged: rows.iter().filter(|r| r.term == *term && r.flagged).count(),
            })
        })
        .collect();
    let runs = runs
        .iter()
        .map(|(name, rep)| RunInfo {
            run: name.clone(),
            model: rep["model"].as_str().unwrap_or("?").to_string(),
            cluster: rep["cluster"].as_str().unwrap_or("?").to_string(),
            layout: layout_line(rep),
        })
        .collect();
    Ok(Fidelity {
        tolerance,
        runs,
        rows,
        summary,
    })
}

/// Predicted against measured on log-log axes for the terms whose kind `keep` accepts, one
/// colour per kind (0 memory, 1 bytes moved, 2 time).
fn scatter(f: &Fidelity, title: &str, unit: &str, keep: &[usize]) -> String {
    let pts: Vec<(f64, f64, usize)> = f
        .rows
        .iter()
        .filter(|r| r.measured > 0.0 && r.predicted > 0.0)
        .map(|r| {
            let kind = if r.term.starts_with("memory") {
                0
            } else if r.term.starts_with("bytes") {
                1
            } else {
                2
            };
            (r.measured, r.predicted, kind)
        })
        .filter(|p| keep.contains(&p.2))
        .collect();
    if pts.is_empty() {
        return format!("<p>{title}: nothing to plot</p>");
    }
    let lo = pts.iter().map(|p| p.0.min(p.1)).fold(f64::INFINITY, f64::min) * 0.5;
    let hi = pts.iter().map(|p| p.0.max(p.1)).fold(0.0, f64::max) * 2.0;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (560, 500)).into_drawing_area();
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(72)
                .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())?;
            chart
                .configure_mesh()
                .x_desc(format!("measured ({unit})"))
                .y_desc(format!("predicted ({unit})"))
                .x_labels(6)
                .y_labels(6)
                .x_label_formatter(&|v| crate::report::si(*v))
                .y_label_formatter(&|v| crate::report::si(*v))
                .draw()?;
            chart.draw_series(LineSeries::new([(lo, lo), (hi, hi)], &BLACK.mix(0.4)))?;
            let colors = [RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];
            for (k, name) in ["memory held", "bytes moved", "time"].iter().enumerate() {
                if !keep.contains(&k) {
                    continue;
                }
                chart
                    .draw_series(
                        pts.iter()
                            .filter(|p| p.2 == k)
                            .map(|p| Circle::new((p.0, p.1), 4, colors[k].filled())),
                    )?
                    .label(*name)
                    .legend(move |(x, y)| Circle::new((x, y), 4, colors[k].filled()));
            }
            chart.configure_series_labels().border_style(BLACK).draw()?;
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            return format!("<p>could not draw: {e}</p>");
        }
    }
    svg
}

fn pct(e: Option<f64>) -> String {
    e.map_or("-".into(), |e| format!("{:+.1} %", 100.0 * e))
}

/// The page: summary table, the scatter plot, every row (flagged ones marked), the JSON.
pub fn html(f: &Fidelity) -> String {
    let mut s = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>exatrain fidelity</title>\
         <style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}\
         .bad{background:#fdd}</style></head><body><h1>Planner fidelity</h1>",
    );
    let uniq = |g: &dyn Fn(&RunInfo) -> &str| {
        let mut v: Vec<&str> = f.runs.iter().map(g).collect();
        v.sort();
        v.dedup();
        v.join(", ").replace('<', "&lt;")
    };
    s += &format!(
        "<p>model {}; predicted on cluster {}; {} runs, {} terms; flagged: |error| &gt; {:.0} %.</p>",
        uniq(&|r| r.model.as_str()),
        uniq(&|r| r.cluster.as_str()),
        f.runs.len(),
        f.rows.len(),
        100.0 * f.tolerance
    );
    s += "<table><tr><th>term</th><th>runs</th><th>median |error|</th><th>max |error|</th><th>flagged</th></tr>";
    for t in &f.summary {
        s += &format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.term,
            t.runs,
            pct(Some(t.median_abs_error)),
            pct(Some(t.max_abs_error)),
            t.flagged
        );
    }
    s += "</table><h2>Runs</h2><table><tr><th>run</th><th>model</th><th>predicted on</th><th>layout</th></tr>";
    let esc = |x: &str| x.replace('&', "&amp;").replace('<', "&lt;");
    for r in &f.runs {
        s += &format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&r.run),
            esc(&r.model),
            esc(&r.cluster),
            esc(&r.layout)
        );
    }
    s += "</table><div style=\"display:flex;flex-wrap:wrap\">";
    s += &scatter(f, "bytes: held and moved", "bytes", &[0, 1]);
    s += &scatter(f, "seconds per step", "s", &[2]);
    s += "</div>";
    s += "<table><tr><th>run</th><th>term</th><th>predicted</th><th>measured</th><th>error</th></tr>";
    for r in &f.rows {
        s += &format!(
            "<tr{}><td>{}</td><td>{}</td><td>{:.4e}</td><td>{:.4e}</td><td>{}</td></tr>",
            if r.flagged { " class=\"bad\"" } else { "" },
            r.run.replace('<', "&lt;"),
            r.term,
            r.predicted,
            r.measured,
            pct(r.rel_error)
        );
    }
    s += "</table><script type=\"application/json\" id=\"fidelity\">";
    s += &serde_json::to_string(f).expect("json").replace("</", "<\\/");
    s += "</script></body></html>";
    s
}
