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
Variants: every --dtypes x --attention pair (model.dtype; parameters stay float32), timed
alternately for --rounds rounds of --steps steps, each keeping its fastest median, so a drifting
machine slows all alike. Per variant: ms/step, tokens/s, model TFLOP/s (train_step.py's count:
6 x weights x tokens + 12 x layers x length x d_model x tokens), MFU = that over the chip's dense
bf16 datasheet peak (transformer/reporting.py's table; --peak_tflops overrides), its share of a
same-run 8192^3 matmul in the variant's dtype, the fused attention kernels in the compiled step
(cuDNN custom calls: 0 under `fused` means jax fell back to XLA), and the step's temporary memory
by XLA's own account. The last line is one JSON record of everything, for docs/results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "")  # any backend; train_step.py would pick the CPU

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

import train_step  # pylint: disable=g-import-not-at-top,wrong-import-position  (benchmarks/)
from configs import lm  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer import reporting  # pylint: disable=g-import-not-at-top,wrong-import-position

SIZES = ("gpt2s", "gpt2m", "g2pfast")
CUDNN_CALL = "__cudnn$fmha"  # the custom-call target of XLA's cuDNN fused attention


def size_config(name: str):
  """(ConfigDict, batch shapes) of a named size; g2pfast is train_step.py's."""
  if name not in ("gpt2s", "gpt2m"):
    return train_step.size_config(name)
  layers, d, heads, batch = (12, 768, 12, 16) if name == "gpt2s" else (24, 1024, 16, 8)
  seq = 1024
  cd = lm.get_config("nanogpt_cpu")
  cd.model.update(num_decoder_layers=layers, d_model=d, num_heads=heads, mlp_dim=4 * d,
                  max_len=seq, vocab_size=50304, dropout_rate=0.0)
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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="gpt2s,g2pfast", help=f"comma-separated: {SIZES}")
  parser.add_argument("--dtypes", default="bfloat16", help="model.dtype values, comma-separated")
  parser.add_argument("--attention", default="einsum,fused", help="model.attention_impl values")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="the chip's peak, if transformer/reporting.py does not know it")
  parser.add_argument("--matmul_n", type=int, default=8192, help="side of the same-run matmul")
  args = parser.parse_args()
  sizes = [s for s in args.sizes.split(",") if s]
  for s in sizes:
    if s not in SIZES:
      parser.error(f"--sizes: unknown size {s!r} (one of {', '.join(SIZES)})")
  dtypes = [d for d in args.dtypes.split(",") if d]
  impls = [a for a in args.attention.split(",") if a]

  device = jax.devices()[0]
  peak = reporting.peak_flops(device.device_kind, args.peak_tflops * 1e12)
  matmul = {d: matmul_peak(d, args.matmul_n) for d in dtypes}
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); datasheet peak "
        f"{peak / 1e12 if peak else float('nan'):.0f} TFLOP/s; same-run {args.matmul_n}^3 matmul: "
        + ", ".join(f"{d} {t:.0f} TFLOP/s" for d, t in matmul.items()))
  records = []
  for name in sizes:
    built = []
    for dtype in dtypes:
      for impl in impls:
        cd, shapes = size_config(name)
        run, record = train_step.build_sized(name, cd, shapes, keep_hlo_text=True, dtype=dtype,
                                             attention_impl=impl)
        record["cudnn_calls"] = record.pop("hlo_text").count(CUDNN_CALL)
        record.update(dtype=dtype, attention=impl)
        train_step.median_ms(run, 3)  # warm-up
        built.append((run, record))
    best = [float("inf")] * len(built)
    for _ in range(args.rounds):
      for i, (run, _) in enumerate(built):
        best[i] = min(best[i], train_step.median_ms(run, args.steps))
    for (_, record), ms in zip(built, best):
      r = train_step.with_rates(record, ms)
      tflops = r["gflops"] / 1e3
      r.update(tflops=tflops, mfu=tflops * 1e12 / peak if peak else None,
               matmul_share=tflops / matmul[r["dtype"]], ratio_to_first=best[0] / ms)
      r.pop("hlo")
      records.append(r)
      mfu = f"MFU {r['mfu']:5.1%}" if peak else "MFU n/a"
      temp = r.get("temp_bytes")
      print(f"  {name:7s} {r['dtype']:8s} {r['attention']:6s} {ms:8.2f} ms/step "
            f"{r['tokens_per_s']:10.0f} tok/s {tflops:7.1f} TFLOP/s  {mfu}  "
            f"{r['matmul_share']:4.0%} of the matmul  cuDNN calls {r['cudnn_calls']:3d}  "
            f"temp {temp / 2**30 if temp is not None else float('nan'):.2f} GiB  "
            f"{r['ratio_to_first']:.2f}x the first  (compile {r['compile_s']:.0f} s)")
  print(f"fastest median of {args.rounds} alternating rounds of {args.steps} steps")
  print(json.dumps({"device": device.device_kind, "jax": jax.__version__, "peak": peak,
                    "matmul_tflops": matmul, "argv": sys.argv[1:], "results": records}))


if __name__ == "__main__":
  main()
