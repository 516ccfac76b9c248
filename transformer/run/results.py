"""What workdirs hold, read back for comparing runs: each run's flat config, provenance.json,
metrics.jsonl, train_done.json and eval.py's metrics.<split>.json (`read_run`), the workdirs that
paths and globs name (`expand`), and the numbers of one run that compare's and the sweep report's
tables show: steps, tokens, wall clock, tokens/s, the last in-training evaluation, the best value
kept by, eval.py's metrics."""

import dataclasses
import glob
import json
import math
import os
import re
import statistics
from typing import Any, Iterable, Mapping, Sequence

from absl import logging

from transformer import files
from transformer.run import metrics_log
from transformer.run.table import is_number

_METRICS_FILE = re.compile(r"^metrics\.(.+)\.json$")


class WorkdirError(ValueError):
  """A path that is not a workdir, or a workdir whose config.json does not read; one line."""


@dataclasses.dataclass
class RunFiles:
  """What a workdir holds: its flat config ({} without config.json), provenance.json,
  metrics.jsonl records, train_done.json and eval.py's metrics.<split>.json by split."""
  path: str
  config: dict[str, Any]
  provenance: dict[str, Any] | None
  logged: list[dict[str, Any]]
  done: dict[str, Any] | None
  evaluated: dict[str, dict[str, Any]]

  @property
  def steps(self) -> int | None:
    """The final step (train_done.json's), else the last step logged, else None."""
    if isinstance(self.done, dict) and isinstance(self.done.get("step"), int):
      return self.done["step"]
    return max((r["step"] for r in self.logged if isinstance(r.get("step"), int)), default=None)


def read_logged(workdir: str) -> list[dict[str, Any]]:
  """The rows of `<workdir>/metrics.jsonl` ([] without one; metrics_log.read: lines that hold no
  row named in one warning and skipped, NaN kept)."""
  return metrics_log.read(os.path.join(workdir, metrics_log.FILE))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{'model': {'d_model': 64}} -> {'model.d_model': 64}."""
  out = {}
  for name, value in tree.items():
    if isinstance(value, Mapping):
      out |= flatten(value, f"{prefix}{name}.")
    else:
      out[f"{prefix}{name}"] = value
  return out


def _read_json(path: str, strict: bool) -> Any:
  """A JSON file's content; None if missing (or, unless `strict`, unreadable)."""
  if not files.exists(path):
    return None
  try:
    return json.loads(files.read_text(path))
  except (OSError, ValueError) as e:
    if strict:
      raise WorkdirError(f"{path}: not a JSON file ({str(e).splitlines()[0][:200]})") from None
    return None


def is_workdir(path: str) -> bool:
  """Whether `path` holds a run's config.json."""
  return files.exists(os.path.join(path, "config.json"))


def read_run(workdir: str, strict: bool = True) -> RunFiles:
  """The files of the run in `workdir`; `strict`: a workdir without a config.json that reads is a
  WorkdirError (else an empty config, for a run not started yet)."""
  config = _read_json(os.path.join(workdir, "config.json"), strict)
  if strict and not isinstance(config, dict):
    raise WorkdirError(f"{workdir} is not a workdir (no config.json)" if config is None else
                       f"{workdir}/config.json: not a run's config")
  evaluated = {}
  if files.isdir(workdir):
    for name in files.listdir(workdir):
      if not (found := _METRICS_FILE.match(name)):
        continue
      if isinstance(metrics := _read_json(path := os.path.join(workdir, name), False), dict):
        evaluated[found.group(1)] = metrics
      else:
        logging.warning("%s: not a JSON object of eval.py's metrics; skipped", path)
  prov = _read_json(os.path.join(workdir, "provenance.json"), False)
  done = _read_json(os.path.join(workdir, "train_done.json"), False)
  return RunFiles(workdir, flatten(config) if isinstance(config, dict) else {},
                  prov if isinstance(prov, dict) else None, read_logged(workdir),
                  done if isinstance(done, dict) else None, evaluated)


def _members(path: str) -> list[str]:
  """The workdirs directly under `path` (a train.members run's members), sorted."""
  if not files.isdir(path):
    return []
  return [os.path.join(path, n) for n in files.listdir(path) if is_workdir(os.path.join(path, n))]


