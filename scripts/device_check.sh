#!/usr/bin/env bash
# The GPU issue's device check, in one call on the GPU machine (one H100/H200, CUDA 13, torch in
# its Python; no Rust): first `bash scripts/prepare_device_check.sh` on the CPU machine, then run
# this with .gpu/ carried. About 5 minutes; writes everything under $OUT and prints a summary.
#   1. the GPU kernel tests (each CUDA kernel against its CPU kernel: fp32 1e-5, bf16 1e-2)
#   1b. the model on the GPU (the CUDA backend) against the CPU: a whole step, fp32
#   2. exatrain calibrate --device cuda: NVRTC for this device, cuBLASLt bf16 GEMMs over shapes
#      (8192³ among them), beta = 1 into fp32, copy bandwidth -> a cluster spec (gpu.toml)
#   3. the PyTorch GPT-2 124M baseline (eager, and torch.compile + SDPA flash)
#   4. exatrain train --device cuda on GPT-2 124M (fp32, TF32 GEMMs), with nvidia-smi sampling
#      the device memory used, against what the planner counts
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/exatrain-device-check}
mkdir -p "$OUT"
# cudarc dlopens libcuda.so.1, libnvrtc.so.13, libcublasLt.so.13 and libnccl.so: the CUDA 13
# wheels of torch's Python hold them (NCCL only as libnccl.so.2, so link the name cudarc tries).
SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NV=$SP/nvidia
mkdir -p /tmp/exatrain-nvlib
[ -e "$NV/nccl/lib/libnccl.so.2" ] && ln -sf "$NV/nccl/lib/libnccl.so.2" /tmp/exatrain-nvlib/libnccl.so
export LD_LIBRARY_PATH="$NV/cu13/lib:$NV/nccl/lib:/tmp/exatrain-nvlib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  ls "$NV/cu13/lib" "$NV/nccl/lib" 2>&1 | head -30
} > "$OUT/env.txt" 2>&1
head -2 "$OUT/env.txt"
rc=0
echo "== 1. kernels against the CPU"
timeout 180 .gpu/gpu_kernels --ignored --test-threads=1 --nocapture > "$OUT/kernels.txt" 2>&1 || rc=1
grep -E "^test |max error|test result|panicked" "$OUT/kernels.txt"
echo "== 1b. the model on the GPU against the CPU"
timeout 120 .gpu/gpu_model --ignored --test-threads=1 --nocapture > "$OUT/model.txt" 2>&1 || rc=1
grep -E "^test |max error|test result|panicked" "$OUT/model.txt"
echo "== 2. exatrain calibrate --device cuda"
timeout 240 .gpu/exatrain calibrate --device cuda --out "$OUT/gpu.toml" > "$OUT/calibrate.txt" 2>&1 || rc=1
cat "$OUT/calibrate.txt"
echo "== 3. PyTorch GPT-2 124M baseline"
timeout 300 python3 scripts/torch_gpt2_baseline.py --micro-batch 16 > "$OUT/torch.txt" 2>"$OUT/torch.err" || rc=1
tail -3 "$OUT/torch.err"
echo "== 4. exatrain train --device cuda, GPT-2 124M"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/memory.txt" 2>/dev/null &
smi=$!
rm -rf /tmp/exatrain-gpt2-run
timeout 150 .gpu/exatrain train --device cuda --model gpt2-124m --micro-batch 8 --global-batch 8 --steps 12 \
  --eval-every 0 --json --out /tmp/exatrain-gpt2-run > "$OUT/train.jsonl" 2> "$OUT/train.err" || rc=1
kill $smi 2>/dev/null
tail -3 "$OUT/train.err"
echo "== summary"
python3 - "$OUT" <<'PY'
import json, re, sys, pathlib
out = pathlib.Path(sys.argv[1])
k = (out / "kernels.txt").read_text(errors="replace")
m = re.search(r"test result: (\w+)\. (\d+) passed; (\d+) failed", k)
print(f"kernels vs CPU: {m.group(0) if m else 'did not finish'}")
k = (out / "model.txt").read_text(errors="replace") if (out / "model.txt").exists() else ""
m = re.search(r"test result: (\w+)\. (\d+) passed; (\d+) failed", k)
print(f"model step on the GPU vs CPU: {m.group(0) if m else 'did not finish'}")
c = (out / "calibrate.txt").read_text(errors="replace")
g = re.search(r"^\s*8192\s+8192\s+8192\s+([\d.]+)", c, re.M)
print(f"bf16 8192^3 GEMM through exatrain's cuBLASLt wrapper: {g.group(1) + ' TFLOP/s' if g else 'n/a'} (torch: ~790 on H100/H200)")
print("| framework | mode | micro-batch | tokens/s | MFU % | peak GiB |")
print("|---|---|---|---|---|---|")
steps = []
tj = out / "train.jsonl"
if tj.exists():
    for line in tj.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except ValueError:
            pass
mem = [float(x) for x in (out / "memory.txt").read_text().split()] if (out / "memory.txt").exists() else []
peak_gib = max(mem) / 1024 if mem else float("nan")
late = sorted(s["tokens_per_s"] for s in steps[2:]) or sorted(s["tokens_per_s"] for s in steps)
if late:
    tps = late[len(late) // 2]
    tf = sorted(s["model_tflops"] for s in steps[2:] or steps)[len(late) // 2]
    print(f"| exatrain | fp32, TF32 GEMMs (CUDA backend) | 8 | {tps:.0f} | {100 * tf / 989.4:.1f} | {peak_gib:.1f} |")
else:
    print("| exatrain | fp32, TF32 GEMMs (CUDA backend) | 8 | did not run (see train.err) | - | - |")
planned = re.search(r"the planner counts ([\d.]+) GiB", (out / "train.err").read_text(errors="replace")) if (out / "train.err").exists() else None
print(f"exatrain peak device memory {peak_gib:.2f} GiB (nvidia-smi, whole process) vs the planner's {planned.group(1) if planned else 'n/a'} GiB")
for line in (out / "torch.txt").read_text().splitlines():
    r = json.loads(line)
    print(f"| {r['framework']} | {r['mode']} | {r['micro_batch']} | {r['tokens_per_s']:.0f} | {100*r['mfu']:.1f} | {r['peak_memory_gib']:.1f} |")
PY
exit $rc
