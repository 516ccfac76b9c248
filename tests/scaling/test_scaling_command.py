"""`python -m transformer.scaling fit` end to end on workdirs written by hand (no training): their
losses lie on a known surface L(N, D) with the runs' exact parameter and token counts, so the
fits must recover it and predict the held-out budget; bad runs are named or refused."""

import json
import os

import numpy as np
import pytest

import transformer
from configs import lm
from configs.sweeps import isoflop as isoflop_sweep
from transformer.config import from_configdict, to_dict
from transformer.scaling import approach3, command, counting, isoflop, observations
from transformer.sweeps import spec

# alpha != beta; its optimum lies mid-window of isoflop.py's sizes
SURFACE = approach3.Fit(E=0.9, A=60.0, B=80.0, alpha=0.40, beta=0.34, objective=0.0)
BUDGETS = (2.5e10, 5e10, 1e11, 2e11)


def write_run(workdir: str, overrides: dict, loss_of=None, done: bool = True,
              text_file: str = "corpus.txt") -> float:
  """A finished run's files: config.json, metrics.jsonl (its final evaluation), train_done.json;
  returns its loss (SURFACE at its N and D unless `loss_of(n, d)` says otherwise)."""
  cd = spec.apply_overrides(lm.get_config("isoflop"), {
      **overrides, "model.vocab_size": isoflop_sweep.VOCAB_SIZE, "data.dataset": "text_files",
      "data.text_file": text_file})
  cfg = from_configdict(cd)
  counts = counting.count(cfg)
  steps = cfg.train.num_steps
  tokens = steps * counting.tokens_per_step(cfg)
  loss = (loss_of or SURFACE.loss)(counts.non_embedding, tokens)
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(to_dict(cfg), f)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": steps, "train/loss": float(loss)}) + "\n")
    f.write(json.dumps({"step": steps, "eval/loss": float(loss)}) + "\n")
  if done:
    with open(os.path.join(workdir, "train_done.json"), "w") as f:
      json.dump({"step": steps, "reason": "num_steps"}, f)
  return loss


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> str:
  """An IsoFLOP sweep's workdir: 4 budgets x 5 sizes of isoflop.py's ladder, one seed, on the
  surface."""
  root = str(tmp_path_factory.mktemp("isoflop"))
  config = lm.get_config("isoflop")
  runs = isoflop.plan(config, BUDGETS, isoflop_sweep.LADDER, num_sizes=5, spacing=1.7,
                      tokens_per_param=10.0, vocab_size=isoflop_sweep.VOCAB_SIZE)
  points = isoflop.sweep_points(config, runs, [0])
  for name, point in zip(spec.point_names(points), points):
    write_run(os.path.join(root, name), point)
  return root


def test_fit_recovers_the_surface_and_predicts_the_held_out_budget(sweep_dir, capsys):
  assert command.main(["fit", sweep_dir, "--holdout=2e11", "--bootstrap=5", "--noplot"]) == 0
  printed = capsys.readouterr().out
  assert "Approach 2 (IsoFLOP)" in printed and "at 2e+11 FLOPs (held out):" in printed
  with open(os.path.join(sweep_dir, "scaling.json")) as f:
    result = json.load(f)
  a3 = result["approach3"]
  assert abs(a3["alpha"] - SURFACE.alpha) < 0.005 and abs(a3["beta"] - SURFACE.beta) < 0.005
  assert a3["E"] == pytest.approx(SURFACE.E, rel=0.01)
  assert len(result["fitted_budgets"]) == 3 and len(result["runs"]) == 20
  held = result["held_out"]["2e+11"]
  assert held["approach3"]["loss_within_2pct"] and held["approach3"]["size_within_1.5x"]
  assert held["approach2"]["loss_within_2pct"]


def test_unfinished_and_diverged_runs_are_named_and_left_out(sweep_dir, tmp_path):
  extra = str(tmp_path / "extra")
  write_run(os.path.join(extra, "unfinished"), {"model.d_model": 32}, done=False)
  write_run(os.path.join(extra, "diverged"), {"model.d_model": 40},
            loss_of=lambda n, d: float("nan"))
  obs = observations.read([sweep_dir, os.path.join(extra, "unfinished"),
                           os.path.join(extra, "diverged")])
  assert len(obs.runs) == 20
  assert any("unfinished" in w and w.startswith(os.path.join(extra, "unfinished"))
             for w in obs.left_out)
  assert any("diverged" in w and w.startswith(os.path.join(extra, "diverged"))
             for w in obs.left_out)


def test_runs_on_other_data_are_refused_naming_them(sweep_dir, tmp_path, capsys):
  other = str(tmp_path / "other")
  write_run(other, {"model.d_model": 32}, text_file="another.txt")
  assert command.main(["fit", sweep_dir, other, "--noplot"]) == 2
  error = capsys.readouterr().err
  assert error.startswith("error: runs on different data") and other in error
  assert "\n" not in error.strip()


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
  assert command.main(["fit"]) == 2
  assert command.main(["fitt", str(tmp_path)]) == 2
  assert command.main(["fit", str(tmp_path / "nothing")]) == 2
  errors = capsys.readouterr().err.strip().splitlines()
  assert len(errors) == 3 and all(e.startswith("error: ") for e in errors)


def test_a_notebook_gets_the_commands_numbers(sweep_dir):
  result = transformer.fit_runs(sweep_dir, holdout=2e11, samples=3)
  assert abs(result["approach3"]["alpha"] - SURFACE.alpha) < 0.005
  assert set(result["approach3"]["predictions"]) == {"2e+11"}
