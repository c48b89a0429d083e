//! The study as one self-contained HTML page: SVG plots drawn with plotters, the tables, and the
//! study's JSON embedded verbatim (`<script type="application/json" id="study">`), so the page and
//! `study.json` cannot disagree.

use plotters::prelude::*;

use crate::{Point, Study};

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// (legend, points (nodes, value), dashed). Series come in pairs (strong solid, weak dashed) and a
/// pair shares a colour.
type Series = (String, Vec<(f64, f64)>, bool);

/// An axis number the way people read one: 1M, 250k, 3.5G, 0.38 (no "1000000.0").
pub fn si(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = match a {
        a if a >= 1e15 => (v / 1e15, "P"),
        a if a >= 1e12 => (v / 1e12, "T"),
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let digits = if x.abs() >= 100.0 || x == x.round() {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let t = format!("{x:.digits$}");
    let t = if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        t
    };
    format!("{t}{unit}")
}

/// Lines over node counts; the x axis is categorical (one slot per count) so that counts like
/// 16, 32, 128, 384 spread evenly and each gets its label.
fn line_chart(title: &str, y_label: &str, series: &[Series], log_y: bool) -> String {
    let mut svg = String::new();
    let mut xs: Vec<f64> = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).collect();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.dedup();
    let ys: Vec<f64> = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).collect();
    if xs.is_empty() {
        return format!("<p>{title}: no data</p>");
    }
    let slot = |x: f64| SegmentValue::CenterOf(xs.iter().position(|v| *v == x).unwrap_or(0));
    let (y0, y1) = (
        ys.iter().cloned().fold(f64::INFINITY, f64::min),
        ys.iter().cloned().fold(0.0, f64::max),
    );
    {
        let root = SVGBackend::with_string(&mut svg, (900, 380)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let (plot, legend) = root.split_horizontally(700);
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            macro_rules! body {
                ($chart:expr) => {{
                    let mut chart = $chart;
                    chart
                        .configure_mesh()
                        .disable_x_mesh()
                        .x_labels(xs.len())
                        .x_label_formatter(&|v| match v {
                            SegmentValue::CenterOf(i) if *i < xs.len() => format!("{:.0}", xs[*i]),
                            _ => String::new(),
                        })
                        .x_desc("nodes")
                        .y_desc(y_label)
                        .y_labels(6)
                        .y_label_formatter(&|v| si(*v))
                        .draw()?;
                    for (i, (_, pts, dashed)) in series.iter().enumerate() {
                        let color = COLORS[(i / 2) % COLORS.len()];
                        let style = ShapeStyle::from(&color).stroke_width(2);
                        let line: Vec<_> = pts.iter().map(|p| (slot(p.0), p.1)).collect();
                        if *dashed {
                            chart.draw_series(DashedLineSeries::new(line.iter().cloned(), 6, 4, style))?;
                        } else {
                            chart.draw_series(LineSeries::new(line.iter().cloned(), style))?;
                        }
                        chart.draw_series(line.iter().map(|p| Circle::new(p.clone(), 3, color.filled())))?;
                    }
                }};
            }
            let mut b = ChartBuilder::on(&plot);
            b.caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(72);
            let x = (0..xs.len().saturating_sub(1)).into_segmented();
            if log_y {
                body!(b.build_cartesian_2d(x, ((y0 * 0.5).max(1e-9)..y1 * 2.0).log_scale())?);
            } else {
                body!(b.build_cartesian_2d(x, 0.0..(y1 * 1.1).max(1e-9))?);
            }
            for (k, (name, _, dashed)) in series.iter().enumerate() {
                let color = COLORS[(k / 2) % COLORS.len()];
                let y = 60 + 22 * k as i32;
                let style = ShapeStyle::from(&color).stroke_width(2);
                if *dashed {
                    legend.draw(&PathElement::new(vec![(8, y), (14, y)], style))?;
                    legend.draw(&PathElement::new(vec![(18, y), (24, y)], style))?;
                } else {
                    legend.draw(&PathElement::new(vec![(8, y), (24, y)], style))?;
                }
                legend.draw(&Text::new(name.clone(), (30, y - 7), ("sans-serif", 13)))?;
            }
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            return format!("<p>{title}: could not draw: {e}</p>");
        }
    }
    svg
}

