r"""Reruns the cheap recorded results and compares them with their records in docs/results/.

  python benchmarks/reproduce.py                          # every run below: two :tiny trainings
  python benchmarks/reproduce.py --only=g2p_tiny --results=runs/reproduce.json

Each run (RUNS) is the `command` of its record, `docs/results/<run>/record.json`, run from the
repository root with a fresh workdir and `--config.data.data_dir` set to one fresh directory per
invocation (a new temporary one unless --data_dir is given), so the data is prepared by this
code: a stale prepared directory cannot stand in for it. The final evaluation the run writes
(`<workdir>/train_done.json`, on the dev split) is compared with the record's dev metrics, each
within its TOLERANCES; the script prints a table (run, metric, recorded, measured, tolerance,
PASS/FAIL), then the measured metrics as the record writes them, ready to paste into it, and
exits 1 on any FAIL. Wall-clock time is printed, never compared (it depends on the machine and
its load).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from typing import NamedTuple

import commands  # benchmarks/ is the script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results")

# The records whose command this script reruns: cheap, and deterministic on a CPU.
RUNS = ("g2p_tiny", "g2p_decoder_only_tiny")
# How far a rerun may land from its record, per metric (absolute, in the record's units: percent
# for rates): the same command on another CPU may round differently.
TOLERANCES = {"wer": 2.0, "per": 1.0, "accuracy": 1.0, "loss": 0.01}
PERCENT = ("accuracy", "wer", "per")  # metrics a record writes as percentages
RECORDED_SPLIT = "dev"  # train_done.json's final evaluation is on the config's eval split


class Claim(NamedTuple):
  run: str  # a record's name (its directory under docs/results)
  metric: str  # a key of the record's "metrics", e.g. dev_wer
  stated: float  # the record's value
  tolerance: float


def read_record(run: str, results: str = RESULTS) -> dict:
  """`<results>/<run>/record.json`."""
  with open(os.path.join(results, run, "record.json"), encoding="utf-8") as f:
    return json.load(f)


def train_args(record: dict) -> list[str]:
  """The record's `python train.py ...` arguments, without --workdir (the record's overrides
  appended where the command does not already give them)."""
  words = shlex.split(record["command"])
  if words[:2] != ["python", "train.py"]:
    raise ValueError(f"record {record['name']}: not a train.py command: {record['command']!r}")
  args = [w for w in words[2:] if not w.startswith("--workdir=")]
  return args + [o for o in record.get("overrides", []) if o not in args]


def claims(runs: tuple[str, ...] = RUNS, results: str = RESULTS) -> tuple[Claim, ...]:
  """One Claim per dev metric with a tolerance in the records of `runs`."""
  out = []
  for run in runs:
    for key, value in read_record(run, results)["metrics"].items():
      split, _, name = key.partition("_")
      if split == RECORDED_SPLIT and name in TOLERANCES and value is not None:
        out.append(Claim(run, key, value, TOLERANCES[name]))
  return tuple(out)


def measured_value(metric: str, train_done_metrics: dict) -> float | None:
  """The value of record metric `metric` (dev_wer) in train_done.json's metrics (eval/wer, a
  fraction), in the record's units."""
  name = metric.partition("_")[2]
  value = train_done_metrics.get(f"eval/{name}")
  if value is None:
    return None
  return 100 * value if name in PERCENT else value


def as_written(metric: str, value: float) -> str:
  """How a record writes a metric's value: percentages with two decimals, others with four."""
  return f"{value:.2f}" if metric.partition("_")[2] in PERCENT else f"{value:.4f}"


def command(args: list[str], workdir: str, data_dir: str) -> list[str]:
  """The train.py command line with train.py arguments `args`, a workdir and a data dir."""
  return [sys.executable, "train.py", *args, f"--workdir={workdir}",
          f"--config.data.data_dir={data_dir}"]


