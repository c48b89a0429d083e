//! End-to-end tests of the `exatrain` binary.

use std::path::{Path, PathBuf};
use std::process::Output;
mod common;
use common::{exatrain, json, tmp_dir};

#[test]
fn plan_default_is_175b_on_128_frontier_nodes_with_every_field() {
    let v = json(&["plan", "--json"]);
    assert_eq!(v["model"], "gpt-175b");
    assert_eq!(v["cluster"], "frontier");
    assert_eq!(v["gpus"], 1024);
    assert!(v["fits"].is_boolean());
    for k in ["weights", "grads", "optimizer", "activations", "other", "total"] {
        assert!(v["memory_bytes"][k].as_f64().unwrap() >= 0.0, "{k}");
    }
    let mut sum = 0.0;
    for k in ["compute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer"] {
        sum += v["time_s"][k].as_f64().unwrap();
    }
    let step = v["step_time_s"].as_f64().unwrap();
    assert!((sum - step).abs() < 1e-9 * step);
    for k in [
        "capacity_bytes",
        "tokens_per_s",
        "tflops_per_gpu",
        "hfu_tflops_per_gpu",
        "mfu",
        "hfu",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    assert!(v["mfu"].as_f64().unwrap() < 1.0);
}

#[test]
fn plan_human_output_has_both_tables() {
    let out = exatrain(&[
        "plan",
        "--model",
        "gpt-22b",
        "--gpus",
        "64",
        "--tp",
        "2",
        "--pp",
        "4",
        "--global-batch",
        "64",
    ]);
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    for w in ["memory per device", "activations", "step time", "bubble", "MFU"] {
        assert!(s.contains(w), "missing {w}: {s}");
    }
}

#[test]
fn plan_reports_a_misfit_without_failing() {
    let v = json(&[
        "plan",
        "--json",
        "--model",
        "gpt-1t",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--pp",
        "1",
        "--global-batch",
        "8",
    ]);
    assert_eq!(v["fits"], false);
    assert!(v["headroom_bytes"].as_f64().unwrap() < 0.0);
}

/// Data-driven: bad input → exit 2 and one line naming the field.
#[test]
fn bad_input_gets_a_clear_error_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "plan",
                "--model",
                "gpt-22b",
                "--tp",
                "5",
                "--pp",
                "1",
                "--gpus",
                "10",
                "--global-batch",
                "10",
            ],
            "--tp 5 does not divide 48 heads",
        ),
        (
            &[
                "plan",
                "--model",
                "gpt-22b",
                "--tp",
                "1",
                "--pp",
                "7",
                "--gpus",
                "7",
                "--global-batch",
                "7",
                "--first-stage-layers",
                "5",
            ],
            "--first-stage-layers 5 / --last-stage-layers - leave no even split of 48 layers",
        ),
        (
            &[
                "plan",
                "--model",
                "gpt-22b",
                "--tp",
                "1",
                "--pp",
                "49",
                "--gpus",
                "49",
                "--global-batch",
                "49",
            ],
            "--pp 49 is more than the 48 layers (allowed: 1..=48)",
        ),
        (
            &["plan", "--tp", "4", "--pp", "16", "--dp", "2", "--gpus", "1024"],
            "does not equal --gpus 1024",
        ),
        (
            &["plan", "--global-batch", "100"],
            "--global-batch 100 is not divisible by --micro-batch 1 × --dp 16",
        ),
        (
            &["plan", "--zero", "5"],
            "--zero 5 is not a ZeRO stage (allowed: 0, 1, 2, 3)",
        ),
        (
            &["plan", "--micro-batch", "0"],
            "--micro-batch must be a positive integer",
        ),
        (&["plan", "--model", "gpt-9"], "known presets: bench, gpt-175b"),
        (
            &["plan", "--cluster", "summit"],
            "known presets: dgx-2h, dgx-h100, frontier",
        ),
        (&["plan", "--recompute", "half"], "allowed: none, selective, full"),
        (
            &["plan", "--gpus", "1000"],
            "--gpus 1000 is not divisible by --tp 4 × --pp 16",
        ),
        (&["plan", "--gpus", "0"], "--gpus must be a positive integer"),
        (&["plan", "--tp", "0"], "--tp must be a positive integer"),
        (
            &["export", "--format", "megatron-lm", "--pp", "0"],
            "--pp must be a positive integer",
        ),
        (
            &["train", "--ranks", "3", "--tp", "3"],
            "--tp 3 does not divide 4 heads",
        ),
        (
            &["train", "--ranks", "4", "--pp", "3"],
            "4 ranks are not divisible by --tp 1 × --pp 3",
        ),
        (&["train", "--ranks", "2", "--dp", "4"], "= 4 ranks, but the job has 2"),
        (
            &["train", "--ranks", "2", "--zero", "3"],
            "the trainer implements ZeRO 0, 1 and 2",
        ),
        (
            &["train", "--ranks", "2", "--pp", "2", "--schedule", "zigzag"],
            "allowed: gpipe, 1f1b",
        ),
        (
            &[
                "train",
                "--ranks",
                "2",
                "--pp",
                "2",
                "--virtual-stages",
                "2",
                "--micro-batch",
                "16",
            ],
            "multiple of --pp 2",
        ),
    ];
    for (args, want) in cases {
        let out = exatrain(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: got {err}, want {want}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line, got {err}");
    }
}

