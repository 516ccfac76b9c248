"""The runs a scaling fit reads: each workdir's parameters, tokens, FLOPs and final loss, and
which runs cannot be fitted.

Tokens are the steps trained (train_done.json) times the tokens of a step (batch rows x row
length, counting.tokens_per_step); FLOPs are tokens x counting.flops_per_token (MFU's count).
A run's loss is `metric`: eval/<name> of the in-training evaluation at its last step, or
<split>/<name> of eval.py's metrics.<split>.json. Runs are grouped into budgets: sorted by FLOPs,
a run within 10% of the first FLOPs of the open group joins it; a budget is its runs' geometric
mean. Left out and named (`Observations.left_out`): unfinished runs (no train_done.json), runs
whose loss or any logged train/loss is not finite (diverged), runs without the metric at their
last step. Refused (ScalingError, naming them): runs that trained or were evaluated on other
data than the others (compare's warnings: data keys, data fingerprints, evaluation split or set).
"""

import dataclasses
import json
import math
from typing import Any, Sequence

import numpy as np

from transformer.run import compare, restore, results, table
from transformer.scaling import counting

BUDGET_TOLERANCE = 1.10  # runs within 10% FLOPs of a budget's first are that budget
REFUSED = ("different data", "different evaluation")  # compare's warnings that refuse a fit


class ScalingError(ValueError):
  """Runs that cannot be fitted together, or a bad argument; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One finished run as a fit sees it."""
  path: str
  seed: int
  params: int  # non-embedding (or total, as asked)
  total_params: int
  tokens: float
  flops: float
  flops_per_token: float
  loss: float
  budget: float = 0.0  # its budget group's FLOPs (set by `group`)


@dataclasses.dataclass(frozen=True)
class Observations:
  """The fitted runs and the ones left out, with why."""
  runs: tuple[Run, ...]
  left_out: tuple[str, ...]  # 'PATH: reason'
  metric: str

  def arrays(self, budgets: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """budget, n, d, c, loss of the runs (of `budgets` only, if given) as float arrays."""
    runs = [r for r in self.runs if budgets is None or r.budget in budgets]
    return {k: np.array([getattr(r, a) for r in runs], np.float64) for k, a in (
        ("budget", "budget"), ("n", "params"), ("d", "tokens"), ("c", "flops"),
        ("loss", "loss"))}

  @property
  def budgets(self) -> list[float]:
    """The budgets, ascending."""
    return sorted({r.budget for r in self.runs})


def final_loss(run: results.RunFiles, metric: str) -> float | None:
  """The run's `metric` at its last step (None if it was not evaluated there)."""
  if metric.startswith("eval/"):
    at_end = [r for r in run.logged if metric in r and r.get("step") == run.steps]
    value = at_end[-1][metric] if at_end else None
  else:
    split, _, name = metric.partition("/")
    value = run.evaluated.get(split, {}).get(name)
  return float(value) if table.is_number(value) else None


def _why_left_out(run: results.RunFiles, loss: float | None, metric: str) -> str | None:
  if run.done is None:
    return f"unfinished (no train_done.json; at step {run.steps})"
  train = [r["train/loss"] for r in run.logged if "train/loss" in r]
  if (loss is not None and not math.isfinite(loss)) or not all(
      table.is_number(x) and math.isfinite(x) for x in train):
    return "diverged (a loss that is not finite)"
  if loss is None:
    return f"no {metric} at its last step {run.steps}"
  return None


_COUNTS: dict[str, counting.Counts] = {}


def counts_of(workdir: str) -> counting.Counts:
  """counting.count of the run's saved config (cached by model and data settings)."""
  cfg = restore.load_run_config(workdir)
  key = json.dumps([dataclasses.asdict(cfg.model), dataclasses.asdict(cfg.data)], default=str)
  if key not in _COUNTS:
    _COUNTS[key] = counting.count(cfg)
  return _COUNTS[key]


def read(paths: Sequence[str], metric: str = "eval/loss", params: str = "non_embedding"
         ) -> Observations:
  """The runs under `paths` (workdirs, globs, members runs or a sweep's workdir)."""
  if params not in ("non_embedding", "total"):
    raise ScalingError(f"params={params!r}: one of non_embedding, total")
  try:
    files = [results.read_run(w) for w in results.expand(paths)]
  except results.WorkdirError as e:
    raise ScalingError(str(e)) from None
  refused = [w for w in compare.comparison_warnings(files) if w.startswith(REFUSED)]
  if refused:
    raise ScalingError(f"runs on different data cannot be fitted together: {refused[0]}")
  runs, left_out = [], []
  for f in files:
    loss = final_loss(f, metric)
    if why := _why_left_out(f, loss, metric):
      left_out.append(f"{f.path}: {why}")
      continue
    c = counts_of(f.path)
    tokens = float(f.steps * counting.tokens_per_step(restore.load_run_config(f.path)))
    runs.append(Run(f.path, int(f.config.get("seed", 0)),
                    c.non_embedding if params == "non_embedding" else c.total, c.total, tokens,
                    tokens * c.flops_per_token, c.flops_per_token, loss))
  return Observations(tuple(group(runs)), tuple(left_out), metric)


def group(runs: Sequence[Run]) -> list[Run]:
  """The runs with their budget set: groups of FLOPs within BUDGET_TOLERANCE of the first."""
  out, members = [], []
  for run in sorted(runs, key=lambda r: r.flops) + [None]:
    if members and (run is None or run.flops > members[0].flops * BUDGET_TOLERANCE):
      budget = float(np.exp(np.mean(np.log([r.flops for r in members]))))
      out += [dataclasses.replace(r, budget=budget) for r in members]
      members = []
    if run is not None:
      members.append(run)
  return out
