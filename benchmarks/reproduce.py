r"""Reruns the cheap documented results and compares them with the numbers the docs state.

  python benchmarks/reproduce.py                          # every run below: two :tiny trainings
  python benchmarks/reproduce.py --only=g2p_tiny --results=docs/results/reproduce.json

Each run is its documented `python train.py ...` command (RUNS) from the repository root with a
fresh workdir and `--config.data.data_dir` set to one fresh directory per invocation (a new
temporary one unless --data_dir is given), so the data is prepared by this code: a stale
prepared directory cannot stand in for it. The final evaluation the run writes (`<workdir>/train_done.json`) is compared with
CLAIMS; the script prints a table (run, metric, stated, measured, tolerance, PASS/FAIL), then
the CLAIMS rows with the measured values, ready to paste below, and exits 1 on any FAIL.
Wall-clock time is printed, never compared (it depends on the machine and its load).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import NamedTuple

import commands  # benchmarks/ is the script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run name -> the documented train.py arguments, without --workdir and --config.data.data_dir.
RUNS = {
    "g2p_tiny": ["--config=configs/g2p.py:tiny"],
    "g2p_decoder_only_tiny": ["--config=configs/g2p_decoder_only.py:tiny"],
}


class Claim(NamedTuple):
  run: str  # a key of RUNS
  metric: str  # a key of the run's train_done.json "metrics"
  stated: float
  tolerance: float  # absolute: the same command on another CPU may round differently
  where: str  # the files that state the value, space-separated ("": stated here only)


# The stated values, in one place. Each must equal what the files in `where` say (as_written(metric,
# stated) appears in each of them; tests/test_readme.py checks it): update a value here and there
# together, by pasting the rows this script prints.
CLAIMS = (
    Claim("g2p_tiny", "eval/loss", 0.343, 0.01, ""),
    Claim("g2p_tiny", "eval/accuracy", 0.918, 0.01, ""),
    Claim("g2p_tiny", "eval/wer", 0.394, 0.02, "README.md"),
    Claim("g2p_tiny", "eval/per", 0.099, 0.01, "README.md"),
    Claim("g2p_decoder_only_tiny", "eval/loss", 0.351, 0.01, ""),
    Claim("g2p_decoder_only_tiny", "eval/accuracy", 0.915, 0.01, ""),
    Claim("g2p_decoder_only_tiny", "eval/wer", 0.405, 0.02, "README.md"),
    Claim("g2p_decoder_only_tiny", "eval/per", 0.103, 0.01, "README.md"),
)

PERCENT = ("accuracy", "wer", "per")  # metrics the docs write as percentages


def as_written(metric: str, value: float) -> str:
  """How the docs write a metric's value: '73.4%' for rates, '0.603' for losses."""
  if metric.rsplit("/", 1)[-1] in PERCENT:
    return f"{100 * value:.1f}%"
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
  """(claim, measured value or None, passed) for each claim whose run was measured."""
  rows = []
  for claim in claims:
    if claim.run not in measured:
      continue
    value = measured[claim.run].get("metrics", {}).get(claim.metric)
    rows.append((claim, value, value is not None and abs(value - claim.stated) <= claim.tolerance))
  return rows


def report(rows: list[Row]) -> str:
  """The comparison table, then the CLAIMS rows with the measured values (to paste)."""
  lines = [f"{'run':<24} {'metric':<14} {'stated':>8} {'measured':>9} {'tol':>6}  result"]
  for claim, value, passed in rows:
    got = "missing" if value is None else as_written(claim.metric, value)
    lines.append(f"{claim.run:<24} {claim.metric:<14} {as_written(claim.metric, claim.stated):>8} "
                 f"{got:>9} {claim.tolerance:>6}  {'PASS' if passed else 'FAIL'}")
  lines.append("\nMeasured, as CLAIMS rows (paste them into benchmarks/reproduce.py and update the "
               "files in `where`):")
  for claim, value, _ in rows:
    if value is not None:
      lines.append(f"    Claim({claim.run!r}, {claim.metric!r}, {value:.3f}, {claim.tolerance}, "
                   f"{claim.where!r}),")
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
  data_dir = args.data_dir or tempfile.mkdtemp(prefix="reproduce_tfds_")
  root = args.workdir or tempfile.mkdtemp(prefix="reproduce_runs_")
  measured = {}
  for run in runs:
    print(f"{run}: python {' '.join(command(run, os.path.join(root, run), data_dir)[1:])}",
          flush=True)
    measured[run] = result = train(run, os.path.join(root, run), data_dir)
    print(f"{run}: " + (f"error: {result['error']}" if "error" in result else
                        f"{result['wall_clock_s']:.0f} s wall clock"), flush=True)
  rows = compare(CLAIMS, measured)
  print(report(rows))
  if args.results:
    with open(args.results, "w") as f:
      json.dump(measured, f, indent=1, sort_keys=True)
  return 0 if rows and all(passed for _, _, passed in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
