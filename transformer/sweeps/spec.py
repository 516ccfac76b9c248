"""Sweeps: a sweep file's override dicts -> validated, named points -> commands (local or TPU VM).

A sweep file (configs/sweeps/*.py) has `get_sweep()` return override dicts keyed like
`--config.*`. No JAX here: planning, dry runs and TPU commands are instant. A point's choice of a
component (model.ffn, train.optimizer, ...) is checked as every key is (transformer/choices.py).
"""

import copy
import dataclasses
import difflib
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import shlex
import sys
import traceback
from typing import Any, Mapping, Sequence

import ml_collections

from transformer.config import ConfigError, from_configdict
from transformer.keyspec import flat_items
from transformer.run import guard
from transformer.schema import get_config

# Short labels of common keys in workdir names and table columns (others: the key's last part).
SHORT_LABELS = {
    "train.learning_rate": "lr", "train.warmup_steps": "warmup", "train.label_smoothing": "ls",
    "model.dropout_rate": "dropout", "model.num_encoder_layers": "enc_layers",
    "model.num_decoder_layers": "dec_layers", "train.scheduled_sampling.schedule": "ss",
    "train.scheduled_sampling.k": "ss_k", "train.scheduled_sampling.c": "ss_c",
    "train.scheduled_sampling.min_teacher_forcing": "ss_min"}
# The files a sweep writes at its workdir's root (through the guard: never over a user's file).
WRITTEN = ("sweep.json", "results.csv", "results.md", "results.png", "curves.png")
MAX_NAME_LEN = 80  # longer names are cut and end in a hash of the overrides


class SweepError(ValueError):
  """A bad sweep file or sweep flag; the message is one line naming the file or key."""


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of a sweep."""
  index: int
  overrides: dict[str, Any]  # the sweep's keys of this run, in the file's order
  name: str  # filesystem-safe, unique within the sweep
  workdir: str
  num_steps: int  # train.num_steps of the validated config (a run is finished at this step)


def raised_in(error: BaseException, path: str) -> str:
  """'sweep file PATH:LINE: Type: message' of an exception raised by running file `path`."""
  lines = [line for frame, line in traceback.walk_tb(error.__traceback__)
           if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(path)]
  where = f"{path}:{lines[-1]}" if lines else path
  message = (str(error).strip().splitlines() or [""])[0]
  return f"sweep file {where}: {type(error).__name__}: {message}"


def load_sweep(path: str, config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """The override dicts of a sweep file's `get_sweep()` (or `get_sweep(config)`)."""
  if not os.path.isfile(path):
    raise SweepError(f"sweep file {path} " + ("is not a file" if os.path.exists(path) else
                                              "not found"))
  name = "_sweep_" + re.sub(r"\W", "_", os.path.abspath(path))
  # Python source whatever its name ends in (spec_from_file_location knows .py files only).
  spec = importlib.util.spec_from_loader(name, importlib.machinery.SourceFileLoader(name, path))
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:  # one line naming the file and line, not an import traceback
    where = f"{path}:{e.lineno}" if e.lineno else path  # none for null bytes
    raise SweepError(f"sweep file {where}: SyntaxError: {e.msg}") from None
  except Exception as e:  # pylint: disable=broad-except  (a user's file raises anything)
    raise SweepError(raised_in(e, path)) from None
  fn = getattr(module, "get_sweep", None)
  if not callable(fn):
    raise SweepError(f"{path}: defines no get_sweep() function")
  args = (copy.deepcopy(config),) if inspect.signature(fn).parameters else ()
  try:
    points = fn(*args)
  except Exception as e:  # pylint: disable=broad-except  (a user's file raises anything)
    raise SweepError(raised_in(e, path)) from None
  if (isinstance(points, Mapping) or not isinstance(points, Sequence) or not points
      or not all(isinstance(p, Mapping) for p in points)):
    raise SweepError(f"{path}: get_sweep() must return a non-empty list of override dicts")
  return [dict(p) for p in points]