def train(args: list[str], workdir: str, data_dir: str) -> dict:
  """Runs train.py with `args` from the repository root; returns its train_done.json with the
  wall-clock seconds, the command and provenance.json's git and data fields; on failure
  {"error": line}."""
  start = time.time()
  cmd = command(args, workdir, data_dir)
  proc = commands.run(cmd, cwd=REPO)
  done = os.path.join(workdir, "train_done.json")
  if proc.returncode or not os.path.exists(done):
    return {"error": f"train.py {commands.failure(proc)}", "command": cmd}
  with open(done) as f:
    result = json.load(f)
  with open(os.path.join(workdir, "provenance.json")) as f:
    provenance = json.load(f)
  return result | {"wall_clock_s": round(time.time() - start, 1), "command": cmd} | {
      k: provenance.get(k) for k in ("git_sha", "git_dirty", "data")}


Row = tuple[Claim, float | None, bool]  # (claim, measured value, passed)


def compare(claims_: tuple[Claim, ...], measured: dict[str, dict]) -> list[Row]:
  """(claim, measured value or None, passed) for each claim whose run was measured."""
  rows = []
  for claim in claims_:
    if claim.run not in measured:
      continue
    value = measured_value(claim.metric, measured[claim.run].get("metrics", {}))
    rows.append((claim, value, value is not None and abs(value - claim.stated) <= claim.tolerance))
  return rows


def report(rows: list[Row]) -> str:
  """The comparison table, then each run's measured metrics as its record writes them."""
  lines = [f"{'run':<24} {'metric':<10} {'record':>8} {'measured':>9} {'tol':>6}  result"]
  for claim, value, passed in rows:
    got = "missing" if value is None else as_written(claim.metric, value)
    lines.append(f"{claim.run:<24} {claim.metric:<10} {as_written(claim.metric, claim.stated):>8} "
                 f"{got:>9} {claim.tolerance:>6}  {'PASS' if passed else 'FAIL'}")
  by_run: dict[str, dict[str, float]] = {}
  for claim, value, _ in rows:
    if value is not None:
      by_run.setdefault(claim.run, {})[claim.metric] = float(as_written(claim.metric, value))
  for run, metrics in by_run.items():
    lines.append(f"\nMeasured, as docs/results/{run}/record.json writes them: "
                 f'"metrics": {json.dumps(metrics)}')
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """Runs the selected runs, prints the comparison; 0 if every claim holds, else 1."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help=f"comma list of runs ({', '.join(RUNS)})")
  parser.add_argument("--data_dir", default="", help="data dir (default: a new temporary one)")
  parser.add_argument("--workdir", default="", help="parent of the runs' workdirs (default: a "
                      "new temporary one); a finished run there is reused, not retrained")
  parser.add_argument("--results", default="", help="also write the measured runs to this JSON")
  args = parser.parse_args(argv)
  runs = [r for r in args.only.split(",") if r] or list(RUNS)
  unknown = [r for r in runs if r not in RUNS]
  if unknown:
    parser.error(f"--only: unknown run {unknown[0]!r} (one of {', '.join(RUNS)})")
  try:
    run_args = {run: train_args(read_record(run)) for run in runs}
  except (OSError, ValueError, KeyError) as e:
    parser.error(f"the records of {', '.join(runs)}: {e}")
  data_dir = args.data_dir or tempfile.mkdtemp(prefix="reproduce_tfds_")
  root = args.workdir or tempfile.mkdtemp(prefix="reproduce_runs_")
  measured = {}
  for run in runs:
    workdir = os.path.join(root, run)
    print(f"{run}: python {' '.join(command(run_args[run], workdir, data_dir)[1:])}", flush=True)
    measured[run] = result = train(run_args[run], workdir, data_dir)
    print(f"{run}: " + (f"error: {result['error']}" if "error" in result else
                        f"{result['wall_clock_s']:.0f} s wall clock"), flush=True)
  rows = compare(claims(tuple(runs)), measured)
  print(report(rows))
  if args.results:
    with open(args.results, "w") as f:
      json.dump(measured, f, indent=1, sort_keys=True)
  return 0 if rows and all(passed for _, _, passed in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
