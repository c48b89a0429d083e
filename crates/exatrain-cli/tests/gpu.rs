//! The GPU path on a machine without one: `calibrate --device cuda` ends with one clear line and
//! exit 2 — "built without CUDA" without the `cuda` feature; with it, "no CUDA driver" when
//! there is no libcuda, and "no CUDA device" when the driver is there but sees no GPU (a
//! stand-in libcuda built from tests/fixtures/no_gpu_libcuda.c). On the GPU machine,
//! scripts/device_check.sh runs the same command for real.

use std::path::Path;
use std::process::{Command, Output};

fn calibrate_cuda(lib_dir: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_exatrain"));
    c.args(["calibrate", "--device", "cuda", "--quick"]);
    if let Some(d) = lib_dir {
        c.env("LD_LIBRARY_PATH", d);
    }
    c.output().expect("runs")
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
    let has_driver = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if !has_driver {
        let err = one_line_exit_2(&calibrate_cuda(None));
        assert!(err.contains("no CUDA driver") && err.contains("--device cpu"), "{err}");
    }
    // a driver library that sees no device
    let dir = std::env::temp_dir().join(format!("exatrain-no-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/no_gpu_libcuda.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .status()
        .expect("cc (the linker Rust uses) builds the stand-in driver");
    assert!(built.success());
    let err = one_line_exit_2(&calibrate_cuda(Some(&dir)));
    assert!(
        err.contains("no CUDA device") && err.contains("no CUDA-capable device"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
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
}
