"""A trained run on disk, read for inference: its config.json and a checkpoint's parameters.

`load_config(workdir, overrides)` gives the run's Config with the overrides evaluation may apply
(OVERRIDABLE: none changes what was trained); `restore_params(cfg, workdir, step)` gives the
parameters of a checkpoint, checked against the shapes that config builds. Both only read the
workdir: checkpoints are opened read-only, so a save that training has in flight is left alone.
Every failure (a missing, truncated or foreign checkpoint, a bad config.json) is an
EvaluationError whose one-line message names the file, step or parameter.

Fine-tuning (`train.py --init_from=RUN`) starts from such a run: `init_from_config(cfg, run)` takes
the run's model section (all but FINETUNE_MODEL_KEYS) and tokenizer keys, `init_params(run)` its
latest parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from transformer import files
from transformer.config import Config, ConfigError, from_configdict

# Keys `overrides` may change: none of them changes parameter shapes or what was trained.
OVERRIDABLE_PREFIXES = ("eval.",)
OVERRIDABLE_KEYS = frozenset({
    "seed", "data.data_dir", "data.eval_split", "data.batch_size",
    "model.attention_impl", "model.dtype"})
STEP_NAMES = ("latest", "best")
# Model keys a fine-tuning config sets itself: regularisation and execution, never the function.
FINETUNE_MODEL_KEYS = ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate",
                       "attention_impl", "remat", "dtype")
_TOKENIZER_KEYS = ("tokenizer", "source_tokenizer", "spm_model_type", "spm_vocab_size",
                   "hf_tokenizer")


class EvaluationError(ValueError):
  """A workdir, step or split that cannot be evaluated; the message is one line naming it."""


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def load_config(workdir: str, overrides: dict[str, Any] | None = None) -> Config:
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
  cd = ml_collections.ConfigDict(saved)
  for key, value in (overrides or {}).items():
    if not (key.startswith(OVERRIDABLE_PREFIXES) or key in OVERRIDABLE_KEYS):
      raise ConfigError(f"--config.{key} cannot be overridden at evaluation (it would not match "
                        f"the trained parameters); allowed: eval.*, {', '.join(sorted(OVERRIDABLE_KEYS))}")
    try:
      cd.update_from_flattened_dict({key: value})
    except (KeyError, AttributeError, TypeError) as e:
      raise ConfigError(f"--config.{key}={value!r}: {_first_line(e)}") from None
  return from_configdict(cd)


def resolve_step(checkpointer: Any, step: int | str | None) -> int:
  """None/'latest' -> the newest step, 'best' -> the best by checkpoint.keep_best_by, int -> it."""
  if isinstance(step, str) and step not in STEP_NAMES:
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


def _dummy_batch(cfg: Config) -> dict[str, np.ndarray]:
  """A one-row batch with the right features; parameter shapes never depend on its length."""
  ones = np.ones((1, 4), np.int32)
  return dict(inputs=ones, targets=ones) if cfg.model.arch == "encoder_decoder" else dict(targets=ones)


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
  """The saved train state of `step` as nested dicts, on the first local device.

  The target structure comes from the checkpoint's own metadata, not from today's optimizer code,
  so a run restores for evaluation even if the optimizer state layout has changed since.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
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
  from transformer import training  # pylint: disable=g-import-not-at-top
  expected = jax.eval_shape(lambda r: training.init_params(cfg, model, r, _dummy_batch(cfg)),
                            jax.random.key(0))
  flat = lambda tree: {jax.tree_util.keystr(k): tuple(v.shape)  # noqa: E731
                       for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  want, got = flat(expected), flat(params)
  for key in sorted(set(want) | set(got)):
    if want.get(key) != got.get(key):
      raise EvaluationError(f"{where}: parameter {key} has shape {got.get(key)} but the config in "
                            f"config.json builds {want.get(key)}")


def restore_params(cfg: Config, workdir: str, step: int | str | None = None) -> tuple[Any, int]:
  """(params, step) of a checkpoint in `workdir`, restored read-only onto the first local device."""
  from transformer import checkpoints  # pylint: disable=g-import-not-at-top
  from transformer.models import build_model  # pylint: disable=g-import-not-at-top
  if not files.isdir(os.path.join(workdir, "checkpoints")):
    raise EvaluationError(f"no checkpoints in {workdir}: has the run saved one yet?")
  with _quiet_orbax():
    ckpt = checkpoints.Checkpointer(workdir, cfg.checkpoint, read_only=True)
  try:
    step = resolve_step(ckpt, step)
    directory, available = ckpt.directory, ckpt.all_steps()
  finally:
    ckpt.close()
  try:
    params = _read_state(directory, step)["params"]
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
    others = [s for s in available if s != step]
    hint = f"; other steps: {others} (--step=N)" if others else ""
    raise EvaluationError(f"cannot read the checkpoint {directory}/{step} (truncated or not a "
                          f"train state?): {type(e).__name__}: {_first_line(e)}{hint}") from None
  _check_params(cfg, build_model(cfg.model), params, f"{directory}/{step}")
  return params, step


def init_from_config(cfg: Config, init_from: str) -> Config:
  """`cfg` with the model section and tokenizer keys of the run in `init_from` (fine-tuning);
  FINETUNE_MODEL_KEYS keep `cfg`'s values. Raises ConfigError naming --init_from."""
  try:
    run = load_config(init_from)
  except EvaluationError as e:
    raise ConfigError(f"--init_from={init_from}: {e}") from None
  model = dataclasses.replace(run.model, **{k: getattr(cfg.model, k) for k in FINETUNE_MODEL_KEYS})
  data = dataclasses.replace(cfg.data, **{k: getattr(run.data, k) for k in _TOKENIZER_KEYS})
  merged = dataclasses.replace(cfg, model=model, data=data)
  try:
    return from_configdict(dataclasses.asdict(merged))  # e.g. data lengths against model.max_len
  except ConfigError as e:
    raise ConfigError(f"--init_from={init_from}: {e}") from None


def init_params(init_from: str) -> Any:
  """The latest parameters of the run in `init_from` (fine-tuning); ConfigError if unreadable."""
  try:
    return restore_params(load_config(init_from), init_from)[0]
  except EvaluationError as e:
    raise ConfigError(f"--init_from={init_from}: {e}") from None
