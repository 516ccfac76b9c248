#!/usr/bin/env bash
# One accelerator session's measurements, in one prepared command (README "On a GPU"):
#   1. the device and the package versions;
#   2. benchmarks/accelerator.py: bf16 train steps at GPT-2 small's widths with MFU, the fused
#      (cuDNN) attention path against the einsum one; then configs/g2p.py:fast's step in bf16
#      and float32;
#   3. one configs/g2p.py:fast G2P run, start to finish (benchmarks/g2p_flagship.py: train with
#      dev evaluations, the best checkpoint on the test split), from a fresh data directory.
# Each part has its own time limit (seconds, from the environment), so one that breaks or runs
# long leaves the others their time. Logs and the run's summary land in OUT_DIR.
#
#   bash benchmarks/accelerator_session.sh OUT_DIR
set -u
out=${1:?usage: bash benchmarks/accelerator_session.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
work=$(mktemp -d)

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $py -c "import jax, flax, optax, orbax.checkpoint as o, grain; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'orbax', o.__version__, jax.devices())"
  git log -1 --format='commit %h %s' 2>/dev/null; nproc; } 2>&1 | tee "$out/device.txt"

timeout "${BENCH_S:-240}" $py benchmarks/accelerator.py --sizes=gpt2s --dtypes=bfloat16 \
  --attention=einsum,fused --steps=20 --rounds=2 2>&1 | tee "$out/accelerator.log"
timeout "${BENCH_G2P_S:-90}" $py benchmarks/accelerator.py --sizes=g2pfast --dtypes=float32,bfloat16 \
  --attention=einsum --steps=50 --rounds=2 2>&1 | tee -a "$out/accelerator.log"

start=$(date +%s)
timeout "${G2P_S:-300}" $py benchmarks/g2p_flagship.py --config=configs/g2p.py:fast --seeds=0 \
  --out="$work/g2p_fast" --data_dir="$work/data" 2>&1 | tail -30 | tee "$out/g2p.log"
echo "g2p_flagship: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$out/g2p.log"
cp "$work/g2p_fast/summary.json" "$out/" 2>/dev/null
cp "$work/g2p_fast/seed0/metrics.jsonl" "$out/" 2>/dev/null
ls "$work/g2p_fast/seed0" 2>/dev/null | tee -a "$out/g2p.log"
