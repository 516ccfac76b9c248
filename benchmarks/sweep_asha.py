r"""ASHA against the full grid: a learning-rate x seed sweep of configs/g2p.py:tiny run twice with
sweep.py, once to the end for every point and once with `--early_stop=asha` on the dev WER of
the in-training evaluations; the best dev WER of each and the training steps ASHA used as a
fraction of the grid's.

  python benchmarks/sweep_asha.py --workdir=runs/sweep_asha --out=docs/results
      # 16 points (4 learning rates x 4 seeds), 1000 steps each, dev WER every 250 steps;
      # about 2 h on a 2-core CPU (grid ~1.5 h, ASHA ~0.5 h)
  python benchmarks/sweep_asha.py --workdir=/tmp/sweep_asha_smoke --out=/tmp/sweep_asha_out \
      --learning_rates=5e-3,1e-9 --seeds=0 --parallel=1 --config.train.num_steps=8 \
      --config.eval.every_steps=2 --config.eval.num_batches=1 \
      --config.eval.num_decode_examples=8 --config.checkpoint.every_steps=2 \
      --asha_metric=eval/loss  # a check that it runs: ~6 minutes on 2 cores

--config.* flags pass on to both sweeps (after the benchmark's own: eval.every_steps=250,
checkpoint.every_steps=250). The rungs are the evaluations: with 1000 steps and halving from the
first evaluation they are at steps 250 and 500 (and ASHA stops nothing at 1000, the end);
--reduction_factor=4 keeps a quarter of the points at each rung instead of half.
--record_only makes the record again from sweeps.json (no sweeps run); --reuse_grid runs ASHA
again beside a finished grid. The last line printed is
the record's path; the record (docs/results/sweep_asha/record.json, with
sweeps.json beside it: each sweep's command, steps per point and results rows)
holds the metrics grid_best_dev_wer, asha_best_dev_wer, wer_gap_points (ASHA's best minus the
grid's, in WER points: the goal is <= 0.5), asha_step_fraction (the goal: <= 0.4), the steps and
the wall clock of each sweep, and the points ASHA stopped.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time

import commands  # benchmarks/ is the script's directory
from transformer.sweeps import watch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/g2p.py:tiny"
DEFAULT_OVERRIDES = ["--config.eval.every_steps=250", "--config.checkpoint.every_steps=250"]


def sweep_file(path: str, learning_rates: list[float], seeds: list[int]) -> str:
  """Writes the learning-rate x seed sweep file (seeds outer: every rate of seed 0 first)."""
  with open(path, "w") as f:
    f.write('"""The sweep of benchmarks/sweep_asha.py."""\n\n'
            "from configs.sweeps import product, sweep\n\n\n"
            "def get_sweep():\n"
            f"  return product(sweep('seed', {seeds!r}), "
            f"sweep('train.learning_rate', {learning_rates!r}))\n")
  return path


def trained_steps(workdir: str) -> int:
  """The training steps a point ran: its newest checkpoint (a stopped point saves where it
  stopped) or its last logged step, whichever is later (0 if neither)."""
  checkpoints = os.path.join(workdir, "checkpoints")
  saved = [int(d) for d in os.listdir(checkpoints) if d.isdigit()] if os.path.isdir(
      checkpoints) else []
  return max([0, *saved, *(row["step"] for row in watch.metrics_rows(workdir))])


def run_sweep(name: str, sweep: str, workdir: str, extra: list[str]) -> dict:
  """Runs sweep.py; returns its wall clock, rows (results.csv), steps and best dev WER."""
  cmd = [sys.executable, "sweep.py", f"--config={CONFIG}", f"--sweep={sweep}",
         f"--workdir={workdir}", "--eval_split=", *extra]
  print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
  start = time.time()
  proc = commands.run(cmd, cwd=REPO)
  wall = time.time() - start
  if proc.returncode:
    raise SystemExit(f"sweep_asha: the {name} sweep {commands.failure(proc)}")
  with open(os.path.join(workdir, "results.csv")) as f:
    rows = list(csv.DictReader(f))
  wers = [float(r["dev/wer"]) for r in rows if r.get("dev/wer")]
  steps = {r["point"]: trained_steps(os.path.join(workdir, r["point"])) for r in rows}
  return {"command": " ".join(["python", *cmd[1:]]), "wall_clock_s": round(wall, 1),
          "rows": rows, "steps": steps, "best_dev_wer": min(wers) if wers else None}






def percent(wer: float | None) -> float | None:
  """A WER in percent, as the records hold it."""
  return None if wer is None else round(100 * wer, 2)


def record(args, passed: list[str], grid: dict, asha: dict, wall: float) -> dict:
  """docs/results/sweep_asha/record.json's content."""
  stopped = [r["point"] for r in asha["rows"] if r["status"].startswith("stopped")]
  grid_steps, asha_steps = sum(grid["steps"].values()), sum(asha["steps"].values())
  gap = (None if None in (grid["best_dev_wer"], asha["best_dev_wer"])
         else round(100 * (asha["best_dev_wer"] - grid["best_dev_wer"]), 2))
  return {
      "name": "sweep_asha",
      "title": f"ASHA vs the full grid: {len(grid['rows'])} points of :tiny "
               f"({len(args.learning_rates)} learning rates x {len(args.seeds)} seeds)",
      "task": "G2P (CMUdict)", "config": CONFIG, "overrides": passed,
      "command": commands.command_line("sweep_asha.py", sys.argv[1:]),
      "commit": commands.git_commit(), "hardware": commands.cpu_hardware(),
      "versions": {"python": platform.python_version()} | commands.versions("jax", "flax", "ray"), "wall_clock_s": round(wall, 1), "rates": {},
      "metrics": {
          "grid_best_dev_wer": percent(grid["best_dev_wer"]),
          "asha_best_dev_wer": percent(asha["best_dev_wer"]),
          "wer_gap_points": gap,
          "asha_step_fraction": round(asha_steps / grid_steps, 4) if grid_steps else None,
          "grid_steps": grid_steps, "asha_steps": asha_steps,
          "grid_wall_clock_s": grid["wall_clock_s"], "asha_wall_clock_s": asha["wall_clock_s"],
          "asha_points_stopped": len(stopped)},
      "seeds": list(args.seeds),
      "report": "docs/sweeps.md#early-stopping-and-random-search",
  }


