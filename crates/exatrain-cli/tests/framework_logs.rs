//! Framework logs as measurements, end to end: three short "runs" (logs in Megatron-LM's,
//! Megatron-DeepSpeed's and torchtitan's formats, their step times 1.6× what the dgx-h100 preset
//! predicts) → `calibrate --fit` → a cluster whose plans match the logs → `study` projects the
//! training with it. And the bad inputs: an unknown format, a log whose layout disagrees with its
//! run file, a torchtitan log with no layout.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
mod common;
use common::exatrain;

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// A fresh folder, removed with everything in it when the test ends.
fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp_dir(&format!("logs-{name}"))
}

/// The planner's step time for a layout under `cluster`, as `framework` runs it.
fn step(cluster: &str, framework: &str, model: &str, layout: &[&str]) -> f64 {
    let mut args = vec![
        "plan",
        "--json",
        "--model",
        model,
        "--cluster",
        cluster,
        "--framework",
        framework,
    ];
    args.extend(layout);
    let v: serde_json::Value = serde_json::from_str(&ok(exatrain(&args))).unwrap();
    v["step_time_s"].as_f64().unwrap()
}

const SLOW: f64 = 1.6;

/// The Megatron-LM run's layout (llama2-7b, tp 2 × pp 2 × dp 4), also in its argument dump.
const MEGATRON_LAYOUT: [&str; 10] = [
    "--gpus",
    "16",
    "--tp",
    "2",
    "--pp",
    "2",
    "--global-batch",
    "64",
    "--zero",
    "1",
];

/// The Megatron-DeepSpeed run's layout (llama2-7b, tp 8 × dp 4).
const DEEPSPEED_LAYOUT: [&str; 12] = [
    "--gpus",
    "32",
    "--tp",
    "8",
    "--pp",
    "1",
    "--dp",
    "4",
    "--global-batch",
    "128",
    "--zero",
    "1",
];

fn megatron_log(dir: &Path) -> PathBuf {
    megatron_log_with(dir, "megatron", &[])
}

/// [`megatron_log`] whose argument dump also prints `extra`, written as `<stem>.log`; its step
/// times stay SLOW × the plan of [`MEGATRON_LAYOUT`] with Megatron's DP overlap.
fn megatron_log_with(dir: &Path, stem: &str, extra: &[(&str, &str)]) -> PathBuf {
    // Megatron-LM with its argument dump (no run file): llama2-7b, tp 2 × pp 2 × dp 4
    let t = SLOW * step("dgx-h100", "megatron-lm", "llama2-7b", &MEGATRON_LAYOUT);
    let mut s = String::from("------------------------ arguments ------------------------\n");
    let dump = [
        ("add_bias_linear", "False"),
        ("bf16", "True"),
        ("ffn_hidden_size", "11008"),
        ("global_batch_size", "64"),
        ("hidden_dropout", "0.0"),
        ("hidden_size", "4096"),
        ("micro_batch_size", "1"),
        ("normalization", "RMSNorm"),
        ("num_attention_heads", "32"),
        ("num_layers", "32"),
        ("pipeline_model_parallel_size", "2"),
        ("position_embedding_type", "rope"),
        ("recompute_granularity", "selective"),
        ("seq_length", "4096"),
        ("swiglu", "True"),
        ("tensor_model_parallel_size", "2"),
        ("untie_embeddings_and_output_weights", "True"),
        ("use_distributed_optimizer", "True"),
        ("world_size", "16"),
        ("overlap_grad_reduce", "True"),
        ("grad_reduce_in_bf16", "True"),
    ];
    // a later line for the same argument replaces the earlier one, as the parser keeps the last
    for (k, v) in dump.iter().chain(extra) {
        s.push_str(&format!("  {k} {} {v}\n", ".".repeat(48 - k.len())));
    }
    s.push_str("-------------------- end of arguments ---------------------\n");
    s.push_str(" > padded vocab (size: 32000) with 0 dummy tokens (new size: 32000)\n");
    for i in 1..=6 {
        let ms = if i == 1 {
            30000.0
        } else {
            t * 1000.0 * (1.0 + 0.002 * (i % 3) as f64)
        };
        s.push_str(&format!(
            " [2026-08-22 12:00:0{i}.000000] iteration {i:8}/{:8} | consumed samples: {:12} | elapsed time per iteration (ms): {ms:.1} | throughput per GPU (TFLOP/s/GPU): 300.0 | learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 9.000000E+00 |\n",
            100,
            64 * i
        ));
    }
    let p = dir.join(format!("{stem}.log"));
    std::fs::write(&p, s).unwrap();
    p
}

