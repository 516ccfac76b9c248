"""Accelerator train-step benchmark: bf16 steps, MFU against the chip's datasheet peak, and the
fused attention path (cuDNN on a GPU) against the einsum one, in one process.

  python benchmarks/accelerator.py                       # gpt2s and g2pfast, bf16, einsum vs fused
  python benchmarks/accelerator.py --sizes=gpt2s --dtypes=bfloat16,float32 --steps=20 --rounds=3
  python benchmarks/accelerator.py --sizes=g2pfast --steps=3 --rounds=1    # runs on a CPU too

Sizes (the project's own jitted train step with donation, as benchmarks/train_step.py builds it;
random token ids; dropout 0 unless the config has it):
  gpt2s    decoder-only at GPT-2 small's widths: 12 layers, d 768, 12 heads of 64, mlp 3072,
           vocabulary 50304 (GPT-2's, padded to a multiple of 128), seq 1024, batch 16
  gpt2m    the same at GPT-2 medium's: 24 layers, d 1024, 16 heads of 64, mlp 4096, batch 8
  g2pfast  configs/g2p.py:fast's model as it trains, 128 packed rows x 32/30 (train_step.py's size)
  lmtiny   gpt2s's knobs at 2 layers, d 64, vocabulary 512, seq 64, batch 4 (a CPU check of flags)
Variants: every --dtypes x --attention pair (model.dtype; parameters stay float32), timed
alternately for --rounds rounds of --steps steps, each keeping its fastest median, so a drifting
machine slows all alike. Per variant: ms/step, tokens/s, model TFLOP/s (train_step.py's count:
6 x weights x tokens + 12 x layers x length x d_model x tokens), MFU = that over the chip's dense
bf16 datasheet peak (transformer/run/reporting.py's table; --peak_tflops overrides), its share of a
same-run 8192^3 matmul in the variant's dtype, the fused attention kernels in the compiled step
(cuDNN custom calls: 0 under `fused` means jax fell back to XLA), and the step's temporary memory
by XLA's own account. The last line is one JSON record of everything, for docs/results.

Levers (--variants, "|"-separated, each a ","-separated list of key=value; "base" or "" is none),
every one timed in the same alternating rounds, its ratio against the first variant printed:
  rows=N                  the batch's rows (gradient accumulation: train.grad_accum_steps=M)
  steps_per_dispatch=K    K train steps in one lax.scan per call (steps.scan_steps); ms per step
  causal_kernel=true      model.causal_kernel (the attention kernel's own causal flag)
  loss_chunk_tokens=N     train.loss_chunk_tokens (chunked cross-entropy, no whole-batch logits)
  kernels=NAME            model.kernels: the speed paths injected into the layers ('plain': Flax's
                          own; 'cpu': XLA:CPU's) instead of the backend's own entry ('auto')
  remat=dots, param_dtype=bfloat16, any other model.* or train.* key (model first; or spelled
  model.KEY / train.KEY)
  python benchmarks/accelerator.py --sizes=gpt2s --attention=fused \
      --variants="base|causal_kernel=true|causal_kernel=true,loss_chunk_tokens=8192|rows=32"
--xla_flags="--xla_gpu_enable_latency_hiding_scheduler=true ..." is appended to XLA_FLAGS before
jax starts: process-wide, so compare it against a baseline run of its own (the session script does).
--train_g2p=1,8 trains configs/g2p.py:fast with train.py for --train_steps steps at each
train.steps_per_dispatch K (data.prefetch as configured, 2 by default; --train_args adds
--config.* flags) and reports the median steps/s of its logged windows after the first (the
input pipeline, the host loop and the device together).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _xla_flags_from_argv() -> str:
  """--xla_flags=..., read before jax starts (XLA reads XLA_FLAGS once, at backend creation)."""
  for arg in sys.argv[1:]:
    if arg.startswith("--xla_flags="):
      return arg.split("=", 1)[1]
  return ""


os.environ.setdefault("JAX_PLATFORMS", "")  # any backend; train_step.py would pick the CPU
if _xla_flags_from_argv():
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_xla_flags_from_argv()}".strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

import train_step  # pylint: disable=g-import-not-at-top,wrong-import-position  (benchmarks/)
from configs import lm  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.run import metrics_log, reporting

SIZES = ("gpt2s", "gpt2m", "g2pfast", "lmtiny")
CUDNN_CALL = "__cudnn$fmha"  # the custom-call target of XLA's cuDNN fused attention


def size_config(name: str):
  """(ConfigDict, batch shapes) of a named size; g2pfast is train_step.py's."""
  if name not in ("gpt2s", "gpt2m", "lmtiny"):
    return train_step.size_config(name)
  layers, d, heads, batch, seq, vocab = {"gpt2s": (12, 768, 12, 16, 1024, 50304),
                                         "gpt2m": (24, 1024, 16, 8, 1024, 50304),
                                         "lmtiny": (2, 64, 2, 4, 64, 512)}[name]
  cd = lm.get_config("nanogpt_cpu")
  cd.model.update(num_decoder_layers=layers, d_model=d, num_heads=heads, mlp_dim=4 * d,
                  max_len=seq, vocab_size=vocab, dropout_rate=0.0)
  cd.data.update(max_target_len=seq, batch_size=batch)
  return cd, {"targets": (batch, seq)}


