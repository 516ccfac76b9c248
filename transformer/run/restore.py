"""Reading a trained run back for inference: its Config (`load_run_config`) and one checkpoint's
parameters, or the mean of the last N (`read_params`), checked against that config; read-only, so
a save in flight is left alone. Failures are one-line EvaluationErrors naming the file or step.
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
from typing import Any, Mapping

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from transformer import config as config_lib, files, keyspec, schema
from transformer.config import Config
from transformer.model import models, scoring
from transformer.run.checkpoints import Checkpointer
from transformer.run.digests import check_tokenizers, read_step_meta, verify_step

PARAMS_CHOICES = ("auto", "ema", "raw")  # read_params: which parameters of a checkpoint
# Keys added to format 1 after runs were saved with it, whose schema default reproduces such a
# run: a saved config without the key gets the default (the standard parametrization before µP
# existed, no harness tasks before the harness was wired in, the running backend's kernels, the
# start token's own embedding row).
ADDED_KEYS = {"model": ("parametrization", "mup_base_width", "mup_base_head_dim", "kernels",
                        "start_embedding_id"),
              "eval": ("harness_tasks", "harness_every_steps", "harness_limit",
                       "harness_include_path")}


class EvaluationError(ValueError):
  """A workdir, step or split that cannot be evaluated; the message is one line naming it."""


class StepFailsVerification(EvaluationError):
  """A checkpoint step whose digest does not verify; `verified`: the newest other step that
  does (None if none), for a caller without --step to word its own advice."""

  def __init__(self, message: str, where: str, reason: str, verified: int | None):
    super().__init__(message)
    self.where, self.reason, self.verified = where, reason, verified


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def load_run_config(workdir: str, overrides: dict[str, Any] | None = None) -> Config:
  """The run's Config from `<workdir>/config.json` with `overrides` (flat dotted keys) applied."""
  path = os.path.join(workdir, "config.json")
  if not files.exists(path):
    raise EvaluationError(f"{path} not found: is {workdir!r} the --workdir of a training run?")
  try:
    saved = json.loads(files.read_text(path))
  except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for a binary file
    raise EvaluationError(f"{path}: not a JSON config ({_first_line(e)})") from None
  if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
    raise EvaluationError(f"{path}: not a run's config (no 'model' section)")
  for section, keys in ADDED_KEYS.items():
    if isinstance(saved.get(section), dict):
      defaults = getattr(schema.Config(), section)
      saved[section] = {k: getattr(defaults, k) for k in keys} | saved[section]
  if problem := config_lib.format_problem(saved, path):
    raise EvaluationError(problem)
  cd = ml_collections.ConfigDict(saved)
  overridable = schema.with_role(keyspec.EVAL)
  for key, value in (overrides or {}).items():
    if key not in overridable:
      others = sorted(k for k in overridable if not k.startswith("eval."))
      raise config_lib.ConfigError(f"--config.{key} cannot be overridden at evaluation (it would "
                                   f"not match the trained parameters); allowed: eval.*, "
                                   f"{', '.join(others)}")
    try:
      cd.update_from_flattened_dict({key: value})
    except (KeyError, AttributeError, TypeError) as e:
      raise config_lib.ConfigError(f"--config.{key}={value!r}: {_first_line(e)}") from None
  return config_lib.from_configdict(cd)


def resolve_step(checkpointer: Any, step: int | str | None) -> int:
  """None/'latest' -> the newest step, 'best' -> the best by checkpoint.keep_best_by, int -> it."""
  if isinstance(step, str) and step not in ("latest", "best"):
    try:
      step = int(step)
    except ValueError:
      raise EvaluationError(f"--step={step!r} must be an integer, 'latest' or 'best'") from None
  available = checkpointer.all_steps()
  if not available:
    raise EvaluationError(f"no checkpoints in {checkpointer.directory}")
  if step is None or step == "latest":
    return int(checkpointer.latest_step())
  if step == "best":
    best = checkpointer.best_step()
    if best is None:
      raise EvaluationError(f"no best checkpoint in {checkpointer.directory} (checkpoint."
                            f"keep_best_by is unset or never logged); use --step=latest")
    return int(best)
  if int(step) not in available:
    raise EvaluationError(f"no checkpoint for step {step} in {checkpointer.directory} "
                          f"(steps: {available})")
  return int(step)


