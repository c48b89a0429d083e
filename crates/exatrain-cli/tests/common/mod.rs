//! Helpers shared by the end-to-end tests of the `exatrain` binary (each test file is its own
//! crate and uses what it needs).
#![allow(dead_code)]

use std::process::{Command, Output};

/// Run the binary under test with `args`.
pub fn exatrain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_exatrain"))
        .args(args)
        .output()
        .expect("runs")
}

/// Run it, require success, and parse its stdout as one JSON object.
pub fn json(args: &[&str]) -> serde_json::Value {
    let out = exatrain(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// A fresh folder, removed with everything in it when the test ends.
pub fn tmp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("exatrain-{name}-"))
        .tempdir()
        .expect("a folder under the system's temp dir")
}