fn with_run_file(dir: &Path, stem: &str, model: &str, layout: &[&str]) {
    let mut args = vec![
        "export",
        "--format",
        "exatrain",
        "--model",
        model,
        "--cluster",
        "dgx-h100",
    ];
    args.extend(layout);
    let out = dir.join(format!("{stem}-export"));
    args.extend(["--out", out.to_str().unwrap()]);
    ok(exatrain(&args));
    std::fs::rename(out.join("run.toml"), dir.join(format!("{stem}.toml"))).unwrap();
}

fn deepspeed_log(dir: &Path) -> PathBuf {
    let layout = DEEPSPEED_LAYOUT;
    with_run_file(dir, "deepspeed", "llama2-7b", &layout);
    let t = SLOW * step("dgx-h100", "megatron-deepspeed", "llama2-7b", &layout);
    let mut s = String::new();
    for i in 1..=5 {
        s.push_str(&format!(
            " iteration {i:8}/{:8} | consumed samples: {:12} | consumed tokens: {:12} | elapsed time per iteration (ms): {:.1} | learning rate: 1.000E-04 | global batch size:   128 | lm loss: 8.000000E+00 | loss scale: 1.0 | TFLOPs: 250.00 |\n",
            100,
            128 * i,
            128 * 4096 * i,
            t * 1000.0
        ));
    }
    let p = dir.join("deepspeed.log");
    std::fs::write(&p, s).unwrap();
    p
}

fn torchtitan_log(dir: &Path) -> PathBuf {
    let layout = [
        "--gpus",
        "64",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "64",
        "--global-batch",
        "64",
        "--zero",
        "3",
        "--flash-attention",
        "--recompute",
        "full",
    ];
    with_run_file(dir, "titan", "llama3-8b", &layout);
    let t = SLOW * step("dgx-h100", "torchtitan", "llama3-8b", &layout);
    let tps = 64.0 * 8192.0 / (t * 64.0);
    let mut s = String::new();
    for i in 1..=5 {
        s.push_str(&format!(
            "[titan] 2026-08-21 10:00:0{i},000 - root - INFO - \u{1b}[31mstep: {i:2}  \u{1b}[32mloss:  7.12345  \u{1b}[38;2;180;60;0mgrad_norm:  1.2345  \u{1b}[38;2;54;234;195mmemory: 60.00GiB(75.00%)  \u{1b}[34mtps: {}  \u{1b}[36mtflops: 400.00  \u{1b}[35mmfu: 40.00%\u{1b}[39m\n",
            // torchtitan prints tokens/s rounded with thousands separators
            format_thousands(tps.round() as u64)
        ));
    }
    let p = dir.join("titan.log");
    std::fs::write(&p, s).unwrap();
    p
}

fn format_thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `calibrate --cluster dgx-h100 --fit LOGS --out OUT`, its output.
fn fit_logs(logs: &[PathBuf], out: &Path) -> String {
    let mut args = vec![
        "calibrate",
        "--cluster",
        "dgx-h100",
        "--out",
        out.to_str().unwrap(),
        "--fit",
    ];
    args.extend(logs.iter().map(|p| p.to_str().unwrap()));
    ok(exatrain(&args))
}

