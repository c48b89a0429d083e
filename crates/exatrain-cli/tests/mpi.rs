//! 3D parallelism over real MPI ranks (`mpirun`), when built with `--features mpi`
//! (.ci/run does; it installs Open MPI). Without the feature this file has no tests.
#![cfg(feature = "mpi")]

mod common;
use common::tmp_dir;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_exatrain")
}

fn mpirun(n: usize, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["-n", &n.to_string(), "--oversubscribe", "--allow-run-as-root", exe()])
        .args(args)
        .output()
        .expect("mpirun is installed with the mpi feature (.ci/run installs openmpi-bin)")
}

fn losses(o: &Output) -> Vec<f64> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

#[test]
fn mpi_layouts_train_what_one_process_trains() {
    let scratch = tmp_dir("mpi");
    let dir = scratch.path();
    let model = dir.join("tiny.toml");
    std::fs::write(
        &model,
        "name = \"tiny\"\nlayers = 2\nhidden = 32\nheads = 2\nseq_len = 32\nvocab = 512\npadded_vocab = 512\n",
    )
    .unwrap();
    let out = dir.join("run");
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    let common = [
        "--model",
        m,
        "--steps",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "8",
        "--out",
        o,
        "--overwrite",
    ];
    let single = losses(
        &Command::new(exe())
            .arg("train")
            .args(common)
            .arg("--json")
            .output()
            .unwrap(),
    );
    assert_eq!(single.len(), 3);
    // --bucket-mb 0.001: a gradient bucket per block, reduced (MPI_Iallreduce /
    // MPI_Ireduce_scatter_block) while backward goes on
    let layouts: [(usize, &[&str]); 7] = [
        (2, &["--zero", "0"]),
        (2, &["--zero", "0", "--bucket-mb", "0.001"]),
        (2, &["--zero", "0", "--no-overlap-dp"]),
        (4, &["--tp", "2", "--pp", "2"]),
        (4, &["--tp", "2", "--dp", "2", "--sequence-parallel", "--zero", "1"]),
        (
            4,
            &[
                "--pp",
                "2",
                "--zero",
                "2",
                "--recompute",
                "full",
                "--bucket-mb",
                "0.001",
            ],
        ),
        (4, &["--tp", "2", "--zero", "1", "--recompute", "selective"]),
    ];
    for (n, flags) in layouts {
        let mut args = vec!["train", "--mpi", "--json"];
        args.extend(flags);
        args.extend(common);
        let got = losses(&mpirun(n, &args));
        assert_eq!(got.len(), 3, "{n} ranks {flags:?}");
        for (a, b) in got.iter().zip(&single) {
            assert!((a - b).abs() <= 1e-5 * b, "{n} ranks {flags:?}: {got:?} vs {single:?}");
        }
    }
}

#[test]
fn a_failing_rank_ends_the_mpi_job_with_a_message() {
    let t0 = Instant::now();
    let o = mpirun(
        2,
        &["train", "--mpi", "--data", "/nonexistent/corpus.txt", "--steps", "1"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no such file"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// `mpirun` with one command per rank (MPMD: `-n 1 A : -n 1 B`).
fn mpirun_each(ranks: &[Vec<String>]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root"]);
    for (i, r) in ranks.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-n", "1"]).args(r);
    }
    cmd.output().expect("mpirun")
}

#[test]
fn ranks_started_with_different_settings_stop_naming_the_setting() {
    let scratch = tmp_dir("mpi-agree");
    let dir = scratch.path().join("run");
    let rank = |steps: &str, lr: &str| -> Vec<String> {
        [
            exe(),
            "train",
            "--mpi",
            "--steps",
            steps,
            "--lr",
            lr,
            "--out",
            dir.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let t0 = Instant::now();
    let o = mpirun_each(&[rank("3", "0.001"), rank("4", "0.001")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("different settings: --steps"), "{err}");
    assert!(!err.contains("--lr"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert!(!dir.join("metrics.jsonl").exists(), "nothing started");
}

#[test]
fn a_rank_that_never_takes_part_ends_the_job_after_the_timeout() {
    let scratch = tmp_dir("mpi-stall");
    let dir = scratch.path().join("run");
    let t0 = Instant::now();
    // rank 1 is not exatrain at all: rank 0 waits in MPI_Init, then its watchdog ends the job
    let o = mpirun_each(&[
        [
            exe(),
            "train",
            "--mpi",
            "--comm-timeout",
            "5",
            "--out",
            dir.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        vec!["sleep".into(), "120".into()],
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--comm-timeout") && err.contains("stopped participating"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}