@contextlib.contextmanager
def _quiet_orbax():
  """Mutes orbax's warnings (every item not asked for, each option a read-only manager resets)."""
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)


def _read_state(directory: str, step: int) -> dict[str, Any]:
  """The train state of `step` as saved (not in today's optimizer's structure), on one device."""
  with _quiet_orbax():
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True),
                                    item_handlers={"state": ocp.StandardCheckpointHandler()})
    try:
      tree = manager.item_metadata(step)["state"]
      tree = getattr(tree, "tree", tree)
      device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                              tree)
      return manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract)))["state"]
    finally:
      manager.close()


def _check_params(cfg: Config, model: Any, params: Any, where: str) -> None:
  """Raises EvaluationError naming the first parameter whose shape differs from the model's."""
  expected = jax.eval_shape(
      lambda r: scoring.init_params(model, r, models.example_batch(cfg.model)), jax.random.key(0))
  flat = lambda tree: {jax.tree_util.keystr(k): tuple(v.shape)  # noqa: E731
                       for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  want, got = flat(expected), flat(params)
  for key in sorted(set(want) | set(got)):
    if want.get(key) != got.get(key):
      raise EvaluationError(f"{where}: parameter {key} has shape {got.get(key)} but the config in "
                            f"config.json builds {want.get(key)}")


def run_config_difference(cfg: Config, trained: Mapping[str, Any]) -> str | None:
  """The first model.* or data.* key (not of role eval or finetune, nor a derived size written 0)
  that `cfg` changes from the `trained` config, as 'key=value (trained with value)', or None."""
  try:
    theirs = config_lib.to_dict(config_lib.from_configdict(ml_collections.ConfigDict(
        dict(trained))))
  except (ValueError, TypeError, KeyError) as e:
    return f"the checkpoint's config does not read ({_first_line(e)})"
  mine = config_lib.to_dict(cfg)
  for section in ("model", "data"):
    for key in sorted(set(mine[section]) | set(theirs[section])):
      name, now, then = f"{section}.{key}", mine[section].get(key), theirs[section].get(key)
      roles = schema.KEYS[name].roles if name in schema.KEYS else frozenset()
      if keyspec.EVAL in roles or keyspec.FINETUNE in roles or (
          keyspec.DERIVED in roles and not (now and then)):
        continue
      if now != then:
        return f"{name}={now!r} (trained with {then!r})"
  return None


def check_step(cfg: Config, workdir: str, step: int, available: list[int]) -> None:
  """Raises EvaluationError unless checkpoint `step` verifies with its own tokenizers and config."""
  directory = os.path.join(workdir, "checkpoints")
  where = f"{directory}/{step}"
  reason = verify_step(where)
  if reason is not None:
    good = next((s for s in sorted(available, reverse=True)
                 if s != step and verify_step(os.path.join(directory, str(s))) is None), None)
    offer = (f"the newest checkpoint that verifies is step {good}: use --step={good}"
             if good is not None else "no other checkpoint of the run verifies")
    raise StepFailsVerification(f"checkpoint {where} fails verification ({reason}); {offer}",
                                where, reason, good)
  meta = read_step_meta(where) or {}
  check_tokenizers(workdir, meta, f"checkpoint {where}", EvaluationError)
  if meta.get("config"):
    difference = run_config_difference(cfg, meta["config"])
    if difference is not None:
      raise EvaluationError(f"{workdir}/config.json is not the config checkpoint {where} was "
                            f"trained with: {difference}; restore the run's config.json")


@dataclasses.dataclass(frozen=True)
class RestoredParams:
  """What read_params restored: parameters, (newest) step, source ('ema' or 'raw'), all steps."""
  params: Any
  step: int
  source: str
  steps: tuple[int, ...]


def _read_params(directory: str, step: int, available: list[int], which: str) -> tuple[Any, str]:
  """(the EMA or raw parameters, 'ema'|'raw') of one checkpoint; EMA cast to the params' dtypes."""
  try:
    state = _read_state(directory, step)
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
    others = [s for s in available if s != step]
    hint = f"; other steps: {others} (--step=N)" if others else ""
    raise EvaluationError(f"cannot read the checkpoint {directory}/{step} (truncated or not a "
                          f"train state?): {type(e).__name__}: {_first_line(e)}{hint}") from None
  ema = state.get("ema_params")
  if which == "raw" or (which == "auto" and ema is None):
    return state["params"], "raw"
  if ema is None:
    raise EvaluationError(f"--params=ema: {directory}/{step} holds no EMA of the parameters (its "
                          "run had train.ema_decay=0); use --params=raw")
  return jax.tree.map(lambda e, p: e.astype(p.dtype), ema, state["params"]), "ema"


def read_params(cfg: Config, workdir: str, step: int | str | None = None, params: str = "auto",
                average_last: int = 0) -> RestoredParams:
  """The parameters of the run in `workdir` on the first local device. params: 'auto' (the EMA
  when the run kept one, else the raw ones), 'ema' or 'raw'; average_last=N > 0: their float32
  mean over the run's N newest checkpoints (step must then be None or 'latest')."""
  if params not in PARAMS_CHOICES:
    raise EvaluationError(keyspec.one_of_message("--params", params, PARAMS_CHOICES))
  if isinstance(average_last, bool) or not isinstance(average_last, int) or average_last < 0:
    raise EvaluationError(f"--average_last={average_last!r} must be an integer >= 0 (0 = off)")
  if average_last and step not in (None, "latest"):
    raise EvaluationError(f"--average_last={average_last} averages the newest checkpoints; it "
                          f"cannot be combined with --step={step}")
  if not files.isdir(os.path.join(workdir, "checkpoints")):
    raise EvaluationError(f"no checkpoints in {workdir}: has the run saved one yet?")
  with _quiet_orbax():
    ckpt = Checkpointer(workdir, cfg.checkpoint, read_only=True)
  try:
    chosen = [resolve_step(ckpt, step)]
    directory, available = ckpt.directory, ckpt.all_steps()
  finally:
    ckpt.close()
  if average_last:
    if average_last > min(len(available), cfg.checkpoint.keep):
      raise EvaluationError(
          f"--average_last={average_last} needs the run's {average_last} newest checkpoints; it "
          f"keeps the last checkpoint.keep={cfg.checkpoint.keep} (steps found in {directory}: "
          f"{available}); average fewer, or train with --config.checkpoint.keep={average_last} "
          "or more")
    chosen = available[-average_last:]
  model, trees, source = models.build_model(cfg.model), [], ""
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    for s in chosen:  # each step verified (check_step) while it is read; its error comes first
      check = pool.submit(check_step, cfg, workdir, s, available)
      try:
        (tree, source), error = _read_params(directory, s, available, params), None
      except EvaluationError as e:
        error = e
      check.result()
      if error is not None:
        raise error
      _check_params(cfg, model, tree, f"{directory}/{s}")
      trees.append(tree)
  return RestoredParams(trees[0] if len(trees) == 1 else average_trees(trees), chosen[-1],
                        source, tuple(chosen))


def restore_params(cfg: Config, workdir: str, step: int | str | None = None,
                   params: str = "auto") -> tuple[Any, int]:
  """(params, step) of one checkpoint in `workdir` (read_params' short form)."""
  restored = read_params(cfg, workdir, step, params)
  return restored.params, restored.step


def average_trees(trees: Any) -> Any:
  """The elementwise mean of equally shaped pytrees, summed in float32, in the first's dtypes."""
  def mean(*leaves):
    total = sum(jnp.asarray(x, jnp.float32) for x in leaves)
    return (total / len(leaves)).astype(jnp.asarray(leaves[0]).dtype)
  return jax.tree.map(mean, *trees)
