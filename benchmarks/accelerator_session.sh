#!/usr/bin/env bash
# One accelerator session's measurements in one prepared command, sized for <= 8 minutes on one
# H100: each part has its own time limit in seconds (PROFILE_S=90 GPT2S_S=40 GPT2M_S=35
# SPEED_S=60 SWEEP_S=90 QUALITY_S=155 from the environment, 470 s, plus ~20 s of setup; XLA_S and
# MEMBERS_S are 0 unless set, and a part with limit 0 is skipped), so one that breaks or runs long
# leaves the others their time:
#   setup    wheels/ (benchmarks/device_wheels.sh) installed into /tmp/site when present; the
#            device and the versions
#   profile  benchmarks/step_profile.py --ops: the per-op table (time by category, FLOPs, bytes,
#            floors, time over floor) of GPT-2 small's and medium's bf16 steps with cuDNN
#            attention and of :fast's step, under XLA_FLAGS=--xla_gpu_enable_command_buffer=
#            (kernels in a command buffer lose their HLO op names); each writes its record, op
#            table and optimized HLO to OUT_DIR/results/<device>_profile_<size>/
#   gpt2s    benchmarks/accelerator.py: bf16 train steps, cuDNN attention, GPT-2 small's widths:
#            the baseline and the levers together (kernel causal flag, chunked loss, 32 rows), in
#            the same rounds: MFU and ratios
#   gpt2m    the same at GPT-2 medium's widths: baseline and the levers together
#   xla      gpt2s's levers together again under XLA GPU flags (XLA_FLAGS is process-wide): its
#            ratio is against the same variant in the gpt2s part
#   speed    configs/g2p.py:fast trained by train.py at train.steps_per_dispatch 1 and 8 (with
#            data.prefetch): steps/s; and its step alone on random batches, 1 and 8 per dispatch,
#            and with the XLA:CPU kernels;
#            the first run prepares the data directory every later part reads
#   sweep    benchmarks/sweep_packing.py: 16 points of :fast (4 seeds x 4 learning rates, 600
#            steps) packed by sweep.py --pack=16 against the first point alone: the wall-clock
#            ratio and the numbers, into OUT_DIR/results/<device>_sweep_packing/ (no warm-up:
#            the speed part prepared the data)
#   members  8 seeds of :fast in one program against one (train.members); skipped, with a line
#            saying so, where this tree's config has no such key
#   quality  configs/g2p.py:gpu start to finish (benchmarks/g2p_flagship.py): one seed, or with
#            QUALITY_SEEDS=0,1,2,3 those seeds as one train.members program, each tested, and
#            their ensemble (--members --ensemble)
# Then benchmarks/session_records.py writes OUT_DIR/results/<name>/record.json (docs/results'
# schema) from the parts' raw outputs, each beside its record: copy them into docs/results/ as
# they are. OUT_DIR/session.log holds everything the parts printed.
#
#   bash benchmarks/device_wheels.sh                                # once, with a package index
#   COMMIT=<sha> bash benchmarks/accelerator_session.sh OUT_DIR     # on the GPU, wheels/ beside
#   SMOKE=1 bash benchmarks/accelerator_session.sh /tmp/session     # a CPU, tiny sizes and steps
set -u
out=${1:?usage: bash benchmarks/accelerator_session.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
py=${PYTHON:-python3}
work=$(mktemp -d)
smoke=${SMOKE:-0}
if [ -d wheels ] && ls wheels/*.whl >/dev/null 2>&1 && [ "$smoke" = 0 ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}
export COMMIT=$commit  # the records' commit where the tree has no .git (commands.git_commit)
data="$work/data"  # a fresh data directory, prepared by the first train.py run

if [ "$smoke" = 0 ]; then
  lm_s=gpt2s lm_m=gpt2m g2p=g2pfast steps=10 rounds=2 matmul=8192 train_steps=1000 threads=8
  sweep_args="--seeds=4 --learning_rates=1e-3,2e-3,3e-3,5e-3 --config.train.num_steps=600"
  profile_args="--dtype=bfloat16 --attention=fused"
  rows_s=32 rows_m=16 chunk=8192 train_args="" quality_args=""
  limit() { echo "$1"; }
else  # every part end to end in seconds on a CPU: tiny models, a few steps
  lm_s=lmtiny lm_m=lmtiny g2p=lmtiny steps=1 rounds=1 matmul=128 train_steps=4 threads=1
  rows_s=8 rows_m=8 chunk=64 profile_args=""
  sweep_args="--seeds=2 --learning_rates=1e-3,3e-3 --config.train.num_steps=4
    --config.eval.every_steps=4 --config.checkpoint.every_steps=4"
  tiny="--config.model.num_encoder_layers=1 --config.model.num_decoder_layers=1
    --config.model.d_model=32 --config.model.num_heads=2 --config.model.mlp_dim=64
    --config.data.batch_size=8"
  train_args="$tiny --config.train.log_every_steps=2"
  quality_args="$tiny --config.train.num_steps=4 --config.train.log_every_steps=2
    --config.eval.every_steps=4 --config.checkpoint.every_steps=4 --config.eval.decode.beam_size=1
    --config.eval.decode.method=greedy --config.eval.num_decode_examples=16"
  [ -d "$HOME/tensorflow_datasets/cmudict_g2p" ] && data="$HOME/tensorflow_datasets"
  limit() { [ "$1" = 0 ] && echo 0 || echo 900; }
fi

part() {  # part NAME LIMIT_S COMMAND...: the command under its time limit, timed; 0: skipped
  local name=$1 lim=$2 start rc
  shift 2
  if [ "$lim" = 0 ]; then echo "== $name: skipped (its limit is 0)"; return; fi
  start=$(date +%s)
  echo "== $name (limit $lim s): $*"
  timeout "$lim" "$@"
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - start )) s$([ $rc = 124 ] && echo ', time limit')"
}

acc=($py benchmarks/accelerator.py --steps=$steps --rounds=$rounds --matmul_n=$matmul
  --compile_threads=$threads)

{
  echo "== setup: commit ${commit:-unknown}, $(nproc) cores, smoke=$smoke"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null
  $py -c "import jax, flax, optax, orbax.checkpoint as o, grain, tensorflow_datasets, ml_collections
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax', o.__version__, jax.devices())" || exit 1

  device=$($py -c "import jax; print(jax.devices()[0].device_kind)")
  c="causal_kernel=true" l="loss_chunk_tokens=$chunk"
  slug=$(cd benchmarks && $py -c "import jax, session_records as s
print(s.device_slug(jax.devices()[0].device_kind))")
  part profile "$(limit "${PROFILE_S:-90}")" bash -c "
    for size in $lm_s $lm_m $g2p; do
      args='$profile_args'; [ \$size = g2pfast ] && args=''
      XLA_FLAGS='--xla_gpu_enable_command_buffer=' COMMIT=$commit $py benchmarks/step_profile.py \
        --sizes=\$size --steps=3 --ops --top=25 \$args \
        --out=$out/results/${slug}_profile_\$size || exit 1
    done"
  xla_flags="--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false"
  part gpt2s "$(limit "${GPT2S_S:-40}")" "${acc[@]}" --sizes=$lm_s --dtypes=bfloat16 --attention=fused \
    --variants="base|$c,$l,rows=$rows_s" \
    --json_out="$work/accelerator_gpt2s.json"
  part gpt2m "$(limit "${GPT2M_S:-35}")" "${acc[@]}" --sizes=$lm_m --dtypes=bfloat16 --attention=fused \
    --variants="base|$c,$l,rows=$rows_m" --json_out="$work/accelerator_gpt2m.json"
  part xla "$(limit "${XLA_S:-0}")" "${acc[@]}" --sizes=$lm_s --dtypes=bfloat16 --attention=fused \
    --variants="$c,$l,rows=$rows_s" --json_out="$work/accelerator_xla.json" \
    --xla_flags="${XLA_GPU_FLAGS:-$xla_flags}"
  part speed "$(limit "${SPEED_S:-60}")" "${acc[@]}" --sizes=$g2p --dtypes=float32 --attention=einsum \
    --variants="base|steps_per_dispatch=8|kernels=cpu" --train_g2p=1,8 --train_steps=$train_steps \
    --train_args="--config.data.data_dir=$data $train_args" --json_out="$work/speed.json"
  hardware="one $device"; [ "$smoke" = 0 ] || hardware="$(nproc)-core CPU (smoke)"
  part sweep "$(limit "${SWEEP_S:-90}")" $py benchmarks/sweep_packing.py \
    --config=configs/g2p.py:fast --baseline=one --no_warmup --eval_split= --hardware="$hardware" \
    --work="$work/sweep" --out="$out/results/${slug}_sweep_packing" $sweep_args \
    --config.eval.num_decode_examples=256 --config.data.data_dir="$data" $train_args

  if $py -c "import sys; from transformer import schema
sys.exit(0 if 'members' in schema.get_config().train else 1)"; then
    # The wall clock of 8 members in one program over one member's, the same steps.
    export py work data train_args
    part members "$(limit "${MEMBERS_S:-0}")" bash -c '
      run() { local m=""; [ "$1" -gt 1 ] && m="--config.train.members=seeds:$1"
        $py train.py --config=configs/g2p.py:fast --workdir="$work/m$1" $m \
        --config.train.num_steps=600 --config.eval.num_decode_examples=256 \
        --config.data.data_dir="$data" $train_args; }
      t0=$(date +%s.%N); run 1 || exit 1; t1=$(date +%s.%N); run 8 || exit 1; t2=$(date +%s.%N)
      echo "{\"members\": 8, \"start\": $t0, \"one_done\": $t1, \"all_done\": $t2}" \
        > "$work/members.json"'
  else
    echo "== members: skipped: this tree's config has no train.members; no 8-seed ratio measured"
  fi

  part quality "$(limit "${QUALITY_S:-155}")" $py benchmarks/g2p_flagship.py \
    --config=configs/g2p.py:gpu --seeds="${QUALITY_SEEDS:-0}" --out="$work/quality" \
    --data_dir="$data" $([ "${QUALITY_SEEDS:-0}" = 0 ] || echo --members --ensemble) $quality_args

  versions=$($py -c "import json, jax, flax, optax, orbax.checkpoint as o
print(json.dumps({'jax': jax.__version__, 'flax': flax.__version__, 'optax': optax.__version__, 'orbax-checkpoint': o.__version__}))")
  $py benchmarks/session_records.py --work="$work" --out="$out/results" --commit="$commit" \
    --device="$device" --versions="$versions" --prefix="$([ "$smoke" = 0 ] || echo smoke_)" \
    --command="${SMOKE:+SMOKE=1 }bash benchmarks/accelerator_session.sh OUT_DIR"
} 2>&1 | tee "$out/session.log"
