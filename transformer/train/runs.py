"""The runs one training program trains (loop.py): a plain run, or each train.members member,
each with its own config, workdir, checkpoints, reporter, early stopping and metrics; a RunGroup
holds them with the operations the loop asks of them, so the loop trains one run whichever."""

import dataclasses
import math
import os
from typing import Any, Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from transformer import files
from transformer.config import Config, from_configdict, to_dict
from transformer.model import scoring
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


def _restore(runs: list[Run], abstract: Any, train_iter: Any) -> Any:
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


class RunGroup:
  """The runs of one program and the operations the loop needs (start, step, check, log,
  evaluate, save, finish): a plain run is a group of one; train.members' members are a group
  whose states are stacked on a leading axis, each member's hyperparameters traced."""

  def __init__(self, runs: list[Run]):
    self.runs = runs  # runs_of's
    self.stacked = self.runs[0].index is not None  # states [N, ...]; metrics [..., N]

  @property
  def first(self) -> Run:
    """The run that owns the progress bar and the data position."""
    return self.runs[0]

  # ---- the program: shardings, states, steps

  def shardings(self, one: Any) -> Any:
    """The group's state shardings from one run's: members' on a leading, unsharded axis."""
    if not self.stacked:
      return one
    return jax.tree.map(lambda s: jax.sharding.NamedSharding(
        s.mesh, jax.sharding.PartitionSpec(None, *s.spec)), one)

  def fresh_state(self, init: Callable[[jax.Array], Any], shardings: Any) -> Any:
    """Each run's fresh state from its own seed (`init(key)`), placed on `shardings`."""
    if not self.stacked:
      return jax.jit(init, out_shardings=shardings)(jax.random.key(self.first.cfg.seed))
    keys = jnp.stack([jax.random.key(r.cfg.seed) for r in self.runs])
    return jax.jit(jax.vmap(init), out_shardings=shardings)(keys)

  def restore(self, abstract: Any, shardings: Any, train_iter: Any) -> Any:
    """The newest checkpoints that verify (one run's `abstract` state each), or None."""
    state = _restore(self.runs, abstract, train_iter)
    return jax.device_put(state, shardings) if self.stacked and state is not None else state

  def train_step(self, build: Callable[[Config], Callable]) -> Callable:
    """The group's `step(state, batch, ...)` from `build(cfg) -> steps.make_train_step(...)`:
    members' vmapped over their traced hyperparameters (members.py)."""
    step = build(self.first.cfg)  # a member's config holds the overrides all members share
    return members.make_train_step([r.cfg for r in self.runs], step) if self.stacked else step

  def eval_step(self, eval_fn: Callable) -> Callable:
    """`eval_fn(state, batch)` over the group's state: members' vmapped, the batch shared."""
    return jax.vmap(eval_fn, in_axes=(0, None)) if self.stacked else eval_fn

  # ---- the bookkeeping of each run

  def open_checkpoints(self, checkpoint_cfg: Any) -> None:
    """Gives each run its Checkpointer."""
    for r in self.runs:
      r.ckpt = checkpoints.Checkpointer(r.workdir, checkpoint_cfg, config=r.config_dict)

  def check_saves(self) -> None:
    """Raises CheckpointError if a run's asynchronous save has failed."""
    for r in self.runs:
      r.ckpt.check_saves()

  def add_tokens(self, total: int, counted: int) -> None:
    """Counts a batch's token positions (all, non-padding) in every run's throughput."""
    for r in self.runs:
      r.reporter.add_tokens(total, counted)

  def first_loss(self, metrics: dict[str, Any]) -> float:
    """The mean training loss of a dispatch (members: the first member's)."""
    return float(np.mean(self.first.metrics(jax.device_get(metrics["loss"]))))

  def divergence(self, step: int, metrics: dict[str, Any]) -> str:
    """'' if every run's loss and grad norm of the dispatch ending at `step` are finite, else one
    line naming the first run and step that are not and its last good checkpoint (every run's
    checkpoints committed first: this state is never saved)."""
    flags = jax.device_get(metrics["finite"])
    for r in self.runs:  # scalars, or [K] for K steps (a member: its slice)
      finite = np.ravel(r.metrics(flags))
      if not finite.all():
        for other in self.runs:
          other.ckpt.wait()
        return self._diverged(r, step, finite, r.metrics(jax.device_get(metrics)))
    return ""

  def _diverged(self, r: Run, step: int, finite: np.ndarray, m: dict[str, Any]) -> str:
    i = int(np.argmin(finite))
    loss, grad_norm = (float(np.ravel(m[k])[i]) for k in ("loss", "grad_norm"))
    who, whom = ((f"member {r.name}: ", f"all {len(self.runs)} members ") if self.stacked
                 else ("", ""))
    good = r.ckpt.latest_good_step()
    kept = (f"last checkpoint that verifies: step {good} in {r.ckpt.directory}" if good is not None
            else f"no checkpoint in {r.ckpt.directory} verifies" if r.ckpt.all_steps()
            else f"no checkpoint saved yet in {r.ckpt.directory}")
    return (f"{who}non-finite training loss={loss} grad_norm={grad_norm} at step "
            f"{step - finite.size + i + 1}; stopped {whom}({kept})")

  def write_train_scalars(self, step: int, window: list[dict[str, Any]], last: list[str]
                          ) -> None:
    """Writes each run's train scalars of the fetched dispatches in `window`: the mean loss, grad
    norm and mixture metrics, the last value of `last`'s keys, the throughput."""
    for r in self.runs:
      fetched = [r.metrics(m) for m in window]
      means = ("loss", "grad_norm", *sorted(k for k in fetched[0] if k.startswith("moe_")))
      scalars = {f"train/{k}": float(np.mean(np.concatenate([np.ravel(m[k]) for m in fetched])))
                 for k in means}
      scalars |= {f"train/{k}": float(np.ravel(fetched[-1][k])[-1]) for k in last}
      r.reporter.write_scalars(step, scalars | r.reporter.throughput())
      r.final |= scalars

  def evaluate(self, step: int, sums: dict[str, Any], fetched_state: Any,
               decode: Callable[[Run, Any], dict[str, float]]) -> bool:
    """Each run's eval metrics (teacher-forced `sums`, then `decode(run, its state)`) written;
    True when early stopping asks to stop."""
    bar = self.first.reporter  # the one progress bar; its ETA does not count this
    for r in self.runs:
      r.last_eval = scoring.teacher_forced_metrics(r.item(sums), prefix="eval/") if sums else {}
      r.last_eval |= decode(r, r.item(fetched_state))
    stop = False
    for r in self.runs:  # after every decode: a throughput window counts no evaluation
      r.reporter.write_scalars(step, r.last_eval)
      r.reporter.reset_throughput()
      bar.evaluated(step, r.last_eval, r.name)
      stop = r.early.update(r.last_eval) or stop
    bar.evaluation_done()
    return stop

  def save(self, step: int, fetched_state: Any, train_iter: Any, evaluated: bool,
           extra: dict[str, float]) -> None:
    """Starts each run's async save of `step` with the data position and its metrics."""
    for r in self.runs:
      r.ckpt.save(step, r.item(fetched_state), train_iter,
                  (r.last_eval if evaluated else {}) | r.early.state() | extra, force=True)

  def result(self, step: int) -> dict[str, float]:
    """train_and_evaluate's metrics: a plain run's own, or every member's as '<name>/<key>'."""
    if not self.stacked:
      return self.first.final
    return {f"{r.name}/{k}": v for r in self.runs for k, v in r.final.items()} | {"step": step}
