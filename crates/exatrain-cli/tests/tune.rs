//! `exatrain tune` end to end: exhaustive output, a search killed mid-way and resumed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
mod common;
use common::exatrain;

/// A fresh folder, removed with everything in it when the test ends.
fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp_dir(&format!("tune-{name}"))
}

#[test]
fn exhaustive_json_lists_the_best_first_with_plan_fields() {
    let out = exatrain(&[
        "tune",
        "--model",
        "gpt-22b",
        "--gpus",
        "64",
        "--global-batch",
        "128",
        "--top",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["evaluated"].as_u64().unwrap() >= v["feasible"].as_u64().unwrap());
    let best = v["best"].as_array().unwrap();
    assert_eq!(best.len(), 3);
    for k in [
        "tp",
        "pp",
        "dp",
        "micro_batch",
        "global_batch",
        "zero",
        "recompute",
        "fits",
        "step_time_s",
        "mfu",
        "memory_bytes",
        "time_s",
    ] {
        assert!(best[0].get(k).is_some(), "missing {k}");
    }
    let t: Vec<f64> = best.iter().map(|b| b["tokens_per_s"].as_f64().unwrap()).collect();
    assert!(t[0] >= t[1] && t[1] >= t[2]);
    assert_eq!(
        best[0]["tp"].as_u64().unwrap() * best[0]["pp"].as_u64().unwrap() * best[0]["dp"].as_u64().unwrap(),
        64
    );
}

#[test]
fn gpu_range_gives_a_pareto_front_and_says_why_a_count_is_empty() {
    let out = exatrain(&[
        "tune",
        "--model",
        "gpt-22b",
        "--gpus",
        "7..16:1",
        "--global-batch",
        "64",
        "--default-order",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 10);
    let seven = &points[0];
    assert_eq!(seven["gpus"], 7);
    assert!(
        seven["best"].is_null() && seven["why"].as_str().unwrap().contains("7 GPUs"),
        "{seven}"
    );
    assert!(!v["pareto"].as_array().unwrap().is_empty());
}

#[test]
fn tune_bad_input_is_a_clear_error() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["tune", "--model", "gpt-175b", "--gpus", "7"],
            "no (tp, pp) divides 96 layers and 96 heads into 7 GPUs",
        ),
        (
            &[
                "tune",
                "--strategy",
                "bayes",
                "--evaluator",
                "command",
                "--eval-cmd",
                "run {tp} {bogus}",
                "--gpus",
                "64",
            ],
            "unknown placeholder {bogus}",
        ),
        (
            &["tune", "--strategy", "bayes", "--evaluator", "command", "--gpus", "64"],
            "needs --eval-cmd",
        ),
        (
            &["tune", "--strategy", "random", "--no-trend", "--gpus", "64"],
            "--no-trend sets the Bayesian surrogate's mean: use it with --strategy bayes",
        ),
        (&["tune", "--zero", "4"], "--zero 4 is not a ZeRO stage"),
        (&["tune", "--gpus", "64..8"], "the range is empty"),
        (&["tune", "--resume", "/nonexistent/exatrain"], "cannot read"),
        (
            &["tune", "--cluster", "selene", "--gpus", "64", "--fp8"],
            "--fp8: the cluster's device has no FP8 tensor cores",
        ),
        (
            &[
                "tune",
                "--cluster",
                "dgx-h100",
                "--gpus",
                "16",
                "--fp8",
                "--framework",
                "torchtitan",
            ],
            "torchtitan can run none of the layouts",
        ),
        (
            &["study", "--cluster", "frontier", "--model", "gpt-22b", "--fp8"],
            "--fp8: the cluster's device has no FP8 tensor cores",
        ),
    ];
    for (args, want) in cases {
        let out = exatrain(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: got {err}, want {want}");
    }
}

