#!/usr/bin/env bash
# The calibration-and-fidelity benchmark (issue 7's targets), on this machine:
#   1. `exatrain calibrate --mpi` on 2 MPI ranks of one core each (RAYON_NUM_THREADS=1): each
#      rank is a device with a core of its own, as the planner assumes; GEMM curve, memory
#      bandwidth, collectives -> local.toml;
#   2. the trainer (2 MPI ranks, the bench model 6×384, seq 256, global batch 8) on 3 layouts,
#      then `exatrain calibrate --fit` on their reports (compute, memory, link factors);
#   3. the trainer on 12 other layouts and `exatrain fidelity --cluster` on them: predicted vs
#      measured per term, with the summary table; then 3 layouts with flash attention and
#      context parallelism, compared apart.
# Data-parallel runs use --no-overlap-dp but one (t12), as they always have, so the runs stay
# comparable across sessions; the trainer tests its started reductions (MPI_Test) at every block
# boundary, so t12's reduce-scatter progresses during backward here too.
# Usage: scripts/fidelity_bench.sh [OUT_DIR]   (about 5 minutes on 2 cores; needs Open MPI)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/fidelity-bench}
rm -rf "$out" && mkdir -p "$out/calib" "$out/test"
cargo build --release -q -p exatrain-cli --features mpi
x=$PWD/target/release/exatrain
export RAYON_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { mpirun -n 2 --oversubscribe --bind-to core "$x" "$@"; }
mpi calibrate --mpi --out "$out/local.toml" | tail -3
train() { # name dir flags...
  local name=$1 dir=$2; shift 2
  mpi train --mpi --model bench --steps 4 --global-batch 8 --cluster "$out/local.toml" \
    --report "$out/$dir/$name.json" --out "$out/runs/$name" "$@" >/dev/null 2>"$out/$name.log" \
    || { cat "$out/$name.log"; exit 1; }
  echo "  $dir/$name: $(grep -m1 'steps in' "$out/$name.log")"
}
echo "== calibration runs"
train c1-dp2-mb2 calib --micro-batch 2 --no-overlap-dp
train c2-tp2-mb1 calib --tp 2 --micro-batch 1
train c3-pp2-mb1 calib --pp 2 --micro-batch 1
$x calibrate --fit "$out/calib" --cluster "$out/local.toml" --out "$out/fitted.toml"
echo "== other layouts"
train t01-dp2-mb1-z1 test --micro-batch 1 --zero 1 --no-overlap-dp
train t02-dp2-mb4-z2-full test --micro-batch 4 --zero 2 --recompute full --no-overlap-dp
train t03-dp2-mb2-sel test --micro-batch 2 --recompute selective --no-overlap-dp
train t04-tp2-mb2-sp test --tp 2 --micro-batch 2 --sequence-parallel
train t05-tp2-mb4-sel test --tp 2 --micro-batch 4 --recompute selective
train t06-tp2-mb1-full test --tp 2 --micro-batch 1 --recompute full
train t07-pp2-mb2 test --pp 2 --micro-batch 2
train t08-pp2-v3-mb1 test --pp 2 --micro-batch 1 --virtual-stages 3
train t09-pp2-mb4-sel test --pp 2 --micro-batch 4 --recompute selective
train t10-pp2-mb1-full test --pp 2 --micro-batch 1 --recompute full
train t11-tp2-mb2-sp-sel test --tp 2 --micro-batch 2 --sequence-parallel --recompute selective
train t12-dp2-mb2-z1-overlap test --micro-batch 2 --zero 1
echo "== fidelity of the fitted spec on the other layouts"
$x fidelity --runs "$out/test" --cluster "$out/fitted.toml" --out "$out/fidelity.html" > "$out/fidelity.txt"
grep "time.step" "$out/fidelity.txt" | grep -v "^time"
sed -n '/^term/,$p' "$out/fidelity.txt"
echo "== the same before the fit (the benchmarked spec alone)"
$x fidelity --runs "$out/test" --cluster "$out/local.toml" | sed -n '/^term/,$p' | grep -E "term|time"
echo "== flash attention and context parallelism (apart, so the 12 layouts above stay comparable)"
mkdir -p "$out/cp"
train f1-flash-dp2-mb2 cp --flash-attention --micro-batch 2 --no-overlap-dp
train f2-cp2-mb2 cp --cp 2 --flash-attention --micro-batch 2
train f3-cp2-mb4-full cp --cp 2 --flash-attention --micro-batch 4 --recompute full
$x fidelity --runs "$out/cp" --cluster "$out/fitted.toml" | sed -n '/^term/,$p'
echo "wrote $out/fidelity.html"