#[test]
fn malformed_model_file_names_the_line() {
    let scratch = tmp_dir("cli");
    let dir = scratch.path();
    let f = dir.join("bad.toml");
    std::fs::write(&f, "layers = 4\nhidden = [1]\n").unwrap();
    let out = exatrain(&["plan", "--model", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("line 2") && err.contains("hidden"), "{err}");
    let calculon = dir.join("gpt3-13B.json");
    std::fs::write(&calculon, r#"{"hidden": 5120, "feedforward": 20480, "seq_size": 2048, "attn_heads": 40, "attn_size": 128, "num_blocks": 40}"#).unwrap();
    let v = json(&[
        "plan",
        "--json",
        "--model",
        calculon.to_str().unwrap(),
        "--tp",
        "2",
        "--pp",
        "4",
        "--gpus",
        "64",
        "--global-batch",
        "64",
    ]);
    assert_eq!(v["model"], "gpt3-13B");
}

#[test]
fn train_sample_and_export_hf_end_to_end() {
    let scratch = tmp_dir("cli-train");
    let dir = scratch.path();
    let model = dir.join("tiny.toml");
    std::fs::write(
        &model,
        "name = \"tiny\"\nlayers = 1\nhidden = 32\nheads = 2\nseq_len = 32\nvocab = 512\npadded_vocab = 512\n",
    )
    .unwrap();
    let out = dir.join("run");
    let args = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--steps",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--eval-every",
        "3",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    let o = exatrain(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for k in ["loss", "lr", "tokens_per_s", "model_tflops", "mfu"] {
        assert!(lines[2][k].as_f64().unwrap() > 0.0, "{k}");
    }
    for k in ["weights", "grads", "optimizer", "activations", "workspace"] {
        assert!(lines[2]["bytes"][k].as_u64().unwrap() > 0, "{k}");
    }
    assert!(lines[2]["val_loss"].as_f64().is_some() && lines[2]["checkpoint"].is_string());
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count(),
        3
    );
    let o = exatrain(&["sample", out.to_str().unwrap(), "--prompt", "WAR, n.", "--tokens", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8(o.stdout).unwrap().starts_with("WAR, n."));
    let hf = dir.join("hf");
    let o = exatrain(&["export-hf", out.to_str().unwrap(), hf.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(hf.join(f).is_file(), "{f}");
    }
    // resume extends the run; a non-GPT-2 model is refused with the reason
    let o = exatrain(&["train", "--resume", out.to_str().unwrap(), "--steps", "4", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 1);
    // a second start in the same folder is refused; nothing was touched
    let o = exatrain(&args);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("holds a run") && err.contains("--resume") && err.contains("--overwrite"),
        "{err}"
    );
    assert!(out.join("ckpt-000004").is_dir());
    // data parallel over 2 in-process ranks trains what one process trains
    let report = dir.join("report.json");
    let o = exatrain(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--steps",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--ranks",
        "2",
        "--zero",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--overwrite",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dp: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dp.len(), 3);
    for (x, y) in dp.iter().zip(&lines) {
        let (a, b) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!((a - b).abs() < 1e-5 * b, "dp loss {a} vs single {b}");
    }
    let rep: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(rep["ranks"].as_array().unwrap().len(), 2);
    // the planner prices the buckets the run cut: --bucket-mb 25 (the default) in fp32 elements
    assert_eq!(rep["layout"]["dp_bucket"], 6_250_000);
    let measured = rep["ranks"][0]["comm_bytes"]["dp"].as_f64().unwrap();
    let planned = rep["planned"]["comm_bytes"]["dp"].as_f64().unwrap();
    assert!(
        (measured - planned).abs() <= 16.0,
        "dp bytes {measured} vs planned {planned}"
    );
    let o = exatrain(&["train", "--model", "llama3-8b", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("GPT-2 blocks only"));
}

#[test]
fn calibrate_writes_a_cluster_that_plan_reads() {
    let scratch = tmp_dir("local");
    let f = scratch.path().join("local.toml");
    let o = exatrain(&["calibrate", "--quick", "--out", f.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&[
        "plan",
        "--json",
        "--cluster",
        f.to_str().unwrap(),
        "--model",
        "bench",
        "--gpus",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--micro-batch",
        "8",
        "--global-batch",
        "8",
        "--dtype",
        "fp32",
        "--zero",
        "0",
    ]);
    assert_eq!(v["cluster"], "local");
    assert!(v["step_time_s"].as_f64().unwrap() > 0.0 && v["fits"] == true);
}

/// A fresh folder (removed when it drops) holding `reports/` and `tiny.toml`, a 2-layer GPT-2 of
/// width `hidden`.
fn report_setup(tag: &str, hidden: u32) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let scratch = tmp_dir(tag);
    let dir = scratch.path();
    let reports = dir.join("reports");
    std::fs::create_dir_all(&reports).unwrap();
    let model = dir.join("tiny.toml");
    std::fs::write(
        &model,
        format!("name = \"tiny\"\nlayers = 2\nhidden = {hidden}\nheads = 2\nseq_len = 32\nvocab = 512\npadded_vocab = 512\n"),
    )
    .unwrap();
    (scratch, reports, model)
}

/// `exatrain train --model MODEL --micro-batch 2 --out OUT --report REPORT ARGS…`, which must succeed.
fn train_report(model: &Path, out: &Path, report: &Path, args: &[&str]) {
    let mut all = vec![
        "train",
        "--model",
        model.to_str().unwrap(),
        "--micro-batch",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--overwrite",
    ];
    all.extend(args);
    let o = exatrain(&all);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn fidelity_compares_trainer_reports_term_by_term_and_flags_an_injected_error() {
    let (scratch, reports, model) = report_setup("fidelity", 32);
    let dir = scratch.path();
    for (name, ranks, extra) in [
        ("a", "2", vec!["--tp", "2"]),
        ("b", "4", vec!["--tp", "2", "--pp", "2", "--zero", "1"]),
    ] {
        let mut args = vec![
            "--steps",
            "2",
            "--global-batch",
            "4",
            "--ranks",
            ranks,
            "--ckpt-every",
            "0",
        ];
        args.extend(extra);
        train_report(&model, &dir.join("run"), &reports.join(format!("{name}.json")), &args);
    }
    // a copy of run b whose planner "predicted" twice the compute time it measured
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reports.join("b.json")).unwrap()).unwrap();
    let measured = c["measured"]["time_s"]["compute"].as_f64().unwrap();
    c["planned"]["time_s"]["compute"] = serde_json::json!(2.0 * measured);
    std::fs::write(reports.join("c.json"), c.to_string()).unwrap();
    let page = dir.join("fidelity.html");
    let v = json(&[
        "fidelity",
        "--runs",
        reports.to_str().unwrap(),
        "--json",
        "--out",
        page.to_str().unwrap(),
    ]);
    let rows = v["rows"].as_array().unwrap();
    let row = |run: &str, term: &str| rows.iter().find(|r| r["run"] == run && r["term"] == term);
    for run in ["a", "b", "c"] {
        for term in ["bytes.tp", "memory.weights", "memory.grads", "memory.optimizer"] {
            let r = row(run, term).unwrap_or_else(|| panic!("{run} {term}"));
            assert_eq!(r["rel_error"].as_f64().unwrap(), 0.0, "{run} {term}: {r}");
            assert_eq!(r["flagged"], false);
        }
    }
    assert_eq!(row("b", "bytes.pp").unwrap()["rel_error"].as_f64().unwrap(), 0.0);
    let injected = row("c", "time.compute").unwrap();
    assert!((injected["rel_error"].as_f64().unwrap() - 1.0).abs() < 1e-9 && injected["flagged"] == true);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<svg") && html.contains("id=\"fidelity\""));
    // bytes and seconds in separate panels; the page names its model, cluster and layouts
    assert_eq!(html.matches("<svg").count(), 2, "two panels");
    assert!(html.contains("bytes: held and moved") && html.contains("seconds per step"));
    assert!(
        html.contains("model tiny") && html.contains("tp 2 · pp 1"),
        "names model and layouts"
    );
    // not a report: a clear error naming the file and the missing field
    std::fs::write(reports.join("d.json"), "{\"measured\": {}}").unwrap();
    let o = exatrain(&["fidelity", "--runs", reports.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("d: no number at /measured/memory_bytes/weights"), "{err}");
}

#[test]
fn calibrate_fit_from_trainer_reports_writes_only_a_good_fit() {
    let (scratch, reports, model) = report_setup("fit", 64);
    let dir = scratch.path();
    let local = dir.join("local.toml");
    let o = exatrain(&["calibrate", "--quick", "--ranks", "2", "--out", local.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = model.to_str().unwrap();
    for (name, extra) in [
        ("dp", vec!["--zero", "1", "--no-overlap-dp"]),
        ("tp", vec!["--tp", "2"]),
        ("pp", vec!["--pp", "2"]),
    ] {
        let mut args = vec!["--steps", "3", "--global-batch", "8", "--ranks", "2", "--no-ckpt"];
        args.extend(extra);
        train_report(&model, &dir.join("run"), &reports.join(format!("{name}.json")), &args);
    }
    let before = std::fs::read(&local).unwrap();
    let fit = |files: &[&std::path::Path], extra: &[&str]| {
        let mut args = vec!["calibrate", "--cluster", local.to_str().unwrap(), "--fit"];
        args.extend(files.iter().map(|f| f.to_str().unwrap()));
        args.extend(extra);
        exatrain(&args)
    };
    let err = |o: &Output| {
        assert_eq!(o.status.code(), Some(2));
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    // too few runs: says how many are needed, writes nothing
    let o = fit(&[&reports.join("dp.json"), &reports.join("tp.json")], &[]);
    assert!(
        err(&o).contains("2 run report(s) given, at least 3 needed"),
        "{}",
        err(&o)
    );
    // a report of another model than --model says
    let o = fit(&[&reports], &["--model", "gpt-mini"]);
    assert!(
        err(&o).contains("is a run of model `tiny`, not `gpt-mini`"),
        "{}",
        err(&o)
    );
    // a report whose layout was changed after the run: its bytes give it away
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reports.join("tp.json")).unwrap()).unwrap();
    v["layout"]["tp"] = 1.into();
    v["layout"]["dp"] = 2.into();
    let forged = dir.join("forged.json");
    std::fs::write(&forged, v.to_string()).unwrap();
    let o = fit(&[&reports.join("dp.json"), &reports.join("pp.json"), &forged], &[]);
    assert!(
        err(&o).contains("the report is not of the model and layout it names"),
        "{}",
        err(&o)
    );
    assert_eq!(std::fs::read(&local).unwrap(), before, "a failed fit writes nothing");
    // the fit: written over the spec, which plan then reads, and fidelity re-predicts with
    let o = fit(&[&reports], &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(f["runs"], 3);
    assert!(f["rms_log_error_after"].as_f64().unwrap() <= f["rms_log_error_before"].as_f64().unwrap());
    let text = std::fs::read_to_string(&local).unwrap();
    assert!(
        text.contains("# Fitted by `exatrain calibrate --fit` to 3 runs"),
        "{text}"
    );
    // the measured spec it wrote over is kept beside it, and a second fit keeps that first copy
    let orig = dir.join("local.toml.orig");
    assert_eq!(std::fs::read(&orig).unwrap(), before, "the spec before the fit is kept");
    assert!(String::from_utf8_lossy(&o.stderr).contains("local.toml.orig"));
    let o = fit(&[&reports], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read(&orig).unwrap(),
        before,
        "a later fit leaves the first copy"
    );
    let p = json(&[
        "plan",
        "--json",
        "--cluster",
        local.to_str().unwrap(),
        "--model",
        m,
        "--gpus",
        "2",
        "--tp",
        "2",
        "--pp",
        "1",
        "--micro-batch",
        "2",
        "--global-batch",
        "8",
        "--dtype",
        "fp32",
    ]);
    assert!(p["step_time_s"].as_f64().unwrap() > 0.0);
    let v = json(&[
        "fidelity",
        "--runs",
        reports.to_str().unwrap(),
        "--cluster",
        local.to_str().unwrap(),
        "--json",
    ]);
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["run"] == "tp" && r["term"] == "time.compute"));
}
