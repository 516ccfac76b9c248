"""Where a train step's time goes: per-thunk times from a jax.profiler trace, by kind, and the
matmuls' GFLOP/s by shape.

  python benchmarks/step_profile.py --sizes=g2pfast          # :fast's model (the flagship's step)
  python benchmarks/step_profile.py --sizes=baby,medium --steps=5 --top=15

The sizes are benchmarks/train_step.py's (the same builder, random packed batches, the project's
jitted step with donation). Per size: the wall ms of a step, then the trace of `--steps` steps,
each thunk's time averaged over them and summed by kind (`ynn_fusion.332` -> `ynn_fusion`), and
every thunk that runs a matmul (a dot, or a fusion whose computation holds one) grouped by its
operand shapes, with the FLOPs counted from the compiled HLO (2 x output elements x contracted
size) and so its GFLOP/s inside the step. On a 2-core CPU XLA runs independent thunks side by
side, so a thunk's time can include waiting for a core; the kinds' total is printed beside the
wall time to show how much they overlap.
"""

import argparse
import collections
import glob
import gzip
import json
import math
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # pylint: disable=g-import-not-at-top,wrong-import-position  (sets up the tree)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.-]+) = (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\((.*)$", re.M)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.-]+) .*?\{\n(.*?)\n\}", re.M | re.S)


def _dims(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def matmul_flops(hlo_text: str) -> dict[str, tuple[float, str]]:
  """{thunk: (FLOPs, 'lhs x rhs -> out')} for every fusion whose called computation holds dots
  (their FLOPs summed) and every dot outside a fusion (a thunk of its own: in the entry or in a
  loop body), from an optimized HLO module's text."""
  shapes = {m.group(1): _dims(m.group(3)) for m in _INSTRUCTION.finditer(hlo_text)}
  fusions = dict(re.findall(r"%([\w.-]+) = \S+ fusion\(.*?calls=%([\w.-]+)", hlo_text))
  fused = set(fusions.values())
  in_fused: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
  found: dict[str, tuple[float, str]] = {}
  for comp in _COMPUTATION.finditer(hlo_text):
    for m in _INSTRUCTION.finditer(comp.group(2)):
      name, _, out, op, rest = m.groups()
      if op != "dot":
        continue
      lhs, rhs = re.findall(r"%([\w.-]+)", rest)[:2]
      contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
      k = math.prod(shapes[lhs][d] for d in _dims(contracting.group(1))) if contracting else 1
      dot = (2.0 * math.prod(_dims(out)) * k,
             f"{','.join(map(str, shapes[lhs]))} x {','.join(map(str, shapes[rhs]))} -> {out}")
      if comp.group(1) in fused:
        in_fused[comp.group(1)].append(dot)
      else:
        found[name] = dot
  for name, comp in fusions.items():
    if in_fused.get(comp):
      found[name] = (sum(f for f, _ in in_fused[comp]), " + ".join(d for _, d in in_fused[comp]))
  return found


def thunk_times(events: list[dict], steps: int) -> dict[str, float]:
  """{thunk name: microseconds per step} of a trace's complete events, leaving out the runtime's
  own spans (executor, thread pool, Python frames), whose names hold '::', '(' or start with '$'."""
  total: dict[str, float] = collections.defaultdict(float)
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name.startswith("$") or "::" in name or "(" in name:
      continue
    total[name] += e["dur"] / steps
  return dict(total)


def kind(name: str) -> str:
  """'ynn_fusion.332' -> 'ynn_fusion'; 'copy' -> 'copy'."""
  return re.sub(r"(\.\d+)+$", "", name)


def report(times: dict[str, float], flops: dict[str, tuple[float, str]], top: int) -> list[str]:
  """Lines: the kinds by total time with their shares, then the matmul thunks by shape."""
  total = sum(times.values())
  by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
  for name, us in times.items():
    by_kind[kind(name)][0] += us
    by_kind[kind(name)][1] += 1
  lines = [f"  thunks {total / 1e3:.1f} ms per step in all; by kind:"]
  for k, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])[:top]:
    lines.append(f"    {us / 1e3:8.2f} ms {us / total:6.1%}  {n:5d} x {k}")
  by_shape: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for name, (f, desc) in flops.items():
    if name in times:
      by_shape[desc][0] += times[name]
      by_shape[desc][1] += f
      by_shape[desc][2] += 1
  mm_us = sum(v[0] for v in by_shape.values())
  mm_flops = sum(v[1] for v in by_shape.values())
  if mm_us:
    lines.append(f"  matmul thunks {mm_us / 1e3:.1f} ms ({mm_us / total:.0%}), "
                 f"{mm_flops / 1e9:.2f} GFLOP, {mm_flops / mm_us / 1e3:.1f} GFLOP/s; by shape:")
    for desc, (us, f, n) in sorted(by_shape.items(), key=lambda kv: -kv[1][0])[:top]:
      lines.append(f"    {us / 1e3:8.2f} ms  {n:3d} x  {f / us / 1e3:6.1f} GFLOP/s  {desc}")
  return lines


def profile(name: str, steps: int, top: int) -> None:
  """Times, traces and reports one size."""
  run, record = train_step.build(name, keep_hlo_text=True)
  for _ in range(3):
    run()
  start = time.perf_counter()
  for _ in range(steps):
    run()
  ms = (time.perf_counter() - start) / steps * 1e3
  with tempfile.TemporaryDirectory() as directory:
    jax.profiler.start_trace(directory)
    for _ in range(steps):
      run()
    jax.profiler.stop_trace()
    trace, = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(trace) as f:
      events = json.load(f)["traceEvents"]
  flops = matmul_flops(record["hlo_text"])
  print(f"{name}: {ms:.1f} ms per step ({record['tokens'] / ms * 1e3:.0f} tok/s, "
        f"{record['flops'] / ms / 1e6:.1f} GFLOP/s of model FLOPs); load {train_step._load()}")
  print("\n".join(report(thunk_times(events, steps), flops, top)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="g2pfast", help=f"comma-separated: {train_step.SIZES}")
  parser.add_argument("--steps", type=int, default=5, help="traced steps (times are their mean)")
  parser.add_argument("--top", type=int, default=12, help="rows per table")
  args = parser.parse_args()
  for name in filter(None, args.sizes.split(",")):
    if name not in train_step.SIZES:
      parser.error(f"--sizes: unknown size {name!r} (one of {', '.join(train_step.SIZES)})")
    profile(name, args.steps, args.top)


if __name__ == "__main__":
  main()
