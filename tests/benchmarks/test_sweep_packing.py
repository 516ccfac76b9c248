"""benchmarks/sweep_packing.py: what it compares between a packed and an unpacked point (every
logged loss, grad norm and evaluation, each eval.py metric; never rates or times)."""

import json

import pytest

from bench_loader import load_benchmark

sweep_packing = load_benchmark("sweep_packing")


def _point(directory, loss, wer, elapsed):
  directory.mkdir()
  rows = [{"step": 1, "train/loss": loss, "train/grad_norm": 2.0, "perf/steps_per_sec": elapsed,
           "time/elapsed_s": elapsed},
          {"step": 1, "eval/loss": loss + 3, "eval/wer": wer}]
  (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (directory / "metrics.test.json").write_text(json.dumps(
      {"split": "test", "step": 1, "wer": wer, "decode": "beam", "coverage": {"n": 3}}))
  return str(directory)


def test_logged_values_and_their_largest_difference(tmp_path):
  """Losses, grad norms, eval/* and eval.py's numbers are compared; rates and times are not."""
  a = sweep_packing.logged(_point(tmp_path / "a", 0.5, 0.5, 1.0))
  b = sweep_packing.logged(_point(tmp_path / "b", 0.5 + 2e-6, 0.5, 9.0))
  assert sorted(a) == ["1:eval/loss", "1:eval/wer", "1:train/grad_norm", "1:train/loss",
                       "test:wer"]
  b["1:eval/loss"] = a["1:eval/loss"]
  diff, only = sweep_packing.compare(a, b)
  assert diff == pytest.approx(2e-6) and only == []  # absolute below 1
  b["1:eval/loss"] = 3.5 * (1 + 3e-6)  # relative above 1
  assert sweep_packing.compare(a, b)[0] == pytest.approx(3e-6, rel=1e-4)
  del b["test:wer"]
  assert sweep_packing.compare(a, b)[1] == ["test:wer"]


@pytest.mark.parametrize("argv, culprit", [
    (["--seeds=1"], "--seeds=1 must be >= 2"),
    (["--steps=3"], "unknown arguments ['--steps=3']"),
])
def test_bad_arguments_are_one_line(argv, culprit, capsys):
  with pytest.raises(SystemExit):
    sweep_packing.parse(argv)
  assert culprit in capsys.readouterr().err


def test_the_first_step_beyond_the_tolerance_and_the_spread():
  """diverged_at names the first logged step with a value apart by more than the tolerance
  (relative above 1); eval.py's values (no step) do not count; mean_sd is the sample's."""
  packed = {"50:train/loss": 2.0, "100:train/loss": 1.0, "100:eval/wer": 0.5, "test:wer": 0.4}
  unpacked = {"50:train/loss": 2.0 + 1e-6, "100:train/loss": 1.0 + 1e-3, "100:eval/wer": 0.5,
              "test:wer": 0.9}
  assert sweep_packing.diverged_at(packed, unpacked, 1e-5) == 100
  assert sweep_packing.diverged_at(packed, unpacked, 1e-2) is None
  assert sweep_packing.mean_sd([1.0, 3.0]) == (2.0, 2.0 ** 0.5)


def test_points_are_seeds_times_learning_rates_and_names_match_sweep_py():
  """Seeds outer; the one-point baseline's directory has its packed twin's name (spec.point_names
  names both)."""
  args, _ = sweep_packing.parse(["--seeds=2", "--learning_rates=1e-3,3e-3", "--baseline=one"])
  points = sweep_packing.points(args)
  assert points == [{"seed": 0, "train.learning_rate": 1e-3},
                    {"seed": 0, "train.learning_rate": 3e-3},
                    {"seed": 1, "train.learning_rate": 1e-3},
                    {"seed": 1, "train.learning_rate": 3e-3}]
  names = sweep_packing.spec.point_names(points)
  assert sweep_packing.spec.point_names(points[:1]) == names[:1]
  assert sweep_packing.title(args, len(points)) == "4 points (2 seeds x 2 learning rates)"
  args, _ = sweep_packing.parse(["--seeds=3"])
  assert sweep_packing.points(args) == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
  args, _ = sweep_packing.parse(["--seeds=1", "--learning_rates=1e-3,3e-3"])  # 2 points: enough
  assert len(sweep_packing.points(args)) == 2
