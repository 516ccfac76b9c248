"""Random search in sweep files: seeded draws from ranges, checked ranges, one-line errors."""

import math
import os

import numpy as np
import pytest

from sweep_fixtures import ROOT, TINY, load_config_file, sweep_cli, write_sweep
from configs import sweeps as helpers
from transformer.sweeps import search, spec

SPACE = {"train.learning_rate": search.log_uniform(1e-4, 1e-1),
         "train.label_smoothing": search.uniform(0.0, 0.2),
         "train.warmup_steps": search.int_uniform(1, 3),
         "model.ffn": search.choice(["relu", "gelu"])}


def test_same_seed_same_points_and_prefixes():
  """The same seed gives the same points, another seed others; the first N points of a longer
  search are the N-point search; values are plain Python scalars."""
  a = search.random_search(SPACE, 12, seed=3)
  assert a == search.random_search(SPACE, 12, seed=3)
  assert a != search.random_search(SPACE, 12, seed=4)
  assert search.random_search(SPACE, 5, seed=3) == a[:5]
  assert all(type(p["train.learning_rate"]) is float and type(p["train.warmup_steps"]) is int
             for p in a)
  assert [list(p) for p in a] == [list(SPACE)] * 12


def test_draws_respect_ranges_and_distributions():
  """Every value lies in its range (ends included); over 2000 draws the log-uniform key's
  logarithm and the uniform key have the mean of their uniform distributions, each integer and
  choice comes up about equally often, and no two points are the same run."""
  points = search.random_search(SPACE, 2000, seed=0, digits=0)
  lr = np.array([p["train.learning_rate"] for p in points])
  ls = np.array([p["train.label_smoothing"] for p in points])
  assert lr.min() >= 1e-4 and lr.max() <= 1e-1 and ls.min() >= 0.0 and ls.max() <= 0.2
  assert abs(np.log(lr).mean() - (math.log(1e-4) + math.log(1e-1)) / 2) < 0.1  # sd/sqrt(n) ~ 0.04
  assert abs(ls.mean() - 0.1) < 0.005
  for key, values in (("train.warmup_steps", [1, 2, 3]), ("model.ffn", ["relu", "gelu"])):
    counts = [sum(p[key] == v for p in points) for v in values]
    assert all(abs(c / len(points) - 1 / len(values)) < 0.05 for c in counts), (key, counts)
  assert len({tuple(p.values()) for p in points}) == len(points)
  rounded = search.random_search(SPACE, 50, seed=0)
  assert all(len(f"{p['train.learning_rate']:.10g}".lstrip("0.").replace(".", "")) <= 4
             for p in rounded)  # 4 significant digits by default


@pytest.mark.parametrize("space, pattern", [
    ({"train.learning_rate": search.log_uniform(0.0, 1e-2)}, "train.learning_rate: log_uniform"),
    ({"train.label_smoothing": search.uniform(0.3, 0.1)}, "train.label_smoothing: uniform"),
    ({"train.warmup_steps": search.int_uniform(1, 2.5)}, "train.warmup_steps: int_uniform"),
    ({"model.ffn": search.choice([])}, "model.ffn: choice"),
    ({"seed": [0, 1]}, "seed: .* is not a range"),
])
def test_bad_range_is_one_line_error_naming_the_key(space, pattern):
  with pytest.raises(ValueError, match=pattern):
    search.random_search(space, 4)
  with pytest.raises(ValueError, match="fewer than num_points"):
    search.random_search({"seed": search.choice([0, 1])}, 3)


def test_random_search_sweep_file_plans_and_bad_range_fails_in_the_cli(tmp_path):
  """A sweep file of one random_search plans its N points (validated, named by value); a bad
  range stops sweep.py with one line naming the file, its line and the key."""
  config = load_config_file(TINY)
  path = write_sweep(tmp_path, """
      from configs.sweeps import random_search, log_uniform, choice
      def get_sweep():
        return random_search({"train.learning_rate": log_uniform(1e-4, 1e-2),
                              "model.positional": choice(["rope", "sinusoidal"])}, 6, seed=1)
      """)
  points = spec.plan(config, TINY, path, str(tmp_path / "w"))
  assert [p.overrides for p in points] == helpers.random_search(
      {"train.learning_rate": helpers.log_uniform(1e-4, 1e-2),
       "model.positional": helpers.choice(["rope", "sinusoidal"])}, 6, seed=1)
  assert points[0].name.startswith("lr=")
  bad = write_sweep(tmp_path, """
      from configs.sweeps import random_search, uniform
      def get_sweep():
        return random_search({"train.label_smoothing": uniform(0.2, 0.1)}, 4)
      """, name="bad.py")
  out = sweep_cli(f"--config={TINY}", f"--sweep={bad}", f"--workdir={tmp_path / 'w'}", "--dry_run")
  assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
  assert f"{bad}:" in out.stderr and "train.label_smoothing: uniform(0.2, 0.1)" in out.stderr


def test_shipped_random_search_file_plans_eight_points():
  """configs/sweeps/random_lr.py plans 8 distinct, valid points of :tiny inside its ranges."""
  config = load_config_file(TINY)
  points = spec.plan(config, TINY, os.path.join(ROOT, "configs/sweeps/random_lr.py"), "w")
  lr = config.train.learning_rate
  assert len({p.name for p in points}) == 8
  assert all(lr / 4 <= p.overrides["train.learning_rate"] <= lr * 4 for p in points)
