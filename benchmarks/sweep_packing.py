r"""A seed (or seed x learning-rate) sweep packed into one train.members program against the same
sweep unpacked, or against its first point alone, one after the other in one run: the same numbers,
and the wall-clock ratio packed / unpacked (or packed / one point).

  python benchmarks/sweep_packing.py --out=docs/results/sweep_packing     # 4 seeds of :tiny
  python benchmarks/sweep_packing.py --config=configs/g2p.py:fast --seeds=4 \
      --learning_rates=1e-3,2e-3,3e-3,5e-3 --baseline=one --hardware="$(nvidia-smi \
      --query-gpu=name --format=csv,noheader)" --out=...  # 16 points vs one, on a GPU
  python benchmarks/sweep_packing.py --out=/tmp/sp --config.train.num_steps=4 \
      --config.eval.every_steps=4 --config.eval.num_batches=1 \
      --config.eval.num_decode_examples=4 --eval_split=       # a check that it runs
  (--config.* flags pass on to every sweep.py command)

First a one-point, one-step sweep warms up (it prepares the data and fills the file caches; its
time is logged, not compared; --no_warmup skips it where earlier runs did that). Then
`sweep.py --pack=N` (one process trains the N points, then eval.py runs per point) and `sweep.py`
(N train.py processes one after another, --parallel=1, each then eval.py; with --baseline=one
only the first point), each timed start to finish, each in its
own workdir under --work. The points are seeds 0 .. S-1, times --learning_rates when given (seeds
outer). Every logged train loss, grad norm and in-training evaluation, and each point's eval.py
metrics, are compared between a point's packed and unpacked runs. --out gets record.json and
log.txt (the record's wall_clock_ratio is packed / unpacked; the goals: <= 1.1 on a CPU, and for
16 points of :fast against one on a GPU, <= 2.5). A difference is absolute, relative for values
above 1; the run fails if one exceeds --tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

import commands  # benchmarks/ is the script's directory
from transformer.run import metrics_log
from transformer.sweeps import spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARED = ("train/loss", "train/grad_norm", "eval/")  # metrics.jsonl keys (prefixes) compared


def logged(workdir: str) -> dict[str, float]:
  """'<step>:<key>' -> value of a point's compared metrics.jsonl values and its eval.py metrics
  ('test:<key>'), numbers only."""
  out = {}
  for row in metrics_log.read(workdir):
    out |= {f"{row['step']}:{k}": float(v) for k, v in row.items()
            if k.startswith(COMPARED) and isinstance(v, (int, float))}
  for name in sorted(os.listdir(workdir)):
    if name.startswith("metrics.") and name.endswith(".json"):
      with open(os.path.join(workdir, name)) as f:
        split = json.load(f)
      out |= {f"{name[len('metrics.'):-len('.json')]}:{k}": float(v) for k, v in split.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
  return out


def difference(packed: float, unpacked: float) -> float:
  """|packed - unpacked|, relative to |unpacked| above 1 (a perplexity of 72 is exp(loss): float32
  rounding leaves its 5th decimal)."""
  return abs(packed - unpacked) / max(1.0, abs(unpacked))


def compare(packed: dict[str, float], unpacked: dict[str, float]) -> tuple[float, list[str]]:
  """(largest difference, the keys only one side has) of two points' `logged`; a difference is
  absolute, relative for values above 1 (a perplexity of 72 is exp(loss): float32 rounding
  leaves its 5th decimal)."""
  shared = sorted(set(packed) & set(unpacked))
  diff = max((difference(packed[k], unpacked[k]) for k in shared),
             default=0.0)
  return diff, sorted(set(packed) ^ set(unpacked))


def diverged_at(packed: dict[str, float], unpacked: dict[str, float], tolerance: float
                ) -> int | None:
  """The first logged step at which a compared training or evaluation value differs by more
  than `tolerance` (as `compare` measures); None if none does."""
  steps = sorted({int(k.split(":")[0]) for k in packed if k.split(":")[0].isdigit()})
  for step in steps:
    keys = [k for k in packed if k.startswith(f"{step}:") and k in unpacked]
    if any(difference(packed[k], unpacked[k]) > tolerance for k in keys):
      return step
  return None


def mean_sd(values: list[float]) -> tuple[float, float]:
  """(mean, sample standard deviation; 0 for one value)."""
  return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def timed_sweep(args: argparse.Namespace, sweep_file: str, workdir: str, extra: list[str]
                ) -> float:
  """Runs sweep.py to its end; returns its wall clock (exits with a line if it fails)."""
  cmd = [sys.executable, "sweep.py", f"--config={args.config}", f"--sweep={sweep_file}",
         f"--workdir={workdir}", f"--eval_split={args.eval_split}", *extra]
  start = time.time()
  proc = commands.run(cmd, cwd=REPO)
  wall = time.time() - start
  if proc.returncode:
    raise SystemExit(f"sweep_packing: `{shlex.join(cmd[1:])}` {commands.failure(proc)}")
  return wall






def title(args: argparse.Namespace, n: int) -> str:
  """'4 seeds' or '16 points (4 seeds x 4 learning rates)'."""
  if not args.learning_rates:
    return f"{n} seeds"
  return f"{n} points ({args.seeds} seeds x {len(args.learning_rates)} learning rates)"


def points(args: argparse.Namespace) -> list[dict]:
  """The sweep's points: every seed, times every learning rate when there are some (seeds outer)."""
  if not args.learning_rates:
    return [{"seed": s} for s in range(args.seeds)]
  return [{"seed": s, "train.learning_rate": lr} for s in range(args.seeds)
          for lr in args.learning_rates]


