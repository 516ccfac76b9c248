"""benchmarks/vit_digits.py: per-seed workdirs and sweep points aggregated into mean and range
(checked against hand-computed numbers), the SVC baseline chosen on validation, the commands, and
a record that passes the record schema."""

import json
import os

import pytest

from bench_loader import load_benchmark
from record_schema import OPTIONAL, REQUIRED

vit = load_benchmark("vit_digits")


def _write(path, accuracy, **extra):
  os.makedirs(path, exist_ok=True)
  (path / "metrics.test.json").write_text(json.dumps(
      {"accuracy": accuracy, "f1": accuracy - 0.01, "loss": 0.1, "step": 1500} | extra))


@pytest.fixture(name="runs")
def _runs(tmp_path):
  runs = tmp_path / "runs"
  for seed, acc in ((0, 0.95), (1, 0.96), (2, 0.98)):
    _write(runs / f"tiny_seed{seed}", acc)
  _write(runs / "default_seed0", 0.99)
  (runs / "walltimes.jsonl").write_text(
      "".join(json.dumps({"workdir": f"tiny_seed{s}", "train_seconds": 100.0 + s}) + "\n"
              for s in range(3)))
  for patch, seed, acc in ((2, 0, 0.97), (4, 0, 0.90), (4, 1, 0.92)):
    point = runs / vit.SWEEP_DIR / f"model.patch_size={patch},seed={seed}"
    _write(point / "best", acc)
    (point / "config.json").write_text(json.dumps({"seed": seed, "model": {"patch_size": patch}}))
  return runs


def test_collect_and_stats_by_hand(runs):
  """tiny: 95, 96, 98 -> mean 96.33, range 95-98, sample std sqrt((1.78+0.11+2.78)/2) = 1.53;
  the sweep's points group by patch size."""
  results = vit.collect(str(runs))
  assert sorted(results) == ["default", "patch2", "patch4"] + ["tiny"]
  s = vit._stats(results["tiny"])  # pylint: disable=protected-access
  assert (s["mean"], s["min"], s["max"], s["std"]) == (96.33, 95.0, 98.0, 1.53)
  assert s["mean_train_seconds"] == 101.0
  patch4 = vit._stats(results["patch4"])  # pylint: disable=protected-access
  assert patch4["test_accuracy"] == [90.0, 92.0]


def test_record_passes_the_schema(runs, tmp_path):
  record = vit.report(str(runs), str(tmp_path / "out"))
  for key, types in REQUIRED.items():
    assert isinstance(record[key], types), key
  assert set(record) <= set(REQUIRED) | set(OPTIONAL)
  m = record["metrics"]
  assert m["test_accuracy_tiny"] == 96.33 and m["test_accuracy_tiny_seed2"] == 98.0
  assert record["spread"]["test_accuracy_tiny"] == [95.0, 98.0]
  assert record["wall_clock_s"] == 303.0 and record["seeds"] == [0, 1, 2]
  assert 90 < m["test_accuracy_svc"] <= 100  # an RBF SVC on the digits
  assert (tmp_path / "out" / "table.md").read_text().count("\n") == 2 + 4 + 1


def test_svc_is_chosen_on_validation():
  svc = vit.svc_baseline()
  best = max(g["validation_accuracy"] for g in svc["grid"])
  assert svc["validation_accuracy"] == best and len(svc["grid"]) == 16
  chosen = [g for g in svc["grid"] if (g["C"], g["gamma"]) == (svc["chosen"]["C"],
                                                                 svc["chosen"]["gamma"])]
  assert chosen[0]["validation_accuracy"] == best


def test_commands_select_the_best_validation_checkpoint():
  workdir, train, evaluate = vit.commands("R", "tiny", 2)
  assert workdir == os.path.join("R", "tiny_seed2")
  assert "--config=configs/vit.py:tiny" in train and "--config.seed=2" in train
  assert "--step=best" in evaluate and "--split=test" in evaluate