def write_json(path: str, content: dict) -> None:
  with open(path, "w") as f:
    json.dump(content, f, indent=1)
    f.write("\n")


def raw(grid: dict, asha: dict) -> dict:
  """sweeps.json beside the record: each sweep's command, wall clock, steps per point and rows."""
  return {name: {k: s[k] for k in ("command", "wall_clock_s", "steps", "rows")}
          for name, s in (("grid", grid), ("asha", asha))}


def rebuilt(args: argparse.Namespace, directory: str) -> dict:
  """The record in `directory` made again from sweeps.json beside it (its command, commit,
  overrides and seeds kept): what --record_only writes after a change to how the record is
  made."""
  with open(os.path.join(directory, "record.json")) as f:
    old = json.load(f)
  with open(os.path.join(directory, "sweeps.json")) as f:
    sweeps = json.load(f)
  for s in sweeps.values():
    wers = [float(r["dev/wer"]) for r in s["rows"] if r.get("dev/wer")]
    s["best_dev_wer"] = min(wers) if wers else None
  new = record(args, old["overrides"], sweeps["grid"], sweeps["asha"], old["wall_clock_s"])
  return new | {k: old[k] for k in ("command", "commit", "hardware", "versions", "seeds")}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="holds the two sweeps' workdirs")
  parser.add_argument("--out", default="docs/results", help="writes OUT/sweep_asha/record.json")
  parser.add_argument("--learning_rates", default="3e-4,1e-3,3e-3,1e-2",
                      type=lambda s: [float(x) for x in s.split(",")])
  parser.add_argument("--seeds", default="0,1,2,3", type=lambda s: [int(x) for x in s.split(",")])
  parser.add_argument("--parallel", type=int, default=2, help="points run at the same time")
  parser.add_argument("--asha_metric", default="eval/wer")
  parser.add_argument("--reduction_factor", type=float, default=2,
                      help="ASHA's reduction factor (sweep.py --asha_reduction_factor)")
  parser.add_argument("--reuse_grid", action="store_true",
                      help="WORKDIR/grid holds the finished grid: its command and wall clock are "
                      "read from OUT/sweep_asha/sweeps.json; ASHA runs in a fresh WORKDIR/asha")
  parser.add_argument("--record_only", action="store_true",
                      help="no sweeps: make OUT/sweep_asha/record.json again from sweeps.json")
  args, rest = parser.parse_known_args()
  directory = os.path.join(args.out, "sweep_asha")
  if args.record_only:
    write_json(os.path.join(directory, "record.json"), rebuilt(args, directory))
    print(os.path.join(directory, "record.json"))
    return
  bad = [a for a in rest if not a.startswith("--config.")]
  if bad:
    raise SystemExit(f"sweep_asha: unknown argument {bad[0]} (only --config.* pass on)")
  passed = DEFAULT_OVERRIDES + rest
  os.makedirs(args.workdir, exist_ok=True)
  sweep = sweep_file(os.path.join(os.path.abspath(args.workdir), "lr_seeds.py"),
                     args.learning_rates, args.seeds)
  start = time.time()
  grid = run_sweep("grid", sweep, os.path.join(args.workdir, "grid"),
                   [f"--parallel={args.parallel}", *passed])
  if args.reuse_grid:  # sweep.py found every point done: the run that trained them timed them
    with open(os.path.join(directory, "sweeps.json")) as f:
      timed = json.load(f)["grid"]
    grid |= {k: timed[k] for k in ("command", "wall_clock_s")}
  asha = run_sweep("asha", sweep, os.path.join(args.workdir, "asha"),
                   [f"--parallel={args.parallel}", "--early_stop=asha",
                    f"--asha_metric={args.asha_metric}",
                    f"--asha_reduction_factor={args.reduction_factor:g}", *passed])
  wall = (grid["wall_clock_s"] + asha["wall_clock_s"]) if args.reuse_grid else time.time() - start
  result = record(args, passed, grid, asha, wall)
  os.makedirs(directory, exist_ok=True)
  for name, content in (("record.json", result), ("sweeps.json", raw(grid, asha))):
    write_json(os.path.join(directory, name), content)
  print(json.dumps(result["metrics"]))
  print(os.path.join(directory, "record.json"))


if __name__ == "__main__":
  main()