fn stacked_bars(
    title: &str,
    y_label: &str,
    labels: &[String],
    categories: &[&str],
    values: &[Vec<f64>],
    limit: Option<f64>,
) -> String {
    let mut svg = String::new();
    let top = values
        .iter()
        .map(|v| v.iter().sum::<f64>())
        .fold(limit.unwrap_or(0.0), f64::max);
    {
        let root = SVGBackend::with_string(&mut svg, (900, 400)).into_drawing_area();
        let _ = root.fill(&WHITE);
        // The plot on the left, the legend in its own column on the right.
        let (plot, legend) = root.split_horizontally(760);
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            let n = labels.len();
            let mut chart = ChartBuilder::on(&plot)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(64)
                .build_cartesian_2d((0..n.saturating_sub(1)).into_segmented(), 0f64..(top * 1.08).max(1e-9))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n.max(1))
                .x_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) if *i < labels.len() => labels[*i].clone(),
                    _ => String::new(),
                })
                .y_desc(y_label)
                .y_labels(6)
                .y_label_formatter(&|v| si(*v))
                .draw()?;
            for (c, _) in categories.iter().enumerate() {
                let color = COLORS[c % COLORS.len()];
                chart.draw_series(values.iter().enumerate().map(|(i, v)| {
                    let base: f64 = v[..c].iter().sum();
                    let mut r = Rectangle::new(
                        [
                            (SegmentValue::Exact(i), base),
                            (SegmentValue::Exact(i + 1), base + v[c]),
                        ],
                        color.filled(),
                    );
                    r.set_margin(0, 0, 12, 12);
                    r
                }))?;
            }
            if let Some(l) = limit {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(SegmentValue::Exact(0), l), (SegmentValue::Exact(n), l)],
                    ShapeStyle::from(&BLACK).stroke_width(2),
                )))?;
            }
            let mut entries: Vec<(String, ShapeStyle)> = categories
                .iter()
                .enumerate()
                .map(|(c, cat)| (cat.to_string(), COLORS[c % COLORS.len()].filled()))
                .collect();
            if limit.is_some() {
                entries.push(("capacity".into(), BLACK.filled()));
            }
            for (k, (name, style)) in entries.iter().enumerate() {
                let y = 60 + 22 * k as i32;
                legend.draw(&Rectangle::new([(8, y - 6), (22, y + 6)], *style))?;
                legend.draw(&Text::new(name.clone(), (28, y - 7), ("sans-serif", 14)))?;
            }
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            return format!("<p>{title}: could not draw: {e}</p>");
        }
    }
    svg
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A compact description of a layout.
pub fn layout(p: &Point) -> String {
    let c = &p.config;
    format!(
        "tp {}{} · pp {} · dp {} · mbs {} · gbs {} · zero {} · {}{}{}{}",
        c.tp,
        if c.cp > 1 {
            format!(" · cp {}", c.cp)
        } else {
            String::new()
        },
        c.pp,
        c.dp,
        c.micro_batch,
        p.global_batch,
        c.zero,
        c.recompute,
        if c.sequence_parallel { " · sp" } else { "" },
        if c.virtual_stages > 1 {
            format!(" · v {}", c.virtual_stages)
        } else {
            String::new()
        },
        if c.flash_attention { " · flash" } else { "" }
    )
}

fn pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{:.1} %", 100.0 * v))
}

/// The time-to-train table's cells for one row (the terminal and the page print the same), or
/// None when the row has no layout: model, nodes, tokens, model EFLOPs, days without failures,
/// GPU-hours, node-hours, energy MWh, system MTBF h, checkpoint GB, checkpoint interval min,
/// failure + checkpoint overhead, days with failures.
pub fn ttt_cells(m: &crate::ModelStudy, r: &crate::Row) -> Option<[String; 13]> {
    let t = r.time_to_train.as_ref()?;
    let c = t.checkpoint.as_ref();
    let or_dash = |f: &dyn Fn(&crate::CheckpointCost) -> String| c.map_or("–".to_string(), f);
    Some([
        m.model.clone(),
        r.nodes.to_string(),
        format!("{:.3e}", t.tokens),
        format!("{:.3e}", m.total_flops / 1e18),
        format!("{:.1}", t.days),
        format!("{:.3e}", t.gpu_hours),
        format!("{:.3e}", t.node_hours),
        t.energy_mwh.map_or("–".into(), |e| format!("{e:.0}")),
        or_dash(&|c| format!("{:.2}", c.system_mtbf_hours)),
        or_dash(&|c| format!("{:.0}", c.bytes / 1e9)),
        or_dash(&|c| format!("{:.1}", c.interval_s / 60.0)),
        or_dash(&|c| format!("{:.1} %", 100.0 * c.overhead)),
        or_dash(&|c| format!("{:.1}", c.effective_days)),
    ])
}

