#!/usr/bin/env bash
# Build, on the CPU machine, what scripts/device_check.sh runs on the GPU machine (which has no
# Rust), into .gpu/ (ignored by git; carry it to the device): the `exatrain` binary with the
# `cuda` feature and without MPI, and the GPU kernel tests, both stripped (the unstripped release
# binary is over 64 MiB). Nothing CUDA is needed here: cudarc loads the libraries at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p exatrain-cli --features cuda
tests=$(cargo test --release -p exatrain-cuda --features cuda --test gpu_kernels --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_kernels":
        print(m["executable"])')
mkdir -p .gpu
cp target/release/exatrain .gpu/exatrain
cp "$tests" .gpu/gpu_kernels
strip .gpu/exatrain .gpu/gpu_kernels
ls -la .gpu
