#!/usr/bin/env python3
"""Run `exatrain export` jobs through the frameworks' own argument parsers.

For each layout below and each format, the exported job is written to a scratch folder and run
as written, with fake `torchrun`/`srun`/`module`/`scontrol` on the PATH that record the command
line and environment each rank would get. That command line then goes through:

  megatron-lm         megatron.training.arguments.parse_args + validate_args (WORLD_SIZE, RANK
                      and the exported environment set; the device taken as Hopper), and the
                      padded vocabulary Megatron will build is compared with the plan's;
  megatron-deepspeed  megatron.arguments.parse_args + validate_args of Megatron-DeepSpeed, and
                      DeepSpeed's own DeepSpeedConfig on the exported ds_config.json;
  torchtitan          the exported recipe imported and built by torchtitan (its Llama 3 config
                      function), the degrees checked by torchtitan's ParallelDims for the world
                      size, the batch arithmetic, and bf16 eager linears as planned (no float8
                      converter, no torch.compile: the registered 405B config has both);
  slurm               Slurm's `sbatch` and `srun` option parsing (a scratch slurm.conf with no
                      controller: "Unable to contact slurm controller" means every option
                      parsed), then Megatron-LM's parser on what srun would run.

Refusals by exatrain (exit 2 with a reason) are reported as such. Prints a verdict table.

Setup (not in CI: it downloads torch):
  python3.12 -m venv /tmp/fw && /tmp/fw/bin/pip install torch einops numpy packaging pyyaml
  DS_BUILD_OPS=0 /tmp/fw/bin/pip install --no-build-isolation deepspeed
  git clone https://github.com/NVIDIA/Megatron-LM; git clone https://github.com/deepspeedai/Megatron-DeepSpeed
  git clone https://github.com/pytorch/torchtitan                       # for the torchtitan rows:
  /tmp/fw/bin/pip install spmd_types==0.2.3 grain==0.2.18 torch_checkpointing "datasets<4.8" \
      tokenizers safetensors tyro tensorboard pillow torchao            # its dependencies
  apt-get install slurm-client        # for the slurm rows (optional)
  /tmp/fw/bin/python scripts/check-exports.py --megatron-lm Megatron-LM --megatron-deepspeed Megatron-DeepSpeed \
      --torchtitan torchtitan
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

# (name, model, cluster, exatrain layout flags)
LAYOUTS = [
    ("gpt-175b tp8 pp16 zero1", "gpt-175b", "frontier", "--gpus 1024 --tp 8 --pp 16 --dp 8 --global-batch 1024 --zero 1"),
    ("gpt-175b tp4 pp8 interleaved", "gpt-175b", "frontier", "--gpus 512 --tp 4 --pp 8 --dp 16 --global-batch 1024 --virtual-stages 2"),
    ("gpt-22b tp2 pp4 sp full", "gpt-22b", "frontier", "--gpus 128 --tp 2 --pp 4 --dp 16 --global-batch 256 --sequence-parallel --recompute full --zero 1"),
    ("gpt-22b zero3 dp", "gpt-22b", "frontier", "--gpus 128 --tp 1 --pp 1 --dp 128 --global-batch 256 --zero 3 --recompute full"),
    ("gpt-22b zero2 tp2", "gpt-22b", "dgx-h100", "--gpus 64 --tp 2 --pp 1 --dp 32 --global-batch 256 --zero 2"),
    ("gpt-1t tp8 pp64", "gpt-1t", "frontier", "--gpus 3072 --tp 8 --pp 64 --dp 6 --global-batch 1536 --zero 1"),
    ("mlm21-1.7b fp32 dp", "mlm21-1.7b", "selene", "--gpus 8 --tp 1 --pp 1 --dp 8 --global-batch 64 --dtype fp32 --zero 0 --recompute none"),
    ("mlm21-1.7b 12 gpus", "mlm21-1.7b", "dgx-h100", "--gpus 12 --tp 2 --pp 1 --dp 6 --global-batch 48 --flash-attention"),
    ("mlm21-1.7b tp-pp-dp", "mlm21-1.7b", "dgx-h100", "--gpus 16 --tp 2 --pp 2 --dp 4 --global-batch 64 --order tp-pp-dp"),
    ("mlm21-1.7b pp-dp-tp", "mlm21-1.7b", "dgx-h100", "--gpus 16 --tp 2 --pp 2 --dp 4 --global-batch 64 --order pp-dp-tp"),
    ("llama2-7b tp2 dp4", "llama2-7b", "dgx-h100", "--gpus 8 --tp 2 --pp 1 --dp 4 --global-batch 64 --flash-attention --sequence-parallel"),
    ("llama2-70b tp8 pp4 gqa", "llama2-70b", "dgx-h100", "--gpus 128 --tp 8 --pp 4 --dp 4 --global-batch 512 --flash-attention --sequence-parallel --zero 1"),
    ("llama3-8b tp1 zero3", "llama3-8b", "dgx-h100", "--gpus 64 --tp 1 --pp 1 --dp 64 --global-batch 256 --zero 3 --flash-attention"),
    ("llama3-8b tp2 pp2 interleaved", "llama3-8b", "dgx-h100", "--gpus 16 --tp 2 --pp 2 --dp 4 --global-batch 64 --flash-attention --sequence-parallel --virtual-stages 2"),
    ("llama3-70b tp8 pp2 zero0", "llama3-70b", "perlmutter", "--gpus 256 --tp 4 --pp 4 --dp 16 --global-batch 512 --flash-attention --sequence-parallel --zero 0"),
    ("llama3-405b tp8 pp14 zero3", "llama3-405b", "dgx-h100", "--gpus 1792 --tp 8 --pp 14 --dp 16 --global-batch 2048 --flash-attention --sequence-parallel --zero 3 --recompute full"),
    ("llama3-405b tp8 pp14", "llama3-405b", "dgx-h100", "--gpus 1792 --tp 8 --pp 14 --dp 16 --global-batch 2048 --flash-attention --sequence-parallel --zero 1 --recompute full"),
    ("llama3-70b 36 gpus", "llama3-70b", "dgx-h100", "--gpus 40 --tp 4 --pp 2 --dp 5 --global-batch 80 --flash-attention --sequence-parallel"),
    ("gpt-175b lumi", "gpt-175b", "lumi", "--gpus 1024 --tp 8 --pp 16 --dp 8 --global-batch 1024 --zero 1 --flash-attention"),
    ("gpt-22b perlmutter", "gpt-22b", "perlmutter", "--gpus 64 --tp 4 --pp 2 --dp 8 --global-batch 128 --sequence-parallel"),
    ("llama2-13b selene sel", "llama2-13b", "selene", "--gpus 32 --tp 4 --pp 1 --dp 8 --global-batch 128 --flash-attention --sequence-parallel --recompute selective"),
    ("gpt-22b dp zero2 pp2", "gpt-22b", "frontier", "--gpus 128 --tp 2 --pp 2 --dp 32 --global-batch 256 --zero 2"),
    ("llama3-70b zero3 interleaved", "llama3-70b", "dgx-h100", "--gpus 128 --tp 4 --pp 4 --dp 8 --global-batch 256 --flash-attention --sequence-parallel --zero 3 --virtual-stages 2 --recompute full"),
    ("llama3-8b zero2 tp2", "llama3-8b", "frontier", "--gpus 32 --tp 2 --pp 1 --dp 16 --global-batch 128 --flash-attention --sequence-parallel --zero 2"),
    ("llama3-405b pp16 uneven", "llama3-405b", "dgx-h100", "--gpus 2048 --tp 8 --pp 16 --dp 16 --global-batch 2048 --flash-attention --sequence-parallel --zero 1 --recompute full"),
    ("mlm21-1.7b pp5 first 8", "mlm21-1.7b", "frontier", "--gpus 20 --tp 2 --pp 5 --dp 2 --global-batch 40 --first-stage-layers 8 --zero 1"),
    ("mlm21-1.7b frontier 1 node", "mlm21-1.7b", "frontier", "--gpus 8 --tp 1 --pp 2 --dp 4 --global-batch 32 --zero 1 --flash-attention"),
    ("llama3-70b tp4 cp2 interleaved", "llama3-70b", "dgx-h100", "--gpus 128 --tp 4 --cp 2 --pp 4 --dp 4 --virtual-stages 5 --global-batch 128 --flash-attention --sequence-parallel --zero 1 --recompute none"),
    ("llama3-8b cp2 zero3", "llama3-8b", "dgx-h100", "--gpus 16 --tp 1 --cp 2 --pp 1 --dp 8 --global-batch 64 --flash-attention --zero 3"),
    ("llama2-70b fp8 interleaved", "llama2-70b", "dgx-h100", "--gpus 64 --tp 4 --pp 4 --dp 4 --virtual-stages 20 --global-batch 128 --recompute none --sequence-parallel --flash-attention --overlap-tp --zero 1 --fp8"),
    ("llama3-8b dp bucket 80M", "llama3-8b", "dgx-h100", "--gpus 64 --tp 1 --pp 1 --dp 64 --global-batch 256 --zero 1 --flash-attention --dp-bucket 80000000"),
]

FORMATS = ["megatron-lm", "megatron-deepspeed", "torchtitan", "slurm"]

FAKE = r"""#!/bin/bash
# records what would run: argv and environment
python3 - "$0" "$@" <<'PY'
import json, os, sys
with open(os.environ["EXATRAIN_RECORD"], "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
PY
"""

MEGATRON_LM = r"""
import json, os, sys
rec = json.load(open(sys.argv[1])); world = int(sys.argv[2]); expect = int(sys.argv[3]); dp = int(sys.argv[4])
args = rec["args"]
os.environ.clear(); os.environ.update(rec["env"])
os.environ["WORLD_SIZE"] = str(world); os.environ["RANK"] = "0"
sys.argv = ["pretrain_gpt.py"] + args
import megatron.training.arguments as A
A.get_device_arch_version = lambda: 9          # Hopper (MI250X behaves alike here)
a = A.parse_args()
A.validate_args(a)
mult = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
padded = -(-a.vocab_size // mult) * mult if a.vocab_size else None
if padded != expect:
    raise SystemExit(f"padded vocabulary {padded} != planned {expect}")
# world = tp · cp · pp · dp: Megatron derives the data-parallel size from the others
if a.data_parallel_size != dp:
    raise SystemExit(f"data-parallel size {a.data_parallel_size} != planned {dp}")
print("ok")
"""

MEGATRON_DS = r"""
import json, os, sys
rec = json.load(open(sys.argv[1])); world = int(sys.argv[2]); expect = int(sys.argv[3])
args = rec["args"]
os.environ.update(rec["env"]); os.environ["WORLD_SIZE"] = str(world); os.environ["RANK"] = "0"
sys.argv = ["pretrain_gpt.py"] + args
from megatron.arguments import parse_args, validate_args
a = parse_args()
validate_args(a)
mult = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
v = a.vocab_size + 1                               # Megatron-DeepSpeed's null tokenizer adds the EOD id
padded = -(-v // mult) * mult
if padded != expect:
    raise SystemExit(f"padded vocabulary {padded} != planned {expect}")
import deepspeed.runtime.config as dsc
from deepspeed.runtime.config import DeepSpeedConfig
dsc.dist.get_rank = lambda *a, **k: 0        # no process group here: rank 0 of the job
class Mpu:
    def get_data_parallel_world_size(self): return a.data_parallel_size
    def get_data_parallel_rank(self): return 0
    def get_model_parallel_world_size(self): return a.tensor_model_parallel_size
    def get_model_parallel_rank(self): return 0
    def get_sequence_parallel_world_size(self): return 1
    def get_sequence_data_parallel_world_size(self): return a.data_parallel_size
DeepSpeedConfig(a.deepspeed_config, mpu=Mpu())
print("ok")
"""


TORCHTITAN = r"""
import json, os, sys
rec = json.load(open(sys.argv[1])); world = int(sys.argv[2])
sys.path.insert(0, os.getcwd())
# the device taken as Hopper, as for Megatron-LM: the registered 405B config builds float8 linears
# at config time (the recipe then replaces them), which torchao allows only from SM89 on
import torchtitan.tools.utils
torchtitan.tools.utils.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)
import torchtitan.components.quantization.float8 as tt_float8
tt_float8.has_cuda_capability = torchtitan.tools.utils.has_cuda_capability
import exatrain_recipe
from torchtitan.distributed.parallel_dims import ParallelDims
c = exatrain_recipe.exatrain_run()
# the plan prices bf16 linear layers in eager mode: no float8 converter, no torch.compile
assert not c.compile.enable, "torch.compile is on"
assert "Float8" not in repr(c.model_spec.model), "float8 linears"
p, t = c.parallelism, c.training
dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                    cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                    ep=1, world_size=world)
dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
steps = t.num_tokens_per_train_step // (t.num_tokens_per_microbatch_per_dp_rank * dp)
assert t.num_tokens_per_train_step % (t.num_tokens_per_microbatch_per_dp_rank * dp) == 0, "batch"
if p.pipeline_parallel_degree > 1:
    assert p.num_pp_microbatches == steps, (p.num_pp_microbatches, steps)
print("ok")
"""


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def last_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:160] if lines else ""


def record(script, folder, gpus, slurm):
    """Run the exported script with fake launchers; return (argv after the program, env)."""
    fake = os.path.join(folder, "fakebin")
    os.makedirs(fake, exist_ok=True)
    for tool in ["torchrun", "srun", "module", "scontrol"]:
        p = os.path.join(fake, tool)
        with open(p, "w") as f:
            f.write(FAKE if tool in ("torchrun", "srun") else "#!/bin/bash\necho node0\n")
        os.chmod(p, 0o755)
    rec = os.path.join(folder, "record.json")
    env = {"PATH": fake + ":" + os.environ["PATH"], "EXATRAIN_RECORD": rec, "HOME": folder, "USER": "user"}
    if slurm:
        env.update(SLURM_SUBMIT_DIR=folder, SLURM_JOB_NODELIST="node0", SLURM_PROCID="0",
                   SLURM_NTASKS=str(gpus), SLURM_LOCALID="0", SLURM_NTASKS_PER_NODE="8")
    r = run(["bash", script], cwd=folder, env=env)
    if r.returncode != 0:
        raise RuntimeError("script failed: " + last_line(r.stderr))
    data = json.load(open(rec))
    argv = data["argv"][1:]
    if slurm:
        # srun OPTIONS rank.sh python PROGRAM ARGS
        i = next(k for k, a in enumerate(argv) if a.endswith("rank.sh"))
        srun_opts, rest = argv[:i], argv[i + 1:]
        rest = rest[1:]  # python
        # the wrapper's variables, as rank 0 would get them
        w = run(["bash", argv[i], "env"], env={**data["env"], "SLURM_PROCID": "0"})
        data["srun"] = srun_opts
        data["rank_env"] = dict(l.split("=", 1) for l in w.stdout.splitlines() if "=" in l)
    else:
        i = next(k for k, a in enumerate(argv) if a.endswith(".py") or a == "-m")
        rest = argv[i:]
    data["args"] = rest[1:] if rest and rest[0].endswith(".py") else rest
    return data


def check_slurm(folder, data):
    if not shutil.which("sbatch"):
        return "no slurm-client: skipped srun check"
    conf = os.path.join(folder, "slurm.conf")
    with open(conf, "w") as f:
        f.write("ClusterName=check\nSlurmctldHost=localhost\nGresTypes=gpu\nSelectType=select/cons_tres\n"
                "TaskPlugin=task/affinity\nNodeName=localhost CPUs=64 Gres=gpu:8 State=UNKNOWN\n"
                "PartitionName=batch Nodes=localhost Default=YES\n")
    env = {**os.environ, "SLURM_CONF": conf}
    for cmd in (["sbatch", "--test-only", os.path.join(folder, "job.sbatch")],
                ["srun"] + data["srun"] + ["true"]):
        r = run(cmd, env=env, timeout=60)
        if "Unable to contact slurm controller" not in r.stderr and "Unable to allocate" not in r.stderr:
            raise RuntimeError(f"{cmd[0]}: " + last_line(r.stderr))
    ranks = data["rank_env"]
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if k not in ranks or ranks[k] == "":
            raise RuntimeError(f"rank.sh leaves {k} unset")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exatrain", default="target/release/exatrain")
    ap.add_argument("--megatron-lm", help="a Megatron-LM checkout")
    ap.add_argument("--megatron-deepspeed", help="a Megatron-DeepSpeed checkout")
    ap.add_argument("--torchtitan", help="a torchtitan checkout (with its dependencies installed)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch (and deepspeed)")
    ap.add_argument("--only", help="check only this format")
    a = ap.parse_args()
    exatrain = os.path.abspath(a.exatrain)
    rows, bad = [], 0
    scratch = tempfile.mkdtemp(prefix="check-exports-")
    for name, model, cluster, flags in LAYOUTS:
        gpus = int(flags.split()[1])
        tomlf = os.path.join(scratch, "run")
        r = run([exatrain, "export", "--format", "exatrain", "--model", model, "--cluster", cluster, *flags.split(), "--out", tomlf])
        if r.returncode != 0:
            rows.append((name, "all", "INVALID", last_line(r.stderr))); bad += 1
            continue
        padded = next(int(l.split("=")[1]) for l in open(os.path.join(tomlf, "run.toml")) if l.startswith("padded_vocab"))
        for fmt in [f for f in FORMATS if not a.only or f == a.only]:
            folder = os.path.join(scratch, f"{name.replace(' ', '_')}-{fmt}")
            r = run([exatrain, "export", "--format", fmt, "--model", model, "--cluster", cluster, *flags.split(), "--out", folder])
            if r.returncode == 2:
                rows.append((name, fmt, "refused", last_line(r.stderr)))
                continue
            if r.returncode != 0:
                rows.append((name, fmt, "FAIL", "export: " + last_line(r.stderr))); bad += 1
                continue
            try:
                slurm = fmt == "slurm"
                data = record(os.path.join(folder, "job.sbatch" if slurm else "launch.sh"), folder, gpus, slurm)
                if slurm:
                    skipped = check_slurm(folder, data)
                    data["env"].update({k: v for k, v in data["rank_env"].items()})
                recf = os.path.join(folder, "record.json")
                json.dump(data, open(recf, "w"))
                if fmt == "megatron-deepspeed":
                    src, harness = a.megatron_deepspeed, MEGATRON_DS
                elif fmt == "torchtitan":
                    src, harness = a.torchtitan, TORCHTITAN
                else:
                    src, harness = a.megatron_lm, MEGATRON_LM
                if not src:
                    rows.append((name, fmt, "not checked", "give the framework's checkout")); continue
                env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
                r = run([a.python, "-c", harness, recf, str(gpus), str(padded), flags.split()[flags.split().index("--dp") + 1]], cwd=folder, env=env, timeout=600)
                if r.returncode == 0 and r.stdout.strip().endswith("ok"):
                    note = "parse_args + validate_args" + (" + DeepSpeedConfig" if fmt == "megatron-deepspeed" else "")
                    if fmt == "torchtitan":
                        note = "recipe built + ParallelDims + batch arithmetic"
                    if fmt == "slurm":
                        note = ("sbatch + srun options, rank variables, " if not skipped else skipped + "; ") + note
                    rows.append((name, fmt, "PASS", note))
                else:
                    rows.append((name, fmt, "FAIL", last_line(r.stderr or r.stdout))); bad += 1
            except Exception as e:  # noqa: BLE001 - reported in the table
                rows.append((name, fmt, "FAIL", str(e)[:160])); bad += 1
    w = max(len(r[0]) for r in rows)
    print(f"{'layout':<{w}}  {'format':<18}  {'verdict':<11}  detail")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:<18}  {r[2]:<11}  {r[3]}")
    counts = {}
    for r in rows:
        counts[r[2]] = counts.get(r[2], 0) + 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