def write_sweep(path: str, sweep: list[dict]) -> str:
  """A sweep file returning `sweep`; its path."""
  with open(path, "w") as f:
    f.write(f"def get_sweep():\n  return {sweep!r}\n")
  return path


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/g2p.py:tiny")
  parser.add_argument("--seeds", type=int, default=4, help="points: seeds 0 .. N-1, one pack")
  parser.add_argument("--learning_rates", default="", type=lambda s: [float(x) for x in
                      s.split(",")] if s else [], help="and each of these learning rates")
  parser.add_argument("--baseline", default="unpacked", choices=("unpacked", "one"),
                      help="unpacked: every point alone; one: the first point alone")
  parser.add_argument("--hardware", default=commands.cpu_hardware(),
                      help="the record's hardware (name the accelerator)")
  parser.add_argument("--eval_split", default="test", help="eval.py's split; '' = none")
  parser.add_argument("--tolerance", type=float, default=1e-5)
  parser.add_argument("--work", default="", help="a fresh directory for the sweeps (default: "
                      "a new temporary one)")
  parser.add_argument("--out", default="", help="write record.json and log.txt here")
  parser.add_argument("--no_warmup", action="store_true",
                      help="no warm-up sweep: the data directory is prepared and the caches warm")
  parser.add_argument("--compare_only", action="store_true",
                      help="compare the sweeps already in --work (no training; no wall clocks)")
  args, extra = parser.parse_known_args(argv)
  bad = [e for e in extra if not e.startswith("--config.")]
  if bad:
    parser.error(f"unknown arguments {bad} (only --config.* flags pass on to sweep.py)")
  if args.seeds * max(1, len(args.learning_rates)) < 2:
    parser.error(f"--seeds={args.seeds} must be >= 2 (or give --learning_rates)")
  args.work = args.work or tempfile.mkdtemp(prefix="sweep_packing_")
  if not args.compare_only and any(os.path.exists(os.path.join(args.work, n))
                                   for n in ("packed", "unpacked")):
    parser.error(f"--work={args.work} already holds a sweep; use a fresh directory")
  return args, extra