#[test]
fn three_short_runs_fit_a_cluster_that_projects_the_training() {
    let scratch = tmp("fit");
    let d = scratch.path();
    let logs = [megatron_log(d), deepspeed_log(d), torchtitan_log(d)];
    let fitted = d.join("fitted.toml");
    let text = fit_logs(&logs, &fitted);
    assert!(
        text.contains("megatron-lm log") && text.contains("torchtitan log"),
        "{text}"
    );
    // the fitted spec predicts each log's step time
    for (framework, layout) in [
        ("megatron-lm", MEGATRON_LAYOUT.to_vec()),
        ("megatron-deepspeed", DEEPSPEED_LAYOUT.to_vec()),
    ] {
        let model = "llama2-7b";
        let base = step("dgx-h100", framework, model, &layout);
        let got = step(fitted.to_str().unwrap(), framework, model, &layout);
        assert!(
            (got / (SLOW * base) - 1.0).abs() < 0.08,
            "{model} {layout:?}: {got} vs {}",
            SLOW * base
        );
    }
    // fidelity prices each log as its own framework runs it: against the preset every log is
    // exactly SLOW × its plan (a DeepSpeed log priced as Megatron-LM would be 9 % off)
    let fid = |cluster: &str| -> Vec<f64> {
        let v: serde_json::Value = serde_json::from_str(&ok(exatrain(&[
            "fidelity",
            "--runs",
            d.to_str().unwrap(),
            "--cluster",
            cluster,
            "--json",
        ])))
        .unwrap();
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["term"] == "time.step")
            .map(|r| r["rel_error"].as_f64().unwrap())
            .collect()
    };
    let preset = fid("dgx-h100");
    assert_eq!(preset.len(), 3, "{preset:?}");
    assert!(
        preset.iter().all(|e| (e - (1.0 / SLOW - 1.0)).abs() < 2e-3),
        "{preset:?}"
    );
    // fidelity compares each log's step with the fitted plan
    let v: serde_json::Value = serde_json::from_str(&ok(exatrain(&[
        "fidelity",
        "--runs",
        d.to_str().unwrap(),
        "--cluster",
        fitted.to_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    let steps: Vec<f64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["term"] == "time.step")
        .map(|r| r["rel_error"].as_f64().unwrap())
        .collect();
    assert_eq!(steps.len(), 3, "{v}");
    // within 10 %: the logs are slower in every term, the fit moves only compute and bandwidth
    // (step times cannot tell memory and latency from them), and the DeepSpeed run's exposed
    // fp32 gradient all-reduce puts more of its step in the kept latency term
    assert!(steps.iter().all(|e| e.abs() < 0.10), "{steps:?}");
    // and projects the full training with it
    let days = |cluster: &str| {
        let v: serde_json::Value = serde_json::from_str(&ok(exatrain(&[
            "study",
            "--model",
            "llama2-7b",
            "--cluster",
            cluster,
            "--nodes",
            "8",
            "--tokens",
            "2T",
            "--json",
        ])))
        .unwrap();
        v["models"][0]["rows"][0]["time_to_train"]["days"]
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    let (f, b) = (days(fitted.to_str().unwrap()), days("dgx-h100"));
    assert!(f > 1.3 * b && f < 2.0 * b, "fitted {f} days vs preset {b} days");
}

/// A Megatron log is priced with what its argument dump says it ran: no
/// `--overlap-grad-reduce` exposes the DP reduction, and so does one `--ddp-bucket-size` bucket, `masked_softmax_fusion False` the unfused
/// softmax chain (the log's layout has no flash attention), and both `fidelity` and
/// `calibrate --fit` read them.
#[test]
fn a_megatron_logs_arguments_set_its_overlaps_and_fusions() {
    let scratch = tmp("switches");
    let d = scratch.path();
    megatron_log_with(d, "plain", &[]);
    megatron_log_with(d, "no-overlap", &[("overlap_grad_reduce", "False")]);
    // --ddp-bucket-size larger than a stage's parameters: one bucket, ready when backward ends
    megatron_log_with(d, "one-bucket", &[("ddp_bucket_size", "4000000000")]);
    megatron_log_with(
        d,
        "fp32-reduce",
        &[("overlap_grad_reduce", "False"), ("grad_reduce_in_bf16", "False")],
    );
    megatron_log_with(
        d,
        "unfused",
        &[("masked_softmax_fusion", "False"), ("bias_dropout_fusion", "True")],
    );
    megatron_log_with(
        d,
        "checkpointed",
        &[("checkpoint_activations", "True"), ("recompute_granularity", "None")],
    );
    megatron_log_with(
        d,
        "fsdp",
        &[
            ("use_megatron_fsdp", "True"),
            ("data_parallel_sharding_strategy", "optim_grads_params"),
        ],
    );
    // context parallelism: world 16 = tp 2 · cp 2 · pp 2 · dp 2
    megatron_log_with(
        d,
        "cp2",
        &[
            ("context_parallel_size", "2"),
            ("attention_backend", "AttnBackend.flash"),
            ("cp_comm_type", "['p2p']"),
        ],
    );
    // … with a run file and no data parallelism: the gradients are still reduced (over the two
    // CP ranks), so the dump's overlap_grad_reduce True agrees with it
    megatron_log_with(
        d,
        "cp-dp1",
        &[
            ("world_size", "8"),
            ("context_parallel_size", "2"),
            ("attention_backend", "AttnBackend.flash"),
        ],
    );
    with_run_file(
        d,
        "cp-dp1",
        "llama2-7b",
        &[
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "2",
            "--cp",
            "2",
            "--dp",
            "1",
            "--global-batch",
            "64",
            "--zero",
            "1",
            "--flash-attention",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&ok(exatrain(&[
        "fidelity",
        "--runs",
        d.to_str().unwrap(),
        "--cluster",
        "dgx-h100",
        "--json",
    ])))
    .unwrap();
    let layout = |run: &str| -> String {
        let r = v["runs"].as_array().unwrap().iter().find(|r| r["run"] == run);
        r.map_or(String::new(), |r| r["layout"].as_str().unwrap_or_default().to_string())
    };
    assert!(layout("plain").contains("zero 1"), "{v}");
    assert!(layout("cp2").contains("tp 2 · cp 2 · pp 2 · dp 2"), "{v}");
    assert!(layout("cp-dp1").contains("tp 2 · cp 2 · pp 2 · dp 1"), "{v}");
    assert!(
        layout("fsdp").contains("zero 3"),
        "Megatron-FSDP's optim_grads_params: {v}"
    );
    assert!(
        layout("checkpointed").contains("recompute full"),
        "--checkpoint-activations: {v}"
    );
    let step_error = |run: &str| -> f64 {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run"] == run && r["term"] == "time.step")
            .and_then(|r| r["rel_error"].as_f64())
            .unwrap_or_else(|| panic!("no step row for {run}: {v}"))
    };
    // every log took SLOW × the overlapped plan
    let measured = SLOW * step("dgx-h100", "megatron-lm", "llama2-7b", &MEGATRON_LAYOUT);
    assert!((step_error("plain") - (1.0 / SLOW - 1.0)).abs() < 2e-3, "{v}");
    let mut exposed = MEGATRON_LAYOUT.to_vec();
    exposed.push("--no-overlap-dp");
    let want = step("dgx-h100", "megatron-lm", "llama2-7b", &exposed) / measured - 1.0;
    assert!(want > 1.0 / SLOW - 1.0 + 1e-3, "the reduction is exposed: {want}");
    assert!(
        (step_error("no-overlap") - want).abs() < 2e-3,
        "{} vs {want}",
        step_error("no-overlap")
    );
    assert!(
        (step_error("one-bucket") - step_error("no-overlap")).abs() < 1e-9,
        "one bucket hides nothing: {} vs {}",
        step_error("one-bucket"),
        step_error("no-overlap")
    );
    // Megatron-LM's default fp32 reduction moves twice the bytes of the exported bf16 one
    assert!(
        step_error("fp32-reduce") > step_error("no-overlap") + 1e-3,
        "{} vs {}",
        step_error("fp32-reduce"),
        step_error("no-overlap")
    );
    assert!(
        step_error("unfused") > 1.0 / SLOW - 1.0 + 0.01,
        "the unfused softmax is priced: {}",
        step_error("unfused")
    );
    // calibrate --fit reads the same five logs
    let logs: Vec<PathBuf> = ["plain", "no-overlap", "fp32-reduce", "unfused", "fsdp"]
        .iter()
        .map(|n| d.join(format!("{n}.log")))
        .collect();
    let text = fit_logs(&logs, &d.join("fitted.toml"));
    assert!(text.contains("fitted 5 runs"), "{text}");
}

#[test]
fn bad_logs_get_one_clear_line() {
    let scratch = tmp("bad");
    let d = scratch.path();
    std::fs::write(d.join("noise.log"), "hello\nworld\n").unwrap();
    let titan = torchtitan_log(d);
    std::fs::remove_file(d.join("titan.toml")).unwrap();
    // a Megatron log whose argument dump disagrees with its run file
    let meg = megatron_log(d);
    with_run_file(
        d,
        "megatron",
        "llama2-7b",
        &["--gpus", "16", "--tp", "4", "--pp", "1", "--global-batch", "64"],
    );
    // a log that ran without the DP overlap its run file plans
    let unoverlapped = megatron_log_with(d, "unoverlapped", &[("overlap_grad_reduce", "False")]);
    with_run_file(d, "unoverlapped", "llama2-7b", &MEGATRON_LAYOUT);
    // partial recomputation: 4 of the 16 layers of each stage
    let partial = megatron_log_with(
        d,
        "partial",
        &[
            ("recompute_granularity", "full"),
            ("recompute_method", "block"),
            ("recompute_num_layers", "4"),
        ],
    );
    // context parallelism by all-to-all, which the planner does not price
    let a2a = megatron_log_with(
        d,
        "a2a",
        &[
            ("context_parallel_size", "2"),
            ("attention_backend", "AttnBackend.flash"),
            ("cp_comm_type", "['a2a']"),
        ],
    );
    for (file, want) in [
        (
            a2a,
            "cp_comm_type ['a2a']: exatrain prices context parallelism as the p2p ring",
        ),
        (d.join("noise.log"), "no iteration lines of a known format"),
        (titan, "a torchtitan log names no layout"),
        (meg, "ran with tensor_model_parallel_size = 2, but its run file says 4"),
        (
            unoverlapped,
            "ran with overlap_grad_reduce = False, but its run file says true",
        ),
        (partial, "recomputes 4 of the 16 layers of each pipeline chunk"),
    ] {
        let out = exatrain(&[
            "calibrate",
            "--cluster",
            "dgx-h100",
            "--out",
            "/tmp/never.toml",
            "--fit",
            file.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{file:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// A stand-in for `torchrun … pretrain_gpt.py`: prints Megatron-LM iteration lines whose time
/// depends on the layout in its flags, and Megatron's out-of-memory error for micro-batch ≥ 4.
const FAKE_TORCHRUN: &str = r#"#!/bin/bash
tp=1; pp=1; mb=1; iters=10
while [ $# -gt 0 ]; do case "$1" in
  --tensor-model-parallel-size) tp=$2; shift;;
  --pipeline-model-parallel-size) pp=$2; shift;;
  --micro-batch-size) mb=$2; shift;;
  --train-iters) iters=$2; shift;;
esac; shift; done
if [ "$mb" -ge 4 ]; then echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 1; fi
ms=$(( 1000 + 300*tp + 200*pp + 50*mb ))
for i in $(seq 1 $iters); do
  echo " [2026-08-22 12:00:00.000000] iteration $i/$iters | consumed samples: 0 | elapsed time per iteration (ms): $ms.0 | throughput per GPU (TFLOP/s/GPU): 100.0 | learning rate: 1.0E-04 | global batch size:    32 | lm loss: 5.0 |"
done
"#;

#[test]
fn tune_over_a_framework_reads_its_logs() {
    let scratch = tmp("tune");
    let d = scratch.path();
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("torchrun");
    std::fs::write(&fake, FAKE_TORCHRUN).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = d.join("search");
    let o = Command::new(env!("CARGO_BIN_EXE_exatrain"))
        .env("PATH", path)
        .args([
            "tune",
            "--model",
            "gpt-22b",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "8",
            "--global-batch",
            "32",
            "--strategy",
            "random",
            "--budget",
            "10",
            "--evaluator",
            "megatron-lm",
            "--trial-steps",
            "5",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trials: Vec<serde_json::Value> = std::fs::read_to_string(out.join("trials.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(trials.len(), 10);
    let mut ok = 0;
    for t in &trials {
        let c = &t["config"];
        let (tp, pp, mb) = (
            c["tp"].as_u64().unwrap(),
            c["pp"].as_u64().unwrap(),
            c["micro_batch"].as_u64().unwrap(),
        );
        let dir = out.join("trials").join(format!("trial-{}", t["id"]));
        assert!(dir.join("launch.sh").is_file() && dir.join("trial.log").is_file());
        match t["outcome"]["status"].as_str().unwrap() {
            "ok" => {
                ok += 1;
                let ms = (1000 + 300 * tp + 200 * pp + 50 * mb) as f64;
                let want = 32.0 * 2048.0 / (ms / 1000.0);
                let got = t["outcome"]["value"].as_f64().unwrap();
                assert!((got / want - 1.0).abs() < 1e-9, "{c}: {got} vs {want}");
            }
            "out_of_memory" => assert!(mb >= 4, "{c}"),
            s => panic!("trial {}: {s}: {}", t["id"], t["outcome"]),
        }
    }
    assert!(ok > 0, "{trials:?}");
    // every trial ran Megatron-LM's exported job, so every layout is one Megatron-LM can run
    let o = Command::new(env!("CARGO_BIN_EXE_exatrain"))
        .args([
            "tune",
            "--model",
            "gpt-22b",
            "--gpus",
            "8",
            "--strategy",
            "random",
            "--evaluator",
            "torchtitan",
            "--out",
        ])
        .arg(d.join("never"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("torchtitan can run none of the layouts"));
    assert!(!d.join("never").exists(), "a refused search leaves no store behind");
}

/// Published runs as measurements: `calibrate --fit-runs` turns each row's throughput into a
/// step time and fits the cluster they ran on; runs of other machines are left out, and a
/// cluster no run ran on is refused.
#[test]
fn published_runs_fit_the_cluster_they_ran_on() {
    let scratch = tmp("fitruns");
    let d = scratch.path();
    let csv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/published-runs.csv");
    let out = d.join("selene-fit.toml");
    let text = ok(exatrain(&[
        "calibrate",
        "--cluster",
        "selene",
        "--fit-runs",
        csv.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(text.contains("fitted 27 runs"), "{text}");
    assert!(out.is_file());
    let o = exatrain(&[
        "calibrate",
        "--cluster",
        "frontier",
        "--fit-runs",
        csv.to_str().unwrap(),
        "--out",
        d.join("f.toml").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("no run ran on --cluster frontier (its runs ran on: dgx-2h, dgx-h100, jean-zay, selene)"));
    assert!(!d.join("f.toml").exists());

    // --model keeps the rows of that model (the `model` column's preset): the four Llama 3 70B
    // runs on H100s; a model no row ran is refused, naming the models there are
    let text = ok(exatrain(&[
        "calibrate",
        "--cluster",
        "dgx-h100",
        "--model",
        "llama3-70b",
        "--fit-runs",
        csv.to_str().unwrap(),
        "--out",
        d.join("l70.toml").to_str().unwrap(),
    ]));
    assert!(text.contains("fitted 4 runs"), "{text}");
    let o = exatrain(&[
        "calibrate",
        "--cluster",
        "dgx-h100",
        "--model",
        "gpt-9b",
        "--fit-runs",
        csv.to_str().unwrap(),
        "--out",
        d.join("g.toml").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("no row is a run of --model gpt-9b"), "{e}");
    assert!(e.contains(" more)"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(!d.join("g.toml").exists());

    // One run is enough for the compute factor alone (one-shot: run briefly, then project), and
    // the spec it writes predicts that run.
    let text = std::fs::read_to_string(&csv).unwrap();
    let header = text.lines().find(|l| l.starts_with("name,")).unwrap();
    for (name, cluster) in [("k22-22b-full", "selene"), ("shoeybi19-1.2b-1gpu", "dgx-2h")] {
        one_shot(
            d,
            header,
            text.lines().find(|l| l.starts_with(&format!("{name},"))).unwrap(),
            cluster,
        );
    }
}

/// A spec fitted to one CSV row (`calibrate --fit-runs`) predicts that row as `validate` prices
/// it: with the row's own stack switches (Shoeybi 2019's unfused softmax and biases, no async
/// TP), not the cluster's.
fn one_shot(d: &Path, header: &str, row: &str, cluster: &str) {
    let one = d.join(format!("one-{cluster}.csv"));
    std::fs::write(&one, format!("{header}\n{row}\n")).unwrap();
    let spec = d.join(format!("one-shot-{cluster}.toml"));
    let said = ok(exatrain(&[
        "calibrate",
        "--cluster",
        cluster,
        "--fit-runs",
        one.to_str().unwrap(),
        "--out",
        spec.to_str().unwrap(),
    ]));
    assert!(said.contains("fitted 1 runs") && said.contains("compute ×"), "{said}");
    assert!(said.contains("bandwidth kept (fewer than 3 step times"), "{said}");
    let error = |csv: &Path| -> f64 {
        let v: serde_json::Value =
            serde_json::from_str(&ok(exatrain(&["validate", "--runs", csv.to_str().unwrap(), "--json"]))).unwrap();
        v["runs"][0]["rel_error"].as_f64().unwrap().abs()
    };
    let on_fit = d.join(format!("on-fit-{cluster}.csv"));
    std::fs::write(
        &on_fit,
        format!(
            "{header}\n{}\n",
            row.replace(&format!(",{cluster},"), &format!(",{},", spec.display()))
        ),
    )
    .unwrap();
    assert!(error(&one) > 0.002, "the preset is off this run by more than the fit");
    assert!(error(&on_fit) < 0.001, "the one-shot spec predicts its run");
}