def expand(paths_or_globs: Iterable[str]) -> list[str]:
  """The workdirs named: each path (a workdir, or a members run: its members) or glob (the
  workdirs it matches), in order, each once; raises WorkdirError naming one that names none."""
  out: list[str] = []
  for arg in paths_or_globs:
    if any(c in arg for c in "*?["):
      found = [w for m in sorted(glob.glob(arg)) for w in ([m] if is_workdir(m) else _members(m))]
      if not found:
        raise WorkdirError(f"{arg} matches no workdir (a directory with config.json)")
    elif is_workdir(arg):
      found = [arg]
    elif not (found := _members(arg)):
      if not files.exists(arg):
        raise WorkdirError(f"{arg} is not a workdir: no such directory")
      if not files.isdir(arg):
        raise WorkdirError(f"{arg} is a file, not a workdir (a directory with config.json); "
                           "quote a glob ('dir/*') to keep only its workdirs")
      raise WorkdirError(f"{arg} is not a workdir (no config.json)")
    seen = {os.path.realpath(p) for p in out}
    out += [p for p in found if os.path.realpath(p) not in seen]
  if not out:
    raise WorkdirError("no workdirs given: name one or more (or a quoted glob)")
  return out


def sort_metrics(names: Iterable[str]) -> list[str]:
  """loss, accuracy, perplexity first, then the rest by name."""
  first = ("loss", "accuracy", "perplexity")
  return sorted(names, key=lambda k: (first.index(k) if k in first else len(first), k))


def last_eval(logged: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """dev/<name> of each eval/<name> of the last in-training evaluation logged."""
  evals = [r for r in logged if any(k.startswith("eval/") for k in r)]
  if not evals:
    return {}
  dev = {k[len("eval/"):]: v for k, v in evals[-1].items() if k.startswith("eval/")}
  return {f"dev/{k}": dev[k] for k in sort_metrics(dev)}


def split_metrics(run: RunFiles, split: str | None = None) -> dict[str, Any]:
  """<split>/<name> of the numbers in eval.py's metrics.<split>.json (every split's if None)."""
  out = {}
  for name in [split] if split else sorted(run.evaluated):
    metrics = run.evaluated.get(name, {})
    numbers = [k for k, v in metrics.items() if k != "step" and is_number(v)]
    out |= {f"{name}/{k}": metrics[k] for k in sort_metrics(numbers)}
  return out


def median_rate(logged: Sequence[Mapping[str, Any]]) -> float | None:
  """The median perf/tokens_per_sec of the logged windows after the first (which compiles)."""
  rates = [r["perf/tokens_per_sec"] for r in logged
           if metrics_log.is_finite(r.get("perf/tokens_per_sec"))]
  return statistics.median(rates[1:] or rates) if rates else None


def tokens_seen(logged: Sequence[Mapping[str, Any]]) -> float | None:
  """Training tokens without padding (all tokens where that rate is not logged): each logged
  window's tokens per step (its rates' ratio) times the steps since the previous one; None where
  no rates were logged."""
  total, previous, found = 0.0, 0, False
  for r in logged:
    tokens = r.get("perf/nonpad_tokens_per_sec", r.get("perf/tokens_per_sec"))
    rate = r.get("perf/steps_per_sec")
    if (metrics_log.is_finite(tokens) and metrics_log.is_finite(rate) and rate > 0
        and is_number(r.get("step"))):
      total += tokens / rate * (r["step"] - previous)
      previous, found = r["step"], True
  return total if found else None


def wall_seconds(run: RunFiles) -> float | None:
  """train_done.json's wall_seconds, else the last time/elapsed_s logged."""
  if run.done and is_number(run.done.get("wall_seconds")):
    return run.done["wall_seconds"]
  elapsed = [r["time/elapsed_s"] for r in run.logged
             if metrics_log.is_finite(r.get("time/elapsed_s"))]
  return elapsed[-1] if elapsed else None


def _dev_name(metric: str) -> str:
  return "dev/" + metric[len("eval/"):] if metric.startswith("eval/") else metric


def best_eval(run: RunFiles) -> dict[str, Any]:
  """'best <metric>' and 'best step': the best logged value of checkpoint.keep_best_by (by
  checkpoint.best_mode), the metric the run kept its best checkpoint by; {} if never logged. A
  NaN is never the best (the first one is, if no value is finite)."""
  metric = run.config.get("checkpoint.keep_best_by") or ""
  logged = [(r[metric], r["step"]) for r in run.logged if is_number(r.get(metric)) and "step" in r]
  if not metric or not logged:
    return {}
  if not (finite := [vs for vs in logged if not math.isnan(vs[0])]):
    return {f"best {_dev_name(metric)}": logged[0][0], "best step": logged[0][1]}
  logged = finite
  better = max if run.config.get("checkpoint.best_mode") == "max" else min
  value, step = better(logged, key=lambda vs: vs[0])
  return {f"best {_dev_name(metric)}": value, "best step": step}