/// The HTML page for a study and its JSON text.
pub fn html(study: &Study, json: &str) -> String {
    let mut tput = Vec::new();
    let mut mfu = Vec::new();
    let mut eff = Vec::new();
    let mut bar_labels = Vec::new();
    let mut time_bars = Vec::new();
    let mut mem_bars = Vec::new();
    for m in &study.models {
        let pts = |f: &dyn Fn(&crate::Row) -> Option<f64>| {
            m.rows
                .iter()
                .filter_map(|r| f(r).map(|v| (r.nodes as f64, v)))
                .collect::<Vec<_>>()
        };
        tput.push((
            format!("{} (strong)", m.model),
            pts(&|r| r.strong.as_ref().map(|p| p.plan.tokens_per_s)),
            false,
        ));
        tput.push((
            format!("{} (weak)", m.model),
            pts(&|r| r.weak.as_ref().map(|p| p.plan.tokens_per_s)),
            true,
        ));
        mfu.push((
            format!("{} (strong)", m.model),
            pts(&|r| r.strong.as_ref().map(|p| 100.0 * p.plan.mfu)),
            false,
        ));
        mfu.push((
            format!("{} (weak)", m.model),
            pts(&|r| r.weak.as_ref().map(|p| 100.0 * p.plan.mfu)),
            true,
        ));
        eff.push((
            format!("{} strong", m.model),
            pts(&|r| r.strong_efficiency.map(|e| 100.0 * e)),
            false,
        ));
        eff.push((
            format!("{} weak", m.model),
            pts(&|r| r.weak_efficiency.map(|e| 100.0 * e)),
            true,
        ));
        for r in &m.rows {
            if let Some(p) = &r.strong {
                bar_labels.push(format!("{}@{}", m.model, r.nodes));
                let t = &p.plan.time_s;
                let s = p.plan.step_time_s;
                time_bars.push(
                    [
                        t.compute,
                        t.tp_comm,
                        t.pp_comm,
                        t.cp_comm,
                        t.dp_comm,
                        t.bubble,
                        t.optimizer,
                    ]
                    .iter()
                    .map(|x| 100.0 * x / s)
                    .collect(),
                );
                let mb = &p.plan.memory_bytes;
                let g = (1u64 << 30) as f64;
                mem_bars.push(
                    [mb.weights, mb.grads, mb.optimizer, mb.activations, mb.other]
                        .iter()
                        .map(|x| x / g)
                        .collect(),
                );
            }
        }
    }
    let capacity = study
        .models
        .iter()
        .flat_map(|m| m.rows.iter())
        .find_map(|r| r.strong.as_ref().map(|p| p.plan.capacity_bytes / (1u64 << 30) as f64));

    let mut h = String::new();
    h.push_str("<!doctype html><html><head><meta charset=\"utf-8\"><title>exatrain study</title><style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}td.l{text-align:left}svg{display:block;margin:1em 0}</style></head><body>");
    h.push_str(&format!(
        "<h1>exatrain study: {} on {}</h1><p>Device {} ({:.1} TFLOP/s bf16 peak). Best layout per node count from an exhaustive search of the cost model. Weak scaling grows the global batch with the node count; strong scaling keeps the smallest count's batch. Efficiencies are per-device throughput relative to the smallest count that has a layout.</p>",
        esc(&study.models.iter().map(|m| m.model.clone()).collect::<Vec<_>>().join(", ")),
        esc(&study.cluster),
        esc(&study.device),
        study.peak_tflops
    ));
    h.push_str("<h2>Best layouts and scaling</h2><table><tr><th>model</th><th>nodes</th><th>GPUs</th><th class=l>layout (strong)</th><th>tokens/s</th><th>MFU</th><th>weak MFU</th><th>weak eff.</th><th>strong eff.</th><th class=l>note</th></tr>");
    for m in &study.models {
        for r in &m.rows {
            h.push_str(&format!(
                "<tr><td class=l>{}</td><td>{}</td><td>{}</td><td class=l>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=l>{}</td></tr>",
                esc(&m.model),
                r.nodes,
                r.gpus,
                r.strong.as_ref().map_or("–".into(), layout),
                r.strong.as_ref().map_or("–".into(), |p| format!("{:.0}", p.plan.tokens_per_s)),
                pct(r.strong.as_ref().map(|p| p.plan.mfu)),
                pct(r.weak.as_ref().map(|p| p.plan.mfu)),
                pct(r.weak_efficiency),
                pct(r.strong_efficiency),
                esc(r.why.as_deref().unwrap_or(""))
            ));
        }
    }
    h.push_str("</table>");
    let compared: Vec<String> = study
        .models
        .iter()
        .flat_map(|m| {
            m.rows.iter().filter_map(move |r| {
                r.compared.as_ref().map(|e| {
                    format!(
                        "<li>{} at {} nodes against {}</li>",
                        esc(&m.model),
                        r.nodes,
                        esc(&crate::explain::sentence(e))
                    )
                })
            })
        })
        .collect();
    if !compared.is_empty() {
        h.push_str("<h2>The recommendation against a stack</h2><p>The best layout the stack runs, the step-time terms that differ (recommended − stack, seconds per step) and what the recommendation needs beyond the stack:</p><ul>");
        h.push_str(&compared.concat());
        h.push_str("</ul>");
    }
    h.push_str("<h2>Time to train</h2><table><tr><th>model</th><th>nodes</th><th>tokens</th><th>model EFLOPs</th><th>days (no failures)</th><th>GPU-hours</th><th>node-hours</th><th>energy MWh</th><th>system MTBF h</th><th>checkpoint GB</th><th>interval min</th><th>overhead</th><th>days with failures</th></tr>");
    for m in &study.models {
        for cells in m.rows.iter().filter_map(|r| ttt_cells(m, r)) {
            h.push_str("<tr>");
            for (k, cell) in cells.iter().enumerate() {
                h.push_str(&format!(
                    "<td{}>{}</td>",
                    if k == 0 { " class=l" } else { "" },
                    esc(cell)
                ));
            }
            h.push_str("</tr>");
        }
    }
    h.push_str("</table><h2>Plots</h2>");
    h.push_str(&line_chart("Throughput", "tokens/s", &tput, true));
    h.push_str(&line_chart("Model FLOPs utilization", "MFU %", &mfu, false));
    h.push_str(&line_chart("Scaling efficiency", "efficiency %", &eff, false));
    h.push_str(&stacked_bars(
        "Step time breakdown (strong-scaling layouts)",
        "% of step",
        &bar_labels,
        &[
            "compute",
            "tp_comm",
            "pp_comm",
            "cp_comm",
            "dp_comm",
            "bubble",
            "optimizer",
        ],
        &time_bars,
        None,
    ));
    h.push_str(&stacked_bars(
        "Memory per GPU (strong-scaling layouts)",
        "GiB",
        &bar_labels,
        &["weights", "grads", "optimizer", "activations", "other"],
        &mem_bars,
        capacity,
    ));
    h.push_str("<h2>Data</h2><p>Every number of this page, as written to study.json:</p><script type=\"application/json\" id=\"study\">");
    h.push_str(&json.replace("</", "<\\/"));
    h.push_str("</script></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn axis_numbers_read_with_si_suffixes() {
        let cases = [
            (1e6, "1M"),
            (2.5e5, "250k"),
            (1234.0, "1.23k"),
            (0.38, "0.38"),
            (3.0e9, "3G"),
            (42.0, "42"),
            (12.5e6, "12.5M"),
        ];
        for (v, want) in cases {
            assert_eq!(super::si(v), want, "{v}");
        }
    }
}