def main(argv: list[str] | None = None) -> dict:
  """Runs the warm-up and both sweeps, compares them, writes the record; returns it."""
  args, extra = parse(argv)
  started, load = time.time(), os.getloadavg()
  os.makedirs(args.work, exist_ok=True)
  sweep = points(args)
  names = spec.point_names(sweep)
  sweep_file = write_sweep(os.path.join(args.work, "points.py"), sweep)
  alone = sweep if args.baseline == "unpacked" else sweep[:1]
  alone_file = write_sweep(os.path.join(args.work, "alone.py"), alone)
  warm_file = write_sweep(os.path.join(args.work, "warm.py"), sweep[:1])
  warm = packed = unpacked = float("nan")
  if not args.compare_only:
    warm = float("nan") if args.no_warmup else timed_sweep(
        args, warm_file, os.path.join(args.work, "warm"),
        extra + ["--config.train.num_steps=1", "--config.eval.every_steps=1",
                 "--config.eval.num_batches=1", "--config.eval.num_decode_examples=1"])
    packed = timed_sweep(args, sweep_file, os.path.join(args.work, "packed"),
                         extra + [f"--pack={len(sweep)}"])
    unpacked = timed_sweep(args, alone_file, os.path.join(args.work, "unpacked"), extra)
  diffs, lines, diverged, finals = {}, [], {}, {"packed": [], "unpacked": []}
  for s in names[:len(alone)]:
    mine, theirs = (logged(os.path.join(args.work, w, s)) for w in ("packed", "unpacked"))
    diffs[s], only = compare(mine, theirs)
    if only or not mine:
      raise SystemExit(f"sweep_packing: {s}: the packed and unpacked points logged "
                       f"different keys ({', '.join(only[:4]) or 'none at all'})")
    diverged[s] = diverged_at(mine, theirs, args.tolerance)
    for side, values in (("packed", mine), ("unpacked", theirs)):
      if "test:wer" in values:
        finals[side].append(values["test:wer"])
    lines.append(f"{s}: {len(mine)} logged values, largest difference {diffs[s]:.2e}, "
                 f"first beyond the tolerance at step {diverged[s]}")
  worst = max(diffs.values())
  ratio = packed / unpacked
  alone_what = "unpacked" if args.baseline == "unpacked" else "the first point alone"
  warm_text = "" if args.no_warmup else f"warm-up {warm:.1f} s; "
  lines.append(f"{warm_text}packed {packed:.1f} s, {alone_what} {unpacked:.1f} s: "
               f"{ratio:.3f}x; largest difference {worst:.2e} (tolerance {args.tolerance:g})")
  print("\n".join(lines), flush=True)
  command = commands.command_line("sweep_packing.py", argv if argv is not None else sys.argv[1:])
  record = {
      "name": os.path.basename(os.path.normpath(args.out)) if args.out else "sweep_packing",
      "title": f"{title(args, len(sweep))} of {args.config} as one packed train.members "
               f"program vs {alone_what if args.baseline == 'one' else 'one process each'} "
               "(sweep.py --pack)",
      "task": "G2P (CMUdict)" if "g2p" in args.config else args.config,
      "config": args.config, "overrides": extra, "command": command,
      "commit": commands.git_commit(),
      "hardware": args.hardware, "versions": commands.versions("jax", "flax", "optax"),
      "wall_clock_s": round(time.time() - started, 1),
      "rates": {},
      "metrics": {"points": len(sweep), "points_alone": len(alone),
                  "packed_wall_s": round(packed, 2), "unpacked_wall_s": round(unpacked, 2),
                  "wall_clock_ratio": round(ratio, 4), "warmup_wall_s": round(warm, 2),
                  "max_abs_difference": worst, "tolerance": args.tolerance},
      "seeds": list(range(args.seeds)), "report": "docs/sweeps.md#packing"}
  first = min((d for d in diverged.values() if d is not None), default=None)
  if first is not None:
    record["metrics"]["first_step_beyond_tolerance"] = first
  for side, values in finals.items():
    if len(values) == len(alone) and args.baseline == "unpacked":
      mean, sd = mean_sd(values)
      record["metrics"] |= {f"{side}_test_wer": round(100 * mean, 2),
                            f"{side}_test_wer_sd": round(100 * sd, 2)}
  if args.no_warmup:
    del record["metrics"]["warmup_wall_s"]
  if args.compare_only:  # no sweep ran: no wall clocks
    record["wall_clock_s"] = None
    for key in ("packed_wall_s", "unpacked_wall_s", "wall_clock_ratio", "warmup_wall_s"):
      record["metrics"].pop(key, None)
  if args.out:
    commands.write_record(args.out, record, f"$ {command}\n" + "\n".join(lines) + "\nload "
                          f"average at the start {load[0]:.2f} (1 min)\n")
  if worst > args.tolerance:
    raise SystemExit(f"sweep_packing: the packed points differ from the unpacked ones by "
                     f"{worst:.2e} > --tolerance={args.tolerance:g}")
  return record


if __name__ == "__main__":
  main()