def matmul_peak(dtype: str, n: int = 8192, repeats: int = 10) -> float:
  """TFLOP/s of a jitted n^3 matmul in `dtype` on the default device, the best of `repeats`."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(dtype))
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best / 1e12


def parse_variants(text: str) -> list[dict]:
  """'base|a=1,b=x|...' -> [{}, {'a': 1, 'b': 'x'}, ...]; true/false booleans, numbers numbers."""
  out = []
  for part in text.split("|"):
    part = part.strip()
    levers = {}
    for item in ([] if part in ("", "base") else part.split(",")):
      if "=" not in item:
        raise SystemExit(f"accelerator.py: --variants: {item!r} is not key=value")
      key, value = (s.strip() for s in item.split("=", 1))
      if value.lower() in ("true", "false"):
        levers[key] = value.lower() == "true"
      else:
        try:
          levers[key] = int(value)
        except ValueError:
          try:
            levers[key] = float(value)
          except ValueError:
            levers[key] = value
    out.append(levers)
  return out


def variant_label(levers: dict) -> str:
  return ",".join(f"{k}={v}" for k, v in levers.items()) or "base"


def apply_levers(cd, shapes: dict, levers: dict) -> tuple[dict, int]:
  """Sets the levers on the ConfigDict; returns (batch shapes, steps per dispatch)."""
  k = levers.get("steps_per_dispatch", 1)
  for key, value in levers.items():
    if key == "rows":
      shapes = {f: (value, length) for f, (_, length) in shapes.items()}
      continue
    if key == "steps_per_dispatch":  # the caller's
      continue
    section, name = key.split(".", 1) if "." in key else (
        "model" if key in cd.model else "train" if key in cd.train else "", key)
    if section not in ("model", "train") or name not in cd[section]:
      raise SystemExit(f"accelerator.py: --variants: unknown lever {key!r} (rows, "
                       "steps_per_dispatch, or a model.* / train.* key)")
    try:
      cd[section][name] = value
    except TypeError as e:
      raise SystemExit(f"accelerator.py: --variants: {key}={value!r}: {e}") from None
  return shapes, k


def g2p_train_rates(ks: list[int], steps: int, extra: list[str]) -> list[dict]:
  """configs/g2p.py:fast trained by train.py for `steps` steps at each steps_per_dispatch K:
  {K, steps_per_s (the median logged window after the first), windows, wall_s, command}."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = []
  for k in ks:
    with tempfile.TemporaryDirectory() as workdir:
      cmd = [sys.executable, "train.py", "--config=configs/g2p.py:fast", f"--workdir={workdir}",
             f"--config.train.num_steps={steps}", f"--config.train.steps_per_dispatch={k}",
             f"--config.eval.every_steps={steps}", "--config.eval.num_batches=2",
             "--config.eval.num_decode_examples=16", f"--config.checkpoint.every_steps={steps}",
             *extra]
      start = time.time()
      # This process holds most of the GPU's memory (jax preallocates 75%); the run needs little.
      env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"} | dict(os.environ)
      proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
      wall = time.time() - start
      if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"accelerator.py: --train_g2p K={k}: train.py exit {proc.returncode}: "
                         f"{tail[0]}")
      rates = [r["perf/steps_per_sec"] for r in metrics_log.read(workdir)
               if "perf/steps_per_sec" in r]
    later = rates[1:] or rates
    out.append({"steps_per_dispatch": k, "steps_per_s": statistics.median(later) if later else None,
                "windows": len(rates), "wall_s": wall, "command": cmd[1:]})
    print(f"  g2p :fast train.py  K={k:<3d} {out[-1]['steps_per_s'] or float('nan'):8.1f} steps/s "
          f"(median of {len(later)} logged windows; {wall:.0f} s with compile and data)")
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="gpt2s,g2pfast", help=f"comma-separated: {SIZES}")
  parser.add_argument("--dtypes", default="bfloat16", help="model.dtype values, comma-separated")
  parser.add_argument("--attention", default="einsum,fused", help="model.attention_impl values")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="the chip's peak, if transformer/run/reporting.py does not know it")
  parser.add_argument("--matmul_n", type=int, default=8192, help="side of the same-run matmul")
  parser.add_argument("--variants", default="base", help="levers, see the module docstring")
  parser.add_argument("--xla_flags", default="", help="appended to XLA_FLAGS before jax starts")
  parser.add_argument("--train_g2p", default="", help="steps_per_dispatch values for train.py runs")
  parser.add_argument("--train_steps", type=int, default=2000)
  parser.add_argument("--train_args", default="", help="more --config.* flags for those runs")
  parser.add_argument("--compile_threads", type=int, default=1,
                      help="variants built (compiled) at once")
  parser.add_argument("--json_out", default="", help="also write the JSON record to this file")
  args = parser.parse_args()
  sizes = [s for s in args.sizes.split(",") if s]  # none: only --train_g2p
  for s in sizes:
    if s not in SIZES:
      parser.error(f"--sizes: unknown size {s!r} (one of {', '.join(SIZES)})")
  dtypes = [d for d in args.dtypes.split(",") if d]
  impls = [a for a in args.attention.split(",") if a]
  variants = parse_variants(args.variants)

  device = jax.devices()[0]
  peak = reporting.peak_flops(device.device_kind, args.peak_tflops * 1e12)
  matmul = {d: matmul_peak(d, args.matmul_n) for d in dtypes}
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); datasheet peak "
        f"{peak / 1e12 if peak else float('nan'):.0f} TFLOP/s; same-run {args.matmul_n}^3 matmul: "
        + ", ".join(f"{d} {t:.0f} TFLOP/s" for d, t in matmul.items()))
  records = []
  for name in sizes:

    def build(spec, name=name):
      dtype, impl, levers = spec
      cd, shapes = size_config(name)
      shapes, k = apply_levers(cd, shapes, levers)
      run, record = train_step.build_sized(name, cd, shapes, keep_hlo_text=True,
                                           steps_per_dispatch=k, dtype=dtype, attention_impl=impl)
      record["cudnn_calls"] = record.pop("hlo_text").count(CUDNN_CALL)
      record.update(dtype=dtype, attention=impl, variant=variant_label(levers), steps_per_call=k,
                    rows=next(iter(shapes.values()))[0])
      return run, record

    specs = [(d, a, v) for d in dtypes for a in impls for v in variants]
    # XLA compiles outside the GIL: several variants compile at once on a many-core host.
    with concurrent.futures.ThreadPoolExecutor(max(1, args.compile_threads)) as pool:
      built = list(pool.map(build, specs))
    for run, _ in built:
      train_step.median_ms(run, 3)  # warm-up
    best = [float("inf")] * len(built)
    for _ in range(args.rounds):
      for i, (run, _) in enumerate(built):
        best[i] = min(best[i], train_step.median_ms(run, args.steps))
    first = None
    for (_, record), ms in zip(built, best):
      r = train_step.with_rates(record, ms)  # ms, tokens and FLOPs of one call (K steps)
      ms = r["ms_per_step"] = ms / r["steps_per_call"]
      first = first or r["tokens_per_s"]
      tflops = r["gflops"] / 1e3
      r.update(tflops=tflops, mfu=tflops * 1e12 / peak if peak else None,
               matmul_share=tflops / matmul[r["dtype"]], ratio_to_first=r["tokens_per_s"] / first)
      r.pop("hlo")
      records.append(r)
      mfu = f"MFU {r['mfu']:5.1%}" if peak else "MFU n/a"
      temp = r.get("temp_bytes")
      print(f"  {name:7s} {r['dtype']:8s} {r['attention']:6s} {r['variant']:24s} {ms:8.2f} ms/step "
            f"{r['tokens_per_s']:10.0f} tok/s {tflops:7.1f} TFLOP/s  {mfu}  "
            f"{r['matmul_share']:4.0%} of the matmul  cuDNN calls {r['cudnn_calls']:3d}  "
            f"temp {temp / 2**30 if temp is not None else float('nan'):.2f} GiB  "
            f"{r['ratio_to_first']:.2f}x the first's tokens/s  (compile {r['compile_s']:.0f} s)")
  print(f"fastest median of {args.rounds} alternating rounds of {args.steps} steps")
  ks = [int(k) for k in args.train_g2p.split(",") if k]
  train = g2p_train_rates(ks, args.train_steps, args.train_args.split()) if ks else []
  record = {"device": device.device_kind, "jax": jax.__version__, "peak": peak,
            "matmul_tflops": matmul, "argv": sys.argv[1:],
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "results": records, "g2p_train": train}
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(record, f, indent=1)
  print(json.dumps(record))


if __name__ == "__main__":
  main()
