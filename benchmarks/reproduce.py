r"""Reruns the cheap documented results and compares them with their records in docs/results/.

  python benchmarks/reproduce.py                          # every run below: two :tiny trainings
  python benchmarks/reproduce.py --only=g2p_tiny --results=/tmp/reproduce.json

Each run is its documented `python train.py ...` command (RUNS) from the repository root with a
fresh workdir and `--config.data.data_dir` set to one fresh directory per invocation (a new
temporary one unless --data_dir is given), so the data is prepared by this code and a stale
prepared directory cannot stand in for it. The final evaluation the run writes
(`<workdir>/train_done.json`, on the validation split) is compared with the metrics of the run's
record, `docs/results/<run>/record.json` (the numbers the README's results table shows), within
TOLERANCES; the script prints a table (run, metric, stated, measured, tolerance, PASS/FAIL), then
the measured values in the record's units, and exits 1 on any FAIL. Wall-clock time is printed,
never compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, NamedTuple

import commands  # benchmarks/ is the script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("docs", "results")

# Run name (= its record's directory under docs/results) -> the documented train.py arguments,
# without --workdir and --config.data.data_dir.
RUNS = {
    "g2p_tiny": ["--config=configs/g2p.py:tiny"],
    "g2p_decoder_only_tiny": ["--config=configs/g2p_decoder_only.py:tiny"],
}

# The split of train_done.json's final evaluation, as records name it (`dev_wer`).
SPLIT = "dev"
# Absolute tolerance per metric, in the records' units (points for percentages): the same command
# on another CPU may round differently. A record's metrics of SPLIT with a tolerance are compared.
TOLERANCES = {"wer": 2.0, "per": 1.0, "accuracy": 1.0, "loss": 0.01}
PERCENT = ("accuracy", "wer", "per")  # metrics records store (and the docs write) in percent


class Claim(NamedTuple):
  run: str  # a key of RUNS
  metric: str  # a key of the run's train_done.json "metrics", e.g. eval/wer (a fraction)
  stated: float  # the record's value, in the record's units (percent for PERCENT metrics)
  tolerance: float  # absolute, in the record's units
  where: str  # the record that states it


def record_metric(metric: str) -> str:
  """The record's key of a train_done.json metric: 'eval/wer' -> 'dev_wer'."""
  return f"{SPLIT}_{metric.rsplit('/', 1)[-1]}"


def in_record_units(metric: str, value: float) -> float:
  """A train_done.json value in the record's units: fractions of PERCENT metrics times 100."""
  return 100 * value if metric.rsplit("/", 1)[-1] in PERCENT else value


def load_claims(runs: list[str], repo: str | None = None) -> tuple[Claim, ...]:
  """The claims of `runs`: every metric of SPLIT with a tolerance in each run's record.json; a
  missing or unreadable record, or one with no such metric, is a ValueError of one line."""
  claims = []
  for run in runs:
    where = os.path.join(RESULTS, run, "record.json")
    if not os.path.exists(os.path.join(repo or REPO, where)):
      raise ValueError(f"{where}: no such record, so no numbers to compare run {run!r} with")
    try:
      with open(os.path.join(repo or REPO, where), encoding="utf-8") as f:
        metrics: dict[str, Any] = json.load(f)["metrics"]
      if not isinstance(metrics, dict):
        raise TypeError("'metrics' is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{where}: no record metrics to compare with ({e.__class__.__name__}: "
                       f"{e})") from None
    found = []
    for key, value in metrics.items():
      split, _, name = key.partition("_")
      if split == SPLIT and name in TOLERANCES and value is not None:
        found.append(Claim(run, f"eval/{name}", value, TOLERANCES[name], where))
    if not found:
      raise ValueError(f"{where}: no {SPLIT}_* metric among {', '.join(sorted(TOLERANCES))}")
    claims.extend(found)
  return tuple(claims)


def as_written(metric: str, value: float) -> str:
  """How the docs write a value in the record's units: '73.4%' for rates, '0.603' for losses."""
  if metric.rsplit("/", 1)[-1] in PERCENT:
    return f"{value:.1f}%"
  return f"{value:.3f}"


def command(run: str, workdir: str, data_dir: str) -> list[str]:
  """The train.py command line of `run` with its workdir and data dir."""
  return [sys.executable, "train.py", *RUNS[run], f"--workdir={workdir}",
          f"--config.data.data_dir={data_dir}"]


def train(run: str, workdir: str, data_dir: str) -> dict:
  """Runs `run` from the repository root; returns its train_done.json with the wall-clock
  seconds, the command and provenance.json's git and data fields; on failure {"error": line}."""
  start = time.time()
  cmd = command(run, workdir, data_dir)
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


def compare(claims: tuple[Claim, ...], measured: dict[str, dict]) -> list[Row]:
  """(claim, measured value in the record's units or None, passed) for each claim whose run
  was measured."""
  rows = []
  for claim in claims:
    if claim.run not in measured:
      continue
    value = measured[claim.run].get("metrics", {}).get(claim.metric)
    if value is not None:
      value = in_record_units(claim.metric, value)
    rows.append((claim, value, value is not None and abs(value - claim.stated) <= claim.tolerance))
  return rows


def report(rows: list[Row]) -> str:
  """The comparison table, then the measured values as each record's metrics."""
  lines = [f"{'run':<24} {'metric':<14} {'stated':>8} {'measured':>9} {'tol':>6}  result"]
  for claim, value, passed in rows:
    got = "missing" if value is None else as_written(claim.metric, value)
    lines.append(f"{claim.run:<24} {claim.metric:<14} {as_written(claim.metric, claim.stated):>8} "
                 f"{got:>9} {claim.tolerance:>6}  {'PASS' if passed else 'FAIL'}")
  measured: dict[str, dict[str, float]] = {}
  for claim, value, _ in rows:
    if value is not None:
      digits = 1 if claim.metric.rsplit("/", 1)[-1] in PERCENT else 3
      measured.setdefault(claim.where, {})[record_metric(claim.metric)] = round(value, digits)
  if measured:
    lines.append("\nMeasured, in the records' units (a record takes its numbers from the raw "
                 "outputs in its directory; write them there with --results):")
    lines.extend(f"  {where}: {json.dumps(values)}" for where, values in measured.items())
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """Runs the selected runs, prints the comparison with their records; 0 if every claim holds,
  else 1 (also when a run's record cannot be read)."""
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
    claims = load_claims(runs)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  data_dir = args.data_dir or tempfile.mkdtemp(prefix="reproduce_tfds_")
  root = args.workdir or tempfile.mkdtemp(prefix="reproduce_runs_")
  measured = {}
  for run in runs:
    print(f"{run}: python {' '.join(command(run, os.path.join(root, run), data_dir)[1:])}",
          flush=True)
    measured[run] = result = train(run, os.path.join(root, run), data_dir)
    print(f"{run}: " + (f"error: {result['error']}" if "error" in result else
                        f"{result['wall_clock_s']:.0f} s wall clock"), flush=True)
  rows = compare(claims, measured)
  print(report(rows))
  if args.results:
    with open(args.results, "w") as f:
      json.dump(measured, f, indent=1, sort_keys=True)
  return 0 if rows and all(passed for _, _, passed in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