#[test]
fn no_trend_is_stored_and_kept_on_resume() {
    // The same seeded search over the cost model with and without the fitted trend: the trials
    // after the random initial design differ, and a resumed --no-trend search stays one.
    let scratch = tmp("no-trend");
    let dir = scratch.path();
    let search = |name: &str, budget: &str, extra: &[&str]| {
        let out = dir.join(name);
        let mut args = vec![
            "tune",
            "--model",
            "gpt-22b",
            "--gpus",
            "64",
            "--global-batch",
            "256",
            "--strategy",
            "bayes",
            "--budget",
            budget,
            "--out",
            out.to_str().unwrap(),
            "--json",
        ];
        args.extend(extra);
        let o = exatrain(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        lines(&out)
            .iter()
            .map(|t| t["config"].to_string())
            .collect::<Vec<String>>()
    };
    let trend = search("trend", "16", &[]);
    let flat = search("flat", "14", &["--no-trend"]);
    assert_eq!(trend[..10], flat[..10], "same initial design");
    assert_ne!(trend[10..14], flat[10..14], "the mean steers the search");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("flat/search.json")).unwrap()).unwrap();
    assert_eq!(meta["no_trend"], true);
    let resumed = exatrain(&["tune", "--resume", dir.join("flat").to_str().unwrap(), "--budget", "16"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let again = search("flat-whole", "16", &["--no-trend"]);
    let flat: Vec<String> = lines(&dir.join("flat"))
        .iter()
        .map(|t| t["config"].to_string())
        .collect();
    assert_eq!(
        flat, again,
        "a resumed --no-trend search proposes what the whole one does"
    );
}

fn fake_trainer(dir: &Path) -> String {
    let p = dir.join("fake.sh");
    // Throughput from the layout, slow enough to be killed mid-search; OOM for micro-batch ≥ 4.
    std::fs::write(
        &p,
        "#!/bin/sh\nsleep 0.25\nif [ \"$3\" -ge 4 ]; then echo 'CUDA out of memory' >&2; exit 1; fi\necho \"{\\\"tokens_per_s\\\": $((1000 * $1 + 10 * $2 + $3))}\"\n",
    )
    .unwrap();
    format!("sh {} {{tp}} {{pp}} {{micro_batch}}", p.display())
}

fn lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("trials.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_killed_search_resumes_without_losing_or_repeating_trials() {
    let scratch = tmp("kill");
    let work = scratch.path();
    let cmd = fake_trainer(work);
    let common = |out: &Path| -> Vec<String> {
        [
            "tune",
            "--model",
            "gpt-22b",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--strategy",
            "bayes",
            "--initial",
            "4",
            "--budget",
            "12",
            "--seed",
            "7",
            "--evaluator",
            "command",
            "--timeout",
            "20",
            "--default-order",
            "--eval-cmd",
            &cmd,
            "--out",
            out.to_str().unwrap(),
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    // Uninterrupted reference run.
    let full = work.join("full");
    let out = Command::new(env!("CARGO_BIN_EXE_exatrain"))
        .args(common(&full))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = lines(&full);
    assert_eq!(reference.len(), 12);

    // Same search, killed after 4 finished trials.
    let cut = work.join("cut");
    let mut child = Command::new(env!("CARGO_BIN_EXE_exatrain"))
        .args(common(&cut))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while lines(&cut).len() < 4 {
        assert!(t0.elapsed() < Duration::from_secs(60), "search made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = lines(&cut);
    assert!(
        before.len() >= 4 && before.len() < 12,
        "killed mid-search: {}",
        before.len()
    );

    let out = exatrain(&["tune", "--resume", cut.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = lines(&cut);
    assert_eq!(after.len(), 12, "budget reached, nothing repeated");
    assert_eq!(&after[..before.len()], &before[..], "nothing lost");
    let configs: std::collections::HashSet<String> = after.iter().map(|t| t["config"].to_string()).collect();
    assert_eq!(configs.len(), 12, "no layout run twice");
    // With one worker, a resumed search proposes exactly what the uninterrupted one did.
    let seq = |v: &[serde_json::Value]| {
        v.iter()
            .map(|t| (t["id"].clone(), t["config"].clone(), t["outcome"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(seq(&after), seq(&reference));
    assert!(
        after.iter().any(|t| t["outcome"]["status"] == "out_of_memory"),
        "micro-batch ≥ 4 trials are OOM"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["evaluated"], 12);
    assert!(v["best"][0]["measured"].as_f64().unwrap() > 0.0);
}

/// `DIR/tiny.toml`: a GPT-2 of `layers` blocks, width 32, the trainer's smallest test model.
fn tiny_model(dir: &Path, layers: u32) -> PathBuf {
    let model = dir.join("tiny.toml");
    std::fs::write(
        &model,
        format!("name = \"tiny\"\nlayers = {layers}\nhidden = 32\nheads = 2\nseq_len = 32\nvocab = 512\npadded_vocab = 512\n"),
    )
    .unwrap();
    model
}

#[test]
fn the_trainer_is_a_tuner_evaluator_through_the_command_template() {
    let scratch = tmp("trainer-eval");
    let work = scratch.path();
    let model = tiny_model(work, 1);
    let m = model.to_str().unwrap();
    let cmd = format!(
        "{} train --model {m} --ranks {{dp}} --zero {{zero}} --micro-batch {{micro_batch}} --global-batch {{global_batch}} --steps 2 --json --out {}/run{{trial}}",
        env!("CARGO_BIN_EXE_exatrain"),
        work.display()
    );
    let out = exatrain(&[
        "tune",
        "--model",
        m,
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--max-tp",
        "1",
        "--max-pp",
        "1",
        "--zero",
        "0,1",
        "--recompute",
        "none",
        "--no-flash",
        "--default-order",
        "--strategy",
        "random",
        "--budget",
        "2",
        "--evaluator",
        "command",
        "--timeout",
        "60",
        "--eval-cmd",
        &cmd,
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["evaluated"], 2);
    assert_eq!(v["failed"], 0, "{v}");
    for b in v["best"].as_array().unwrap() {
        assert_eq!(
            (b["tp"].as_u64(), b["pp"].as_u64()),
            (Some(1), Some(1)),
            "--max-tp/--max-pp bound the space"
        );
        assert!(
            b["measured"].as_f64().unwrap() > 0.0,
            "tokens/s read from the trainer's JSON lines"
        );
    }
}

#[test]
fn the_trainer_evaluator_runs_trials_seeded_by_a_prior_and_resumes() {
    let scratch = tmp("train-prior");
    let work = scratch.path();
    let model = tiny_model(work, 2);
    let (m, out) = (model.to_str().unwrap(), work.join("search"));
    let o = out.to_str().unwrap();
    let base = [
        "tune",
        "--model",
        m,
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--zero",
        "0,1",
        "--recompute",
        "none",
        "--default-order",
        "--evaluator",
        "train",
        "--trial-steps",
        "2",
        "--timeout",
        "120",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(extra);
        exatrain(&args)
    };
    let first = run(&[
        "--strategy",
        "bayes",
        "--prior",
        "frontier",
        "--initial",
        "2",
        "--budget",
        "3",
        "--out",
        o,
        "--json",
    ]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let v: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(
        (v["evaluated"].as_u64(), v["failed"].as_u64()),
        (Some(3), Some(0)),
        "{v}"
    );
    assert_eq!(v["prior"], "frontier");
    assert!((1..=3).contains(&v["best_at_trial"].as_u64().unwrap()));
    for t in 0..3 {
        let rep: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(format!("trials/{t}/report.json"))).unwrap())
                .unwrap();
        assert!(rep["tokens_per_s"].as_f64().unwrap() > 0.0);
        let mut files: Vec<_> = std::fs::read_dir(out.join(format!("trials/{t}")))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        files.sort();
        assert_eq!(
            files,
            ["metrics.jsonl", "report.json"],
            "tuner trials write no checkpoint"
        );
    }
    let trials = lines(&out);
    let best: f64 = trials
        .iter()
        .map(|t| t["outcome"]["value"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(v["best"][0]["measured"].as_f64().unwrap(), best);
    // resumed with a larger budget: the three trials are kept, one more is run
    let again = exatrain(&["tune", "--resume", o, "--budget", "4", "--json"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let trials = lines(&out);
    assert_eq!(trials.len(), 4);
    let ids: std::collections::HashSet<u64> = trials.iter().map(|t| t["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 4, "nothing repeated");
    // bad input
    let e = run(&["--strategy", "bayes"]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("--evaluator train needs --out DIR"));
    let e = run(&[
        "--strategy",
        "random",
        "--prior",
        "frontier",
        "--out",
        work.join("x").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("--prior seeds the Bayesian search"));
    let y = work.join("y");
    let mut args = base.to_vec();
    args[8] = "3";
    args.extend(["--strategy", "bayes", "--out", y.to_str().unwrap()]);
    let e = exatrain(&args);
    assert_eq!(e.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&e.stderr).contains("the trainer implements ZeRO 0, 1 and 2"));
}

/// `tune --fp8` searches FP8 layouts, says so, and its best layout exports with Megatron-LM's
/// FP8 flags (`export --from` keeps every layout field, the optional ones included).
#[test]
fn an_fp8_search_exports_its_fp8_layout() {
    let scratch = tmp("fp8");
    let dir = scratch.path();
    let out = exatrain(&[
        "tune",
        "--model",
        "llama2-13b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--fp8",
        "--framework",
        "megatron-lm",
        "--top",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(FP8 linears)"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tune.json")).unwrap()).unwrap();
    assert_eq!(v["best"][0]["fp8"], true);
    let out = exatrain(&[
        "export",
        "--format",
        "megatron-lm",
        "--from",
        dir.join("tune.json").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let job = String::from_utf8_lossy(&out.stdout);
    assert!(job.contains("--fp8-format hybrid"), "{job}");
}

/// A command template is told each trial's context-parallel size through `{cp}`; one that does
/// not mention it is searched at cp 1 only (it could not run the others: its `{dp}` would miss
/// the cp ranks).
#[test]
fn a_command_without_cp_is_searched_at_cp_1_and_one_with_it_gets_cp() {
    let scratch = tmp("cp-template");
    let work = scratch.path();
    let search = |name: &str, cmd: &str| -> Vec<serde_json::Value> {
        let out_dir = work.join(name);
        let out = exatrain(&[
            "tune",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--strategy",
            "random",
            "--budget",
            "40",
            "--evaluator",
            "command",
            "--eval-cmd",
            cmd,
            "--out",
            out_dir.to_str().unwrap(),
            "--json",
        ]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        lines(&out_dir)
    };
    let cps = |trials: &[serde_json::Value]| -> Vec<u64> {
        trials.iter().map(|t| t["config"]["cp"].as_u64().unwrap_or(1)).collect()
    };
    let without = search("without", r#"echo '{{"tokens_per_s": {tp}}}'"#);
    assert_eq!(without.len(), 40);
    assert!(cps(&without).iter().all(|&c| c == 1), "{:?}", cps(&without));
    // with {cp} the space holds cp 2 (seq 8192) and the command receives it
    let with = search("with", r#"echo '{{"tokens_per_s": {cp}.0}}'"#);
    assert!(cps(&with).contains(&2), "{:?}", cps(&with));
    for t in &with {
        let cp = t["config"]["cp"].as_u64().unwrap_or(1) as f64;
        assert_eq!(t["outcome"]["value"].as_f64(), Some(cp), "{t}");
    }
}
