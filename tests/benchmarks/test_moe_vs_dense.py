"""benchmarks/moe_vs_dense.py: the summary of its runs (means, spreads, the same-run ratio), and
its refusals."""

import subprocess
import sys

import pytest

from bench_loader import REPO, load_benchmark

bench = load_benchmark("moe_vs_dense")


def test_summary_means_spreads_and_the_per_seed_step_time_ratio():
  """The ratio is each seed's mixture over its own dense run, averaged (not a ratio of means)."""
  runs = {"dense": [dict(dev_loss=1.5, ms_per_step=100.0, dropped=None),
                    dict(dev_loss=1.7, ms_per_step=200.0, dropped=None)],
          "moe": [dict(dev_loss=1.4, ms_per_step=120.0, dropped=0.1),
                  dict(dev_loss=1.5, ms_per_step=300.0, dropped=0.3)]}
  metrics, spread = bench.summarise(runs, [0, 1])
  assert metrics["dense_dev_loss"] == 1.6 and metrics["moe_dev_loss"] == 1.45
  assert metrics["dev_loss_difference"] == -0.15
  assert metrics["step_time_ratio"] == 1.35  # mean of 1.2 and 1.5 (a ratio of means: 1.4)
  assert spread == {"dense_dev_loss": [1.5, 1.7], "moe_dev_loss": [1.4, 1.5],
                    "step_time_ratio": [1.2, 1.5]}
  assert metrics["moe_dev_loss_seed1"] == 1.5 and metrics["moe_dropped_fraction"] == 0.2
  for key, (lo, hi) in spread.items():  # what tests/docs/test_records.py asks of a record
    assert lo <= metrics[key] <= hi


@pytest.mark.parametrize("args,message", [
    (["--out=/tmp/x", "--text_file=/no/such/file"], "--text_file=/no/such/file: no such file"),
    (["--out=/tmp/x", "--text_file=README.md", "--bogus"], "unknown arguments ['--bogus']")])
def test_bad_arguments_are_one_line_errors(args, message):
  proc = subprocess.run([sys.executable, "benchmarks/moe_vs_dense.py", *args], cwd=REPO,
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