def check_keys(points: Sequence[Mapping[str, Any]], config: ml_collections.ConfigDict,
               sweep_path: str, config_arg: str) -> None:
  """Raises SweepError unless every key is in base.py and the config, every value a scalar."""
  known, chosen = flat_items(get_config()), flat_items(config)
  for i, point in enumerate(points):
    for key, value in point.items():
      if key not in known:
        close = difflib.get_close_matches(str(key), list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SweepError(f"{sweep_path}: unknown override key {key!r} in point {i} "
                         f"(not in configs/base.py){hint}")
      if key not in chosen:
        raise SweepError(f"{sweep_path}: override key {key!r} is not in the config {config_arg}")
      if not isinstance(value, (str, int, float, bool)):
        raise SweepError(f"{sweep_path}: {key}={value!r} in point {i}: a value must be a str, "
                         "int, float or bool")


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted-key overrides set (ConfigDict checks the types)."""
  cd = copy.deepcopy(config)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = cd
    for part in parents:
      node = node[part]
    try:
      node[leaf] = value
    except (TypeError, ValueError, KeyError, AttributeError) as e:
      current = node.get(leaf) if isinstance(node, ml_collections.ConfigDict) else None
      if current is not None and not isinstance(value, type(current)):
        raise ConfigError(f"{key}={value!r} is of type {type(value).__name__}; the key takes "
                          f"{type(current).__name__}") from None
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ConfigError(f"{key}={value!r}: {first}") from None
  return cd


def format_value(value: Any) -> str:
  """A value as `--config.key=` text (and in names): floats by repr, bools lower-case."""
  if isinstance(value, bool):
    return str(value).lower()
  return repr(value) if isinstance(value, float) else str(value)


def labels(points: Sequence[Mapping[str, Any]]) -> dict[str, str]:
  """Short label per swept key: SHORT_LABELS or its last part; the full key if two would clash."""
  keys = list(dict.fromkeys(k for p in points for k in p))
  short = [SHORT_LABELS.get(k, k.rsplit(".", 1)[-1]) for k in keys]
  return {k: (s if short.count(s) == 1 else k) for k, s in zip(keys, short)}


def _digest(overrides: Mapping[str, Any]) -> str:
  text = json.dumps(overrides, sort_keys=True, default=str)
  return hashlib.sha1(text.encode()).hexdigest()[:8]


def point_names(points: Sequence[Mapping[str, Any]]) -> list[str]:
  """Readable, filesystem-safe, unique names: 'positional=rope,lr=0.0003' (empty -> 'baseline')."""
  label = labels(points)
  names = []
  for overrides in points:
    name = ",".join(f"{label[k]}={format_value(v)}" for k, v in overrides.items()) or "baseline"
    name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", name)
    if len(name) > MAX_NAME_LEN:
      name = f"{name[:MAX_NAME_LEN - 9]}-{_digest(overrides)}"
    names.append(name)
  for i, name in enumerate(names):
    if names.count(name) > 1:  # only if sanitising or cutting made two names equal
      names[i] = f"{name}-{_digest(points[i])}"
  return names


def check_workdir(workdir: str) -> None:
  """Raises SweepError (one line) unless a sweep may write `workdir`: a directory (or none yet)
  outside every run whose WRITTEN files, where they exist, are the ones a sweep wrote there (or
  a sweep's workdir from before they were recorded)."""
  if not workdir.strip():
    raise SweepError(f"--workdir={workdir!r} is empty: name a directory for the sweep's points")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise SweepError(f"--workdir={workdir} is a file, not a directory: name a directory for the "
                     "sweep's points")
  try:  # a sweep owns no run: never inside one
    guard.check(workdir, "--workdir", () if _unrecorded_sweep(workdir) else WRITTEN,
                hint=", or move the files named aside")
  except guard.WriteRefused as e:
    raise SweepError(str(e)) from None


def _unrecorded_sweep(workdir: str) -> bool:
  """True for the workdir of a sweep that recorded none of its files (one run before they went
  through the guard): no guard.RECORD, and a sweep.json that is a sweep's manifest."""
  if os.path.exists(os.path.join(workdir, guard.RECORD)):
    return False
  try:
    with open(os.path.join(workdir, "sweep.json")) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return False
  return isinstance(manifest, dict) and isinstance(manifest.get("points"), list) and (
      {"config", "sweep", "base_overrides"} <= set(manifest))


def plan(config: ml_collections.ConfigDict, config_arg: str, sweep_path: str,
         workdir: str) -> list[Point]:
  """Loads, checks and names a sweep's points; raises SweepError or ConfigError (one line)."""
  check_workdir(workdir)
  overrides = load_sweep(sweep_path, config)
  check_keys(overrides, config, sweep_path, config_arg)
  seen: dict[str, int] = {}
  for i, point in enumerate(overrides):
    first = seen.setdefault(json.dumps(point, sort_keys=True, default=str), i)
    if first != i:
      raise SweepError(f"{sweep_path}: points {first} and {i} are the same run {point}")
  points = []
  for i, (point, name) in enumerate(zip(overrides, point_names(overrides))):
    try:
      cfg = from_configdict(apply_overrides(config, point))
    except ConfigError as e:
      raise ConfigError(f"{sweep_path}: point {i} ({name}): {e}") from None
    points.append(Point(i, point, name, os.path.join(workdir, name), cfg.train.num_steps))
  return points


_MISSING = object()  # a key a run's config.json does not hold


def _same_value(a: Any, b: Any) -> bool:
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
  if number(a) and number(b):
    return float(a) == float(b)
  return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def differing_key(run_config: Mapping[str, Any], overrides: Mapping[str, Any]
                  ) -> tuple[str, Any] | None:
  """(key, the run's value) of the first of `overrides` that a run's config.json (nested, as
  train.py writes it) holds with another value; None if it holds them all (or lacks the key)."""
  for key, value in overrides.items():
    ran: Any = run_config
    for part in key.split("."):
      ran = ran.get(part, _MISSING) if isinstance(ran, Mapping) else _MISSING
    if ran is not _MISSING and not _same_value(ran, value):
      return key, ran
  return None


@dataclasses.dataclass(frozen=True)
class Commands:
  """How a point becomes processes: `train.py` with its overrides, then `eval.py` on a split."""
  config_arg: str  # e.g. 'configs/g2p.py:small'
  base_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # all points
  python: str = sys.executable
  train_script: str = "train.py"
  eval_script: str = "eval.py"  # not run when it does not exist (or eval_split is '')
  eval_split: str = "test"
  cwd: str | None = None  # the processes' working directory (None = this one)

  def overrides(self, point: Point) -> dict[str, Any]:
    """The point's full override set; its own keys win over the sweep-wide ones."""
    return {**self.base_overrides, **point.overrides}

  def train(self, point: Point, workdir: str | None = None, python: str | None = None,
            extra: Mapping[str, Any] | None = None) -> list[str]:
    """The argv that trains `point` (in `workdir`, default the point's own)."""
    flags = [f"--config.{k}={format_value(v)}" for k, v in {**self.overrides(point),
                                                             **(extra or {})}.items()]
    return [python or self.python, self.train_script, f"--config={self.config_arg}",
            f"--workdir={workdir or point.workdir}", *flags]

  def eval(self, point: Point, workdir: str | None = None, python: str | None = None) -> list[str]:
    """The argv that evaluates `point` on eval_split."""
    return [python or self.python, self.eval_script, f"--workdir={workdir or point.workdir}",
            f"--split={self.eval_split}"]

  def has_eval(self) -> bool:
    return bool(self.eval_split) and os.path.isfile(
        os.path.join(self.cwd or os.getcwd(), self.eval_script))


def tpu_vm_command(point: Point, commands: Commands, tpu_name: str, zone: str, bucket: str,
                   remote_dir: str = "~/transformer", python: str = "python3",
                   project: str = "") -> tuple[list[str], str]:
  """(argv, printable line) of one gcloud ssh that trains and evaluates `point` on every worker,
  unless `runner is_done`: workdir `<bucket>/<local workdir>`, data.data_dir
  `<bucket>/tensorflow_datasets` unless set; `remote_dir` unquoted, so that `~` expands there."""
  if not bucket.startswith("gs://"):
    raise SweepError(f"--bucket={bucket!r} must be a gs:// path")
  bucket = bucket.rstrip("/")
  local = re.sub(r"^(\.\./)+", "", os.path.normpath(point.workdir).lstrip("/"))
  workdir = f"{bucket}/{local}"
  extra = {} if "data.data_dir" in commands.overrides(point) else {
      "data.data_dir": f"{bucket}/tensorflow_datasets"}
  parts = [shlex.join(commands.train(point, workdir, python, extra))]
  check = [python, "-m", "transformer.sweeps.runner", "is_done", workdir,
           f"--num_steps={point.num_steps}"]
  if commands.eval_split:
    parts.append(shlex.join(commands.eval(point, workdir, python)))
    check.append(f"--split={commands.eval_split}")
  remote = f"cd {remote_dir} && if ! {shlex.join(check)}; then {' && '.join(parts)}; fi"
  argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu_name, f"--zone={zone}",
          *([f"--project={project}"] if project else []), "--worker=all"]
  quoted = '"' + re.sub(r'(["\\$`])', r"\\\1", remote) + '"'  # for a POSIX shell
  return argv + [f"--command={remote}"], f"{shlex.join(argv)} --command={quoted}"
