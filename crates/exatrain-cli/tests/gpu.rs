//! The GPU path on a machine without one: `calibrate --device cuda` and `train --device cuda`
//! end with one clear line and exit 2 (and `train` writes nothing) — "built without CUDA" without the `cuda` feature; with it, "no CUDA driver" when
//! there is no libcuda, and "no CUDA device" when the driver is there but sees no GPU (a
//! stand-in libcuda built from tests/fixtures/no_gpu_libcuda.c). On the GPU machine,
//! scripts/device_check.sh runs the same command for real.

mod common;
use common::tmp_dir;

use std::path::Path;
use std::process::{Command, Output};

fn exatrain(args: &[&str], lib_dir: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_exatrain"));
    c.args(args);
    if let Some(d) = lib_dir {
        c.env("LD_LIBRARY_PATH", d);
    }
    c.output().expect("runs")
}

fn calibrate_cuda(lib_dir: Option<&Path>) -> Output {
    exatrain(&["calibrate", "--device", "cuda", "--quick"], lib_dir)
}

/// `train --device cuda` into a fresh folder: its error, and the folder must not exist after.
fn train_cuda(lib_dir: Option<&Path>) -> String {
    let scratch = tmp_dir("gpu-train");
    let out = scratch.path().join("run");
    let o = exatrain(
        &[
            "train",
            "--device",
            "cuda",
            "--steps",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
        lib_dir,
    );
    let err = one_line_exit_2(&o);
    assert!(!out.exists(), "nothing is written before the GPU is open: {err}");
    err
}

fn has_driver() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

/// A stand-in libcuda that loads but sees no device, in a fresh folder.
fn no_gpu_driver(tag: &str) -> tempfile::TempDir {
    let scratch = tmp_dir(&format!("no-gpu-{tag}"));
    let dir = scratch.path();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/no_gpu_libcuda.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .status()
        .expect("cc (the linker Rust uses) builds the stand-in driver");
    assert!(built.success());
    scratch
}

fn one_line_exit_2(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn calibrate_on_cuda_without_a_gpu_is_one_clear_line() {
    if !cfg!(feature = "cuda") {
        let err = one_line_exit_2(&calibrate_cuda(None));
        assert!(
            err.contains("built without CUDA") && err.contains("--features cuda"),
            "{err}"
        );
        return;
    }
    // this machine has no NVIDIA driver (CI's does not)
    if !has_driver() {
        let err = one_line_exit_2(&calibrate_cuda(None));
        assert!(err.contains("no CUDA driver") && err.contains("--device cpu"), "{err}");
    }
    // a driver library that sees no device
    let dir = no_gpu_driver("calibrate");
    let err = one_line_exit_2(&calibrate_cuda(Some(dir.path())));
    assert!(
        err.contains("no CUDA device") && err.contains("no CUDA-capable device"),
        "{err}"
    );
}

#[test]
fn train_on_cuda_without_a_gpu_is_one_clear_line_and_writes_nothing() {
    if !cfg!(feature = "cuda") {
        let err = train_cuda(None);
        assert!(
            err.contains("--device cuda") && err.contains("built without CUDA"),
            "{err}"
        );
        return;
    }
    if !has_driver() {
        let err = train_cuda(None);
        assert!(err.contains("no CUDA driver") && err.contains("--device cpu"), "{err}");
    }
    let dir = no_gpu_driver("train");
    let err = train_cuda(Some(dir.path()));
    assert!(err.contains("no CUDA device"), "{err}");
}

#[test]
fn bad_device_flags_are_named() {
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_exatrain"))
            .args(args)
            .output()
            .expect("runs");
        one_line_exit_2(&o)
    };
    let e = run(&["calibrate", "--device", "gpu"]);
    assert!(e.contains("--device") && e.contains("cpu, cuda"), "{e}");
    let e = run(&["calibrate", "--peak-tflops", "900"]);
    assert!(e.contains("--device cuda"), "{e}");
    let e = run(&["calibrate", "--device", "cuda", "--mpi"]);
    assert!(e.contains("--device cpu"), "{e}");
    let e = run(&["train", "--device", "tpu"]);
    assert!(e.contains("--device") && e.contains("cpu, cuda"), "{e}");
    let e = run(&["train", "--gpu", "1"]);
    assert!(e.contains("--gpu") && e.contains("--device cuda"), "{e}");
    let e = run(&["train", "--device", "cuda", "--mpi"]);
    assert!(e.contains("--device cpu"), "{e}");
}
