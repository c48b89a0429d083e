//! What a user must never lose: runs are not overwritten, diverged training stops before a bad
//! checkpoint becomes `latest`, a resume continues the run it names, bad input is named, and the
//! tuner leaves nothing half-made behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_exatrain")
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(exe()).current_dir(dir).args(args).output().expect("runs")
}

/// A fresh folder, removed with everything in it when the test ends.
fn tmp(name: &str) -> tempfile::TempDir {
    common::tmp_dir(&format!("hard-{name}"))
}

fn tiny(dir: &Path) -> PathBuf {
    let m = dir.join("tiny.toml");
    std::fs::write(
        &m,
        "name = \"tiny\"\nlayers = 2\nhidden = 32\nheads = 2\nseq_len = 32\nvocab = 512\npadded_vocab = 512\n",
    )
    .unwrap();
    m
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn steps(lines: &str) -> Vec<u64> {
    lines
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_diverging_multi_rank_run_stops_and_never_names_a_bad_checkpoint() {
    let scratch = tmp("diverge");
    let d = scratch.path();
    let m = tiny(d);
    // lr 5: the second step's loss is far above the first's
    let o = run_in(
        d,
        &[
            "train",
            "--model",
            m.to_str().unwrap(),
            "--ranks",
            "2",
            "--lr",
            "5",
            "--min-lr",
            "0",
            "--warmup",
            "1",
            "--ckpt-every",
            "1",
            "--steps",
            "10",
            "--micro-batch",
            "2",
            "--global-batch",
            "4",
            "--out",
            "run",
            "--json",
        ],
    );
    let e = err(&o);
    assert!(e.contains("at step 2") && e.contains("divergence-factor"), "{e}");
    // the checkpoint of step 1 gave the bad loss: taken back, `latest` gone
    assert!(
        !d.join("run/latest").exists(),
        "latest must not name a diverged checkpoint"
    );
    assert!(d.join("run/ckpt-000001.diverged").is_dir());
    assert_eq!(
        steps(&std::fs::read_to_string(d.join("run/metrics.jsonl")).unwrap()),
        vec![1]
    );
}

#[test]
fn resume_continues_the_run_from_any_folder_and_metrics_hold_each_step_once() {
    let scratch = tmp("resume");
    let d = scratch.path();
    let m = tiny(d);
    let first = d.join("a");
    std::fs::create_dir_all(&first).unwrap();
    let base = [
        "train",
        "--model",
        m.to_str().unwrap(),
        "--ranks",
        "2",
        "--tp",
        "2",
        "--steps",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--ckpt-every",
        "2",
        "--out",
        "run",
        "--json",
    ];
    ok(&run_in(&first, &base));
    let run = first.join("run");
    let r = run.to_str().unwrap();
    // from another working directory, with no flags: the run is complete
    let e = err(&run_in(d, &["train", "--resume", r]));
    assert!(e.contains("already completed 3 steps"), "{e}");
    let e = err(&run_in(d, &["train", "--resume", r, "--steps", "2"]));
    assert!(e.contains("--steps 2"), "{e}");
    // resume from the step-2 checkpoint: keeps the 2-rank tp 2 layout, extends to 5 steps,
    // reports the deliberate change of --lr
    std::fs::write(run.join("latest"), "ckpt-000002").unwrap();
    let o = run_in(d, &["train", "--resume", r, "--steps", "5", "--lr", "0.002", "--json"]);
    let out = ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--lr 0.001 → 0.002"), "{stderr}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps(&out), vec![3, 4, 5]);
    assert_eq!(
        (lines[0]["ranks"].as_u64(), lines[0]["tp"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        steps(&std::fs::read_to_string(run.join("metrics.jsonl")).unwrap()),
        vec![1, 2, 3, 4, 5]
    );
    // the same command again is refused: the folder holds a run
    let e = err(&run_in(&first, &base));
    assert!(e.contains("holds a run") && e.contains("--overwrite"), "{e}");
    assert!(run.join("ckpt-000005").is_dir());
}

#[test]
fn keep_last_prunes_old_checkpoints_but_never_latest() {
    let scratch = tmp("keep");
    let d = scratch.path();
    let m = tiny(d);
    ok(&run_in(
        d,
        &[
            "train",
            "--model",
            m.to_str().unwrap(),
            "--steps",
            "4",
            "--micro-batch",
            "2",
            "--global-batch",
            "2",
            "--ckpt-every",
            "1",
            "--keep-last",
            "2",
            "--out",
            "run",
            "--json",
        ],
    ));
    let mut names: Vec<String> = std::fs::read_dir(d.join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    names.sort();
    assert_eq!(names, ["ckpt-000003", "ckpt-000004"]);
    assert_eq!(std::fs::read_to_string(d.join("run/latest")).unwrap(), "ckpt-000004");
}

#[test]
fn bad_values_are_named_with_what_is_allowed() {
    let scratch = tmp("bad");
    let d = scratch.path();
    std::fs::write(
        d.join("v100.toml"),
        "name = \"v\"\nlayers = 1\nhidden = 32\nheads = 2\nseq_len = 32\nvocab = 100\npadded_vocab = 128\n",
    )
    .unwrap();
    std::fs::write(
        d.join("huge.toml"),
        "layers = 4\nhidden = 4000000000\nheads = 2\nseq_len = 32\n",
    )
    .unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["train", "--lr", "-1"], "--lr -1: must be"),
        (&["train", "--lr", "nan"], "--lr NaN"),
        (&["train", "--min-lr", "-0.1"], "--min-lr -0.1"),
        (&["train", "--weight-decay", "inf"], "--weight-decay inf"),
        (&["train", "--grad-clip", "0"], "--grad-clip 0"),
        (&["train", "--divergence-factor", "0.5"], "--divergence-factor 0.5"),
        (&["train", "--dp", "0"], "--dp"),
        (&["plan", "--cp", "0"], "--cp must be a positive integer"),
        (
            &[
                "plan",
                "--model",
                "llama3-8b",
                "--gpus",
                "16",
                "--tp",
                "1",
                "--pp",
                "1",
                "--cp",
                "2",
            ],
            "--cp above 1 needs --flash-attention",
        ),
        (
            &[
                "plan",
                "--model",
                "llama3-8b",
                "--gpus",
                "12",
                "--tp",
                "1",
                "--pp",
                "1",
                "--cp",
                "8",
                "--flash-attention",
            ],
            "--gpus 12 is not divisible by --tp 1 × --cp 8 × --pp 1",
        ),
        (&["tune", "--max-cp", "0"], "--max-cp 0: must be a positive integer"),
        (
            &["train", "--ranks", "2", "--cp", "2"],
            "--cp above 1 needs --flash-attention",
        ),
        (
            &["train", "--ranks", "3", "--cp", "2", "--flash-attention"],
            "3 ranks are not divisible by --tp 1 × --cp 2 × --pp 1",
        ),
        (
            &["train", "--cp", "0"],
            "--tp, --cp, --pp, --dp and --virtual-stages must be positive",
        ),
        (&["train", "--ranks", "100000"], "--ranks 100000"),
        (
            &["calibrate", "--ranks", "100000"],
            "--ranks 100000: must be in 1..=256",
        ),
        (
            &["export", "--launcher", "pbs"],
            "--launcher pbs is not known (allowed: torchrun, slurm)",
        ),
        (
            &["study", "--framework", "nemo"],
            "--framework nemo is not known (allowed: megatron-lm",
        ),
        (
            &["study", "--zero", "1,4"],
            "--zero 4 is not a ZeRO stage (allowed: 0, 1, 2, 3)",
        ),
        (
            &["study", "--compare", "nemo"],
            "--compare nemo is not known (allowed: megatron-lm, megatron-deepspeed, torchtitan, any)",
        ),
        (
            &["study", "--compare-zero", "0,1"],
            "--compare-zero and --compare-no-flash go with --compare FRAMEWORK",
        ),
        (
            &["study", "--compare", "any", "--compare-zero", "7"],
            "--compare-zero 7 is not a ZeRO stage (allowed: 0, 1, 2, 3)",
        ),
        (
            &["plan", "--tp", "8", "--overlap-tp"],
            "--overlap-tp needs --sequence-parallel",
        ),
        (
            &[
                "tune",
                "--model",
                "gpt-22b",
                "--gpus",
                "8",
                "--strategy",
                "random",
                "--evaluator",
                "megatron-lm",
                "--out",
                "t",
                "--job-launcher",
                "pbs",
            ],
            "--job-launcher pbs is not known",
        ),
        (
            &[
                "tune",
                "--model",
                "llama3-8b",
                "--gpus",
                "8",
                "--strategy",
                "random",
                "--evaluator",
                "torchtitan",
                "--out",
                "t",
                "--trial-steps",
                "2",
            ],
            "--trial-steps 2: must be in 3..=100000",
        ),
        (&["plan", "--run", "v100.toml"], "--run v100.toml: not a run file"),
        (&["train", "--comm-timeout", "-5"], "--comm-timeout -5"),
        (&["train", "--steps", "-1"], "'--steps <STEPS>'"),
        (
            &["train", "--micro-batch", "2000000", "--global-batch", "2000000"],
            "--micro-batch 2000000",
        ),
        (
            &["train", "--micro-batch", "100000", "--global-batch", "100000"],
            "memory: the run needs",
        ),
        (&["train", "--model", "v100.toml", "--steps", "1"], "model vocab 100"),
        (&["plan", "--model", "huge.toml"], "`hidden` 4000000000 is too large"),
        (&["plan", "--dtype", "fp16"], "allowed: bf16, fp32"),
        (&["fidelity", "--runs", ".", "--tolerance", "nan"], "--tolerance NaN"),
        (&["study", "--node-mtbf-hours", "-1"], "--node-mtbf-hours -1"),
        (&["sample", "nowhere", "--tokens", "100000000"], "--tokens 100000000"),
        (&["sample", "nowhere", "--temperature", "-1"], "--temperature -1"),
        (
            &["tune", "--model", "gpt-22b", "--global-batch", "64", "--max-tp", "0"],
            "--max-tp 0",
        ),
        (
            &[
                "tune",
                "--model",
                "gpt-22b",
                "--global-batch",
                "64",
                "--strategy",
                "random",
                "--budget",
                "0",
            ],
            "--budget 0",
        ),
        (
            &[
                "tune",
                "--model",
                "gpt-22b",
                "--gpus",
                "1..100000000",
                "--global-batch",
                "64",
            ],
            "at most 1048576",
        ),
    ];
    for (args, want) in cases {
        let o = run_in(d, args);
        let e = err(&o);
        assert!(e.contains(want), "{args:?}: got {e}, want {want}");
        assert_eq!(e.trim().lines().count(), 1, "{args:?}: one line, got {e}");
    }
    // nothing was made by the refused runs
    assert!(!d.join("runs").exists());
}

#[test]
fn the_tuner_checks_flags_before_making_its_store_and_fails_when_every_trial_fails() {
    let scratch = tmp("tune");
    let d = scratch.path();
    let space = [
        "tune",
        "--model",
        "gpt-22b",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--max-tp",
        "1",
        "--max-pp",
        "1",
        "--zero",
        "0",
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
    ];
    let with = |cmd: &str, out: &str| {
        let mut v: Vec<&str> = space.to_vec();
        v.extend(["--eval-cmd", cmd, "--out", out]);
        v.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let args = with("echo {bogus}", "s1");
    let e = err(&run_in(d, &args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(e.contains("unknown placeholder {bogus}"), "{e}");
    assert!(!d.join("s1").exists(), "no store left behind by a typo");
    // every trial fails: exit 2 with the first failure
    let args = with("echo oops >&2; exit 3", "s2");
    let e = err(&run_in(d, &args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(e.contains("all 2 trials failed") && e.contains("oops"), "{e}");
    // literal braces: the command prints a JSON object
    let args = with("echo '{{\"tokens_per_s\": {micro_batch}00}}'", "s3");
    let out = ok(&run_in(d, &args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(out.contains("2 trials (0 failed"), "{out}");
}

#[cfg(target_os = "linux")]
#[test]
fn killing_the_tuner_ends_its_running_trial() {
    let scratch = tmp("kill");
    let d = scratch.path();
    let pidfile = d.join("trial.pid");
    let cmd = format!("echo $$ > {}; exec sleep 60 # {{trial}}", pidfile.display());
    let mut tuner = Command::new(exe())
        .current_dir(d)
        .args([
            "tune",
            "--model",
            "gpt-22b",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "--max-tp",
            "1",
            "--max-pp",
            "1",
            "--strategy",
            "random",
            "--budget",
            "1",
            "--evaluator",
            "command",
            "--timeout",
            "120",
            "--eval-cmd",
            &cmd,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut pid = None;
    for _ in 0..200 {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            pid = Some(p);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid = pid.expect("the trial started");
    let alive = |p: u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .is_ok_and(|s| !s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
    };
    assert!(alive(pid));
    tuner.kill().unwrap(); // SIGKILL: no handler runs
    tuner.wait().unwrap();
    let mut gone = false;
    for _ in 0..100 {
        if !alive(pid) {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(gone, "the trial {pid} outlived the tuner");
}

/// The exported tokenizer loads through `transformers.AutoTokenizer` and gives the ids the
/// trainer's tokenizer gives. Needs python3 with `transformers` (`.ci/run` installs it and sets
/// EXATRAIN_REQUIRE_PYTHON=1, which makes its absence a failure instead of a printed skip).
#[test]
fn the_hf_export_tokenizes_through_autotokenizer_as_sample_does() {
    let has = Command::new("python3")
        .args(["-c", "import transformers"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        assert!(
            std::env::var("EXATRAIN_REQUIRE_PYTHON").is_err(),
            "EXATRAIN_REQUIRE_PYTHON is set but python3 cannot import transformers"
        );
        eprintln!("SKIPPED: python3 with transformers is not installed (pip install transformers)");
        return;
    }
    let scratch = tmp("hf");
    let d = scratch.path();
    let m = tiny(d);
    ok(&run_in(
        d,
        &[
            "train",
            "--model",
            m.to_str().unwrap(),
            "--steps",
            "1",
            "--micro-batch",
            "2",
            "--global-batch",
            "2",
            "--out",
            "run",
            "--json",
        ],
    ));
    ok(&run_in(d, &["export-hf", "run", "hf"]));
    let prompt = "LOVE, n. A temporary insanity curable by marriage";
    let tk = exatrain_train::data::load_tokenizer(&d.join("run/data")).unwrap();
    let want: Vec<u32> = tk.encode(prompt, false).unwrap().get_ids().to_vec();
    let py = format!(
        "from transformers import AutoTokenizer\nt = AutoTokenizer.from_pretrained('hf')\nprint(t({prompt:?}, add_special_tokens=False)['input_ids'])"
    );
    let o = Command::new("python3")
        .current_dir(d)
        .args(["-c", &py])
        .output()
        .unwrap();
    let got = ok(&o);
    let got: Vec<u32> = serde_json::from_str(got.trim().lines().last().unwrap()).unwrap();
    assert_eq!(got, want);
}

/// Multi-rank training writes what one process writes: every step once in `metrics.jsonl`,
/// with the same validation losses and samples at the evaluation steps (rank 0 evaluates the
/// gathered whole model).
#[test]
fn multi_rank_metrics_carry_the_validation_loss_and_sample_of_one_process() {
    let scratch = tmp("valloss");
    let d = scratch.path();
    let model = tiny(d);
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/corpus/devils-dictionary.txt");
    let common = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        corpus.to_str().unwrap(),
        "--steps",
        "6",
        "--eval-every",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "4",
        "--json",
    ];
    let mut one = common.to_vec();
    one.extend(["--out", "one"]);
    ok(&run_in(d, &one));
    let mut four = common.to_vec();
    four.extend(["--out", "four", "--ranks", "4", "--tp", "2", "--pp", "2"]);
    ok(&run_in(d, &four));
    let lines = |run: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(d.join(run).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (a, b) = (lines("one"), lines("four"));
    assert_eq!(a.len(), 6);
    assert_eq!(b.len(), 6);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["step"], y["step"]);
        match (x["val_loss"].as_f64(), y["val_loss"].as_f64()) {
            (Some(p), Some(q)) => assert!((p - q).abs() <= 1e-5 * p.abs(), "step {}: {p} vs {q}", x["step"]),
            (None, None) => {}
            other => panic!("step {}: val_loss {other:?}", x["step"]),
        }
        assert_eq!(x["sample"], y["sample"], "step {}", x["step"]);
    }
    let evaluated: Vec<u64> = b
        .iter()
        .filter(|l| l["val_loss"].is_f64())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evaluated, vec![3, 6]);
}
