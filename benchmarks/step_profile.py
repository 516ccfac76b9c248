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

--ops adds the op table, on a CPU or a GPU trace alike: every thunk or kernel by category
(matmuls, cuDNN attention, loop / reduction / other fusions, copies and transposes, gathers and
scatters, collectives, host transfers, and on a GPU the idle gaps between kernels), with its time
per step and, from the optimized HLO, its FLOPs and bytes (operands read + results written) and
the rate it reached against two same-run ceilings (a matmul and a copy). Each op's floor is
max(FLOPs / matmul ceiling, bytes / copy ceiling); the step's time over the sum of the floors
says how far the step is from what its own ops allow. --out=DIR writes DIR/record.json
(docs/results' schema), DIR/ops.json (the whole table) and DIR/hlo.txt.gz (the optimized HLO, to
study the step without the device).

  python benchmarks/step_profile.py --sizes=gpt2s --dtype=bfloat16 --attention=fused --ops \
      --out=docs/results/gpu_h100_profile_gpt2s        # on the GPU
  python benchmarks/step_profile.py --sizes=g2pfast --ops --steps=3      # the CPU's table

On a GPU the kernels are matched to HLO ops by their `hlo_op` argument, which XLA drops for kernels
run inside a command buffer: profile with XLA_FLAGS=--xla_gpu_enable_command_buffer= (the session
script does).
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
import accelerator  # pylint: disable=g-import-not-at-top,wrong-import-position  (GPT-2's sizes)

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
  own spans (executor, thread pool, Python frames, a thunk's completion marker), whose names hold
  '::', '(' or start with '$' or 'end: '."""
  total: dict[str, float] = collections.defaultdict(float)
  for e in events:
    name = e.get("name", "")
    if (e.get("ph") != "X" or name.startswith(("$", "end: ")) or "::" in name
        or "(" in name):
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


# ---- the op table: every thunk or kernel with its FLOPs, bytes, time and floor ----

CATEGORIES = ("matmul", "attention", "loop fusion", "reduction fusion", "other fusion",
              "copy/transpose", "gather/scatter", "collective", "host transfer", "other", "idle")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
          "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
          "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_LINE = re.compile(r"^\s*(?:ROOT )?%([\w.-]+) = (\(.*?\)|\S+) ([\w-]+)\((.*)$")
_NO_WORK = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call",
            "conditional", "after-all", "partition-id", "replica-id", "iota", "opt-barrier"}
_COLLECTIVE = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_GATHER = ("gather", "scatter", "dynamic-slice", "dynamic-update-slice", "select-and-scatter")


def shape_bytes(shape: str) -> float:
  """Bytes of every array in an HLO shape ('f32[8,6]{1,0}' or a tuple of them)."""
  return sum(_BYTES[t] * math.prod(_dims(d)) for t, d in _ARRAY.findall(shape))


def _first_dims(shape: str) -> list[int]:
  """The dimensions of the first array in an HLO shape; [] if none."""
  m = _ARRAY.search(shape)
  return _dims(m.group(2)) if m else []


def _operands(rest: str) -> list[str]:
  """The %names in an instruction's operand list (up to its closing parenthesis)."""
  depth = 1
  for i, ch in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      return re.findall(r"%([\w.-]+)", rest[:i])
  return re.findall(r"%([\w.-]+)", rest)


def op_table(hlo_text: str) -> dict[str, dict]:
  """{op: {category, opcode, flops, bytes}} for every instruction that runs as a thunk or kernel
  of an optimized HLO module: those of the entry, loop bodies and command buffers, not those
  inside a fusion or a reducer. Bytes are the operands read and the result written (an in-place
  update counts its whole buffer); FLOPs are the matmuls' (matmul_flops) and, for cuDNN's fused
  attention, 4 x |q| x key length forward and 2.5 times that backward (its own matmuls)."""
  computations = {m.group(1): m.group(2) for m in _COMPUTATION.finditer(hlo_text)}
  inner = set(re.findall(r"\bcalls=%([\w.-]+)", hlo_text))
  for m in re.finditer(r"(\w[\w-]*)\(.*?\bto_apply=%([\w.-]+)", hlo_text):
    if m.group(1) != "call":
      inner.add(m.group(2))
  shapes: dict[str, str] = {}
  lines = []
  for name, body in computations.items():
    for line in body.splitlines():
      m = _LINE.match(line)
      if m:
        shapes[m.group(1)] = m.group(2)
        if name not in inner:
          lines.append(m.groups())
  flops = matmul_flops(hlo_text)
  table = {}
  for op, shape, opcode, rest in lines:
    if opcode in _NO_WORK:
      continue
    operands = _operands(rest)
    entry = {"opcode": opcode, "flops": flops.get(op, (0.0, ""))[0],
             "bytes": shape_bytes(shape) + sum(shape_bytes(shapes.get(o, "")) for o in operands)}
    target = re.search(r'custom_call_target="([^"]+)"', rest)
    target = target.group(1) if target else ""
    if "fmha" in target and len(operands) >= 2:  # q, k: [batch, length, heads, head_dim]
      q, k = (_first_dims(shapes.get(o, "")) for o in operands[:2])
      forward = 4.0 * math.prod(q) * (k[1] if len(k) > 1 else 0)
      entry["flops"] = forward * (2.5 if "backward" in target.lower() else 1.0)
    called = re.search(r"\bcalls=%([\w.-]+)", rest)
    body = computations.get(called.group(1), "") if called else ""
    entry["category"] = _category(opcode, rest, target, body, entry["flops"])
    table[op] = entry
  return table


def _category(opcode: str, rest: str, target: str, body: str, flops: float) -> str:
  """One of CATEGORIES for an instruction, from its opcode, custom-call target and fused body."""
  if "fmha" in target:
    return "attention"
  if flops or opcode in ("dot", "convolution") or "gemm" in target or "matmul" in target:
    return "matmul"
  base = opcode.removesuffix("-start").removesuffix("-done")
  if base in _COLLECTIVE:
    return "collective"
  if opcode in ("copy", "transpose", "copy-start", "copy-done"):
    return "copy/transpose"
  if opcode in _GATHER:
    return "gather/scatter"
  if opcode in ("send", "recv", "send-done", "recv-done", "infeed", "outfeed"):
    return "host transfer"
  if opcode == "fusion":
    ops = set(re.findall(r"= \S+ ([\w-]+)\(", body))
    if ops & {"scatter", "gather", "dynamic-update-slice"}:
      return "gather/scatter"
    if ops and ops <= {"parameter", "copy", "transpose", "bitcast", "reshape", "broadcast", "slice",
                       "concatenate", "pad"}:
      return "copy/transpose"
    if "kind=kLoop" in rest:
      return "loop fusion"
    if "kind=kInput" in rest or ops & {"reduce", "reduce-window"}:
      return "reduction fusion"
    return "other fusion"
  return "other"


def _named(events: list[dict], key: str) -> dict[int, str]:
  """{pid or (pid, tid): name} from a trace's metadata events of kind `key`."""
  out = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == key:
      out[e["pid"] if key == "process_name" else (e["pid"], e.get("tid"))] = e["args"]["name"]
  return out


def device_events(events: list[dict]) -> list[dict]:
  """A GPU trace's kernel and memcpy events (those on the device's stream lines), or [] when
  the trace has no device lines (a CPU trace)."""
  processes = _named(events, "process_name")
  threads = _named(events, "thread_name")
  gpus = {pid for pid, name in processes.items() if "/device:GPU" in name}
  out = []
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in gpus:
      line = threads.get((e["pid"], e.get("tid")), "")
      if line.startswith("Stream") or not line:
        out.append(e)
  return out


def op_times(events: list[dict], steps: int) -> tuple[dict[str, float], float]:
  """({op: microseconds per step}, idle microseconds per step). On a GPU trace an event is
  counted under its `hlo_op` argument (or its kernel name, or 'host transfer' for a memcpy) and
  the idle time is the traced span the device's streams leave empty; on a CPU trace it is
  thunk_times and no idle time."""
  kernels = device_events(events)
  if not kernels:
    return thunk_times(events, steps), 0.0
  times: dict[str, float] = collections.defaultdict(float)
  spans = []
  for e in kernels:
    name = e.get("args", {}).get("hlo_op") or e["name"]
    if "memcpy" in e["name"].lower():
      name = "host transfer"
    times[name] += e["dur"] / steps
    spans.append((e["ts"], e["ts"] + e["dur"]))
  spans.sort()
  busy, end = 0.0, spans[0][0]
  for start, stop in spans:
    busy += max(0.0, stop - max(start, end))
    end = max(end, stop)
  return dict(times), max(0.0, (end - spans[0][0]) - busy) / steps


def op_report(times: dict[str, float], idle_us: float, table: dict[str, dict],
              matmul_flops_per_s: float, copy_bytes_per_s: float) -> dict:
  """The op table: per category and per op, time per step, FLOPs, bytes, achieved rates and
  the floor max(FLOPs / matmul ceiling, bytes / copy ceiling); totals and time over floor."""
  rows = []
  for op, us in times.items():
    info = table.get(op, {"category": "host transfer" if op == "host transfer" else "other",
                          "opcode": "", "flops": 0.0, "bytes": 0.0})
    floor = max(info["flops"] / matmul_flops_per_s, info["bytes"] / copy_bytes_per_s) * 1e6
    rows.append({"op": op, "us": us, "floor_us": floor} | info)
  rows.sort(key=lambda r: -r["us"])
  by = {c: {"us": 0.0, "count": 0, "flops": 0.0, "bytes": 0.0, "floor_us": 0.0}
        for c in CATEGORIES}
  for r in rows:
    c = by[r["category"]]
    c["us"] += r["us"]
    c["count"] += 1
    for k in ("flops", "bytes", "floor_us"):
      c[k] += r[k]
  by["idle"]["us"] = idle_us
  busy = sum(r["us"] for r in rows)
  floor = sum(r["floor_us"] for r in rows)
  return {"busy_us": busy, "idle_us": idle_us, "floor_us": floor,
          "over_floor": (busy + idle_us) / floor if floor else None,
          "matmul_ceiling_flops_per_s": matmul_flops_per_s,
          "copy_ceiling_bytes_per_s": copy_bytes_per_s,
          "categories": {c: v for c, v in by.items() if v["us"] or v["count"]},
          "ops": rows}


def op_lines(ops: dict, top: int) -> list[str]:
  """The op table as text: categories, then the `top` slowest ops."""
  total = ops["busy_us"] + ops["idle_us"]

  def rate(flops: float, nbytes: float, us: float) -> str:
    return (f"{flops / us / 1e6:9.2f} TFLOP/s {nbytes / us / 1e3:8.1f} GB/s" if us
            else " " * 35)

  lines = [f"  ops: busy {ops['busy_us'] / 1e3:.2f} ms + idle {ops['idle_us'] / 1e3:.2f} ms per "
           f"step; floor {ops['floor_us'] / 1e3:.2f} ms (ceilings: matmul "
           f"{ops['matmul_ceiling_flops_per_s'] / 1e12:.1f} TFLOP/s, copy "
           f"{ops['copy_ceiling_bytes_per_s'] / 1e9:.0f} GB/s); time over floor "
           f"{ops['over_floor'] or float('nan'):.2f}x",
           f"    {'category':18s} {'ms':>8s} {'share':>6s} {'ops':>5s} {'floor ms':>9s} rates"]
  for name, c in sorted(ops["categories"].items(), key=lambda kv: -kv[1]["us"]):
    lines.append(f"    {name:18s} {c['us'] / 1e3:8.3f} {c['us'] / total:6.1%} {c['count']:5d} "
                 f"{c['floor_us'] / 1e3:9.3f} {rate(c['flops'], c['bytes'], c['us'])}")
  lines.append(f"    {'op':30s} {'category':18s} {'ms':>8s} {'floor ms':>9s} rates")
  for r in ops["ops"][:top]:
    lines.append(f"    {r['op'][:30]:30s} {r['category']:18s} {r['us'] / 1e3:8.3f} "
                 f"{r['floor_us'] / 1e3:9.3f} {rate(r['flops'], r['bytes'], r['us'])}")
  return lines


def copy_bandwidth(nbytes: int, repeats: int = 10) -> float:
  """Bytes per second (read + written) of a jitted elementwise pass over a float32 array of
  `nbytes`, the best of `repeats`: the device's copy ceiling, same run."""
  x = jax.numpy.ones((nbytes // 4,), jax.numpy.float32)
  f = jax.jit(lambda a: a * 2.0)
  f(x).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * nbytes / best



def profile(name: str, steps: int, top: int, ops: bool = False, out: str = "",
            overrides: dict | None = None) -> None:
  """Times, traces and reports one size (train_step.py's or accelerator.py's); with `ops` the op
  table too, and with `out` its record, table and HLO written to that directory."""
  overrides = {k: v for k, v in (overrides or {}).items() if v}
  if name in train_step.SIZES:
    run, record = train_step.build(name, keep_hlo_text=True, **overrides)
  else:
    cd, shapes = accelerator.size_config(name)
    run, record = train_step.build_sized(name, cd, shapes, keep_hlo_text=True, **overrides)
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
  if not ops:
    return
  on_gpu = jax.devices()[0].platform == "gpu"
  dtype = overrides.get("dtype", "float32")
  matmul = (accelerator.matmul_peak(dtype) * 1e12 if on_gpu else train_step.matmul_peak() * 1e9)
  copy = copy_bandwidth(2**30 if on_gpu else 2**26)
  table = op_table(record["hlo_text"])
  times, idle = op_times(events, steps)
  result = op_report(times, idle, table, matmul, copy)
  result.update(size=name, ms_per_step=ms, model_flops=record["flops"], tokens=record["tokens"],
                overrides=overrides)
  print("\n".join(op_lines(result, top)))
  if out:
    write_record(out, result, record["hlo_text"])


def write_record(out: str, ops: dict, hlo_text: str) -> None:
  """DIR/record.json (docs/results' schema), DIR/ops.json and DIR/hlo.txt.gz of one profile."""
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "ops.json"), "w") as f:
    json.dump(ops, f, indent=1)
  with gzip.open(os.path.join(out, "hlo.txt.gz"), "wt") as f:
    f.write(hlo_text)
  device = jax.devices()[0]
  ms = ops["ms_per_step"]
  metrics = {"ms_per_step": round(ms, 3), "floor_ms": round(ops["floor_us"] / 1e3, 3),
             "over_floor": round(ops["over_floor"], 3) if ops["over_floor"] else None,
             "wall_over_floor": round(ms * 1e3 / ops["floor_us"], 3) if ops["floor_us"] else None,
             "busy_ms": round(ops["busy_us"] / 1e3, 3), "idle_ms": round(ops["idle_us"] / 1e3, 3)}
  metrics |= {f"{c.replace(' ', '_').replace('/', '_')}_ms": round(v["us"] / 1e3, 3)
              for c, v in ops["categories"].items()}
  record = {
      "name": os.path.basename(os.path.normpath(out)),
      "title": f"per-op profile of the {ops['size']} train step: time by category, floors",
      "task": f"train step on random batches: {ops['size']}",
      "config": "benchmarks/step_profile.py sizes",
      "overrides": [f"{k}={v}" for k, v in ops["overrides"].items()],
      "command": "python " + " ".join([os.path.relpath(__file__, os.getcwd())] + sys.argv[1:]),
      "commit": os.environ.get("COMMIT") or None,
      "hardware": device.device_kind if device.platform == "gpu" else f"{os.cpu_count()}-core CPU",
      "versions": {"jax": jax.__version__},
      "wall_clock_s": None,
      "rates": {"steps_per_s": round(1e3 / ms, 2),
                "tokens_per_s": round(ops["tokens"] / ms * 1e3)},
      "metrics": metrics, "seeds": [], "report": "docs/performance.md#per-op-profile"}
  with open(os.path.join(out, "record.json"), "w") as f:
    json.dump(record, f, indent=1)
  print(f"wrote {out}/record.json, ops.json, hlo.txt.gz")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="g2pfast", help=f"comma-separated: {train_step.SIZES}")
  parser.add_argument("--steps", type=int, default=5, help="traced steps (times are their mean)")
  parser.add_argument("--top", type=int, default=12, help="rows per table")
  parser.add_argument("--dtype", default="", help="model.dtype (default: the size's)")
  parser.add_argument("--attention", default="", help="model.attention_impl (default: the size's)")
  parser.add_argument("--ops", action="store_true", help="the op table (see the docstring)")
  parser.add_argument("--out", default="", help="with --ops and one size: write its record here")
  args = parser.parse_args()
  sizes = [s for s in args.sizes.split(",") if s]
  known = train_step.SIZES + tuple(s for s in accelerator.SIZES if s not in train_step.SIZES)
  for name in sizes:
    if name not in known:
      parser.error(f"--sizes: unknown size {name!r} (one of {', '.join(known)})")
  if args.out and (not args.ops or len(sizes) != 1):
    parser.error("--out: needs --ops and exactly one size")
  for name in sizes:
    profile(name, args.steps, args.top, args.ops, args.out,
            {"dtype": args.dtype, "attention_impl": args.attention})


if __name__ == "__main__":
  main()
