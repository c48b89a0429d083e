//! Every example in README.md runs as written: each ```sh block, in order, as one `sh -e`
//! script in a scratch folder that looks like the repository root (`data/` linked), with the
//! `exatrain` under test first on the PATH. A block preceded by
//! `<!-- readme-test: skip (why) -->` is not run (the set-up commands themselves);
//! `<!-- readme-test: flags (why) -->` must get as far as running its trials (a Slurm template
//! here fails every trial, which is the expected error); `<!-- readme-test: mpi -->` runs when
//! built with the `mpi` feature (as CI builds it).

mod common;

use std::path::Path;
use std::process::Command;

#[derive(Debug, PartialEq)]
enum Mode {
    Run,
    Skip,
    Flags,
    Mpi,
}

/// The ```sh blocks of the README with how to run each.
fn blocks(readme: &str) -> Vec<(Mode, String)> {
    let mut out = Vec::new();
    let mut mode = Mode::Run;
    let mut lines = readme.lines();
    while let Some(l) = lines.next() {
        if let Some(tag) = l.strip_prefix("<!-- readme-test: ") {
            mode = if tag.starts_with("skip") {
                Mode::Skip
            } else if tag.starts_with("flags") {
                Mode::Flags
            } else if tag.starts_with("mpi") {
                Mode::Mpi
            } else {
                panic!("unknown readme-test tag: {l}")
            };
        } else if l.trim() == "```sh" {
            let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            out.push((std::mem::replace(&mut mode, Mode::Run), body.join("\n")));
        }
    }
    out
}

#[test]
fn every_readme_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = blocks(&readme);
    assert!(blocks.iter().filter(|b| b.0 == Mode::Run).count() >= 2, "{blocks:?}");
    // removed with everything the examples wrote when the test ends
    let scratch = common::tmp_dir("readme");
    let work = scratch.path();
    std::os::unix::fs::symlink(root.join("data").canonicalize().unwrap(), work.join("data")).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_exatrain"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (i, (mode, body)) in blocks.iter().enumerate() {
        match mode {
            Mode::Skip => continue,
            Mode::Mpi if !cfg!(feature = "mpi") => {
                eprintln!("README block {i} needs a build with --features mpi: not run");
                continue;
            }
            _ => {}
        }
        let t0 = std::time::Instant::now();
        let o = Command::new("sh")
            .args(["-e", "-c", body])
            .current_dir(work)
            .env("PATH", &path)
            .output()
            .expect("sh");
        let err = String::from_utf8_lossy(&o.stderr);
        eprintln!("README block {i} ({mode:?}): {:.1} s", t0.elapsed().as_secs_f64());
        match mode {
            Mode::Flags => {
                assert!(!o.status.success(), "block {i} cannot succeed here:\n{body}");
                assert!(
                    err.contains("trials failed"),
                    "block {i} must run its trials:\n{body}\n{err}"
                );
            }
            _ => assert!(
                o.status.success(),
                "README block {i} failed:\n{body}\n--- stderr:\n{err}"
            ),
        }
    }
    // what the examples promise they leave behind
    for f in [
        "report/study.json",
        "report-llama/report.html",
        "hf/model.safetensors",
        "runs/train/latest",
        "reports/3d.json",
        "fidelity.html",
        "fitted.toml",
        "runs/tune/trials.jsonl",
        "jobs/llama3-8b/launch.sh",
        "jobs/175b-frontier/rank.sh",
        "jobs/titan/exatrain_recipe.py",
        "jobs/ds/ds_config.json",
        "fitted-h100.toml",
    ] {
        assert!(work.join(f).exists(), "{f}");
    }
    let latest = std::fs::read_to_string(work.join("runs/train/latest")).unwrap();
    assert_eq!(latest.trim(), "ckpt-000060", "the resumed run reached its --steps");
    if cfg!(feature = "mpi") {
        let latest = std::fs::read_to_string(work.join("runs/mpi/latest")).unwrap();
        assert_eq!(latest.trim(), "ckpt-000012", "the resumed MPI job reached its --steps");
    }
}
