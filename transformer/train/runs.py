"""The runs one training program trains (loop.py): a plain run, or each train.members member,
each with its own config, workdir, checkpoints, reporter, early stopping and metrics."""

import dataclasses
import math
import os
from typing import Any

from absl import logging
import jax
import numpy as np

from transformer import files
from transformer.config import Config, from_configdict, to_dict
from transformer.run import checkpoints, digests
from transformer.train import members


@dataclasses.dataclass
class Run:
  """One run's bookkeeping: a plain run (index None), or member `index` of a stacked state."""
  name: str  # "" for a plain run
  workdir: str
  cfg: Config
  config_dict: dict[str, Any]
  index: int | None = None
  ckpt: Any = None
  reporter: Any = None
  early: Any = None
  saved: dict[str, float] = dataclasses.field(default_factory=dict)
  last_eval: dict[str, float] = dataclasses.field(default_factory=dict)
  final: dict[str, float] = dataclasses.field(default_factory=dict)

  def item(self, tree: Any) -> Any:
    """This run's state (or eval sums) of the loop's: a member's slice of the leading axis."""
    return tree if self.index is None else jax.tree.map(lambda x: x[self.index], tree)

  def metrics(self, metrics: Any) -> Any:
    """This run's train metrics of a dispatch's ([N] or [K, N] per member: the last axis)."""
    if self.index is None:
      return metrics
    return jax.tree.map(lambda x: np.asarray(x)[..., self.index], metrics)


class EarlyStopping:
  """Counts evaluations without improvement of `train.early_stop_metric`; state is two floats."""

  def __init__(self, tc: Any, saved: dict[str, float]):
    self.patience, self.key = tc.early_stop_patience, tc.early_stop_metric
    self.sign = 1.0 if tc.early_stop_mode == "min" else -1.0
    self.best = saved.get("early_stop/best", math.inf)
    self.bad = int(saved.get("early_stop/bad_evals", 0))

  def update(self, metrics: dict[str, float]) -> bool:
    """Records one evaluation; True when the run should stop."""
    if not self.patience or self.key not in metrics:
      return False
    value = self.sign * metrics[self.key]
    if value < self.best:
      self.best, self.bad = value, 0
    else:
      self.bad += 1
    return self.bad >= self.patience

  def state(self) -> dict[str, float]:
    return {"early_stop/best": self.best, "early_stop/bad_evals": float(self.bad)}


def runs_of(cfg: Config, workdir: str) -> list[Run]:
  """cfg's plain run in `workdir`, or each train.members member in `<workdir>/<name>`."""
  runs = [Run(m.name, os.path.join(workdir, m.name), m.cfg, to_dict(m.cfg), i)
          for i, m in enumerate(members.members_of(cfg))] or [Run("", workdir, cfg, to_dict(cfg))]
  for r in runs:
    checkpoints.check_compatible(r.workdir, r.config_dict)
    if r.index is not None and files.exists(os.path.join(workdir, "tokenizers")) and not (
        files.exists(os.path.join(r.workdir, "tokenizers"))):  # each member's workdir is whole
      from transformer.data.task import copy_tokenizers  # pylint: disable=g-import-not-at-top  (TFDS)
      copy_tokenizers(workdir, r.workdir)
  return runs


def member_workdirs(config: Any, workdir: str) -> list[str]:
  """The workdirs a config trains in `workdir`: [workdir], or one per train.members member."""
  cfg = config if isinstance(config, Config) else from_configdict(config)
  return [os.path.join(workdir, m.name) for m in members.members_of(cfg)] or [workdir]


def result(runs: list[Run], step: int) -> dict[str, float]:
  """train_and_evaluate's metrics: a plain run's own, or every member's as '<name>/<key>'."""
  if runs[0].index is None:
    return runs[0].final
  return {f"{r.name}/{k}": v for r in runs for k, v in r.final.items()} | {"step": step}


def restore(runs: list[Run], abstract: Any, train_iter: Any) -> Any:
  """The runs' newest checkpoints that verify (the data position from the first): one state, or
  the members' stacked on host; None without checkpoints. Members must be at one step."""
  latest = [r.ckpt.latest_step() for r in runs]
  if len(set(latest)) > 1:
    where = ", ".join(f"{r.name}: {s}" for r, s in zip(runs, latest))
    raise checkpoints.CheckpointError(
        f"train.members: the members' latest checkpoints differ ({where}); resume the members "
        "alone, or remove the newer checkpoints")
  if latest[0] is None:
    return None
  states = []
  for i, r in enumerate(runs):
    # Each newer checkpoint that fails to verify is named in a line and moved aside.
    good, state = r.ckpt.restore_latest_good(abstract, train_iter if i == 0 else None)
    if good != latest[i]:
      logging.warning("Resuming from step %d, the newest checkpoint that verifies (the newer "
                      "ones are kept as <step>%s in %s).", good, digests.CORRUPT_SUFFIX,
                      r.ckpt.directory)
    meta = r.ckpt.metadata(good)
    digests.check_tokenizers(r.workdir, meta, f"checkpoint {r.ckpt.directory}/{good}")
    states.append(state)
    r.saved = meta["metrics"]
  if len({int(np.ravel(jax.device_get(s.step))[0]) for s in states}) > 1:
    raise checkpoints.CheckpointError(
        "train.members: the members' newest checkpoints that verify differ in step; resume the "
        "members alone, or remove the newer checkpoints")
  if runs[0].index is None:
    return states[0]
  return jax.tree.map(lambda *xs: np.stack(xs), *jax.device_get(states))  # on host
