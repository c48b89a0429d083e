#!/usr/bin/env bash
# Build, on the CPU machine, what scripts/device_check.sh runs on the GPU machine (which has no
# Rust), into .gpu/ (ignored by git; carry it to the device): the `exatrain` binary with the
# `cuda` feature and without MPI, the GPU kernel tests and the model-on-the-GPU tests, all stripped (the unstripped release
# binary is over 64 MiB). Nothing CUDA is needed here: cudarc loads the libraries at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p exatrain-cli --features cuda
# the path of test binary $2 of package $1, built with the `cuda` feature
test_binary() {
  cargo test --release -p "$1" --features cuda --test "$2" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$2"
}
kernels=$(test_binary exatrain-cuda gpu_kernels)
model=$(test_binary exatrain-train gpu_model)
mkdir -p .gpu
cp target/release/exatrain .gpu/exatrain
cp "$kernels" .gpu/gpu_kernels
cp "$model" .gpu/gpu_model
strip .gpu/exatrain .gpu/gpu_kernels .gpu/gpu_model
ls -la .gpu
