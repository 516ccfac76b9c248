"""Running lm-evaluation-harness tasks on a run: `evaluate_workdir` (eval.py --harness_tasks) and
`training_metrics` (train.py's eval.harness_tasks), both through `run_tasks`.

Tasks are found by name in --harness_include_path's YAML files first, then among the harness's
own; a task's relative `data_files` are read from its YAML file's directory, so a task whose data
is on disk (`dataset_path: json`) runs offline. Results: the harness's JSON in
`metrics.harness.json` (flat `<task>/<metric>` numbers first, which `compare` shows as
`harness/<task>/<metric>` columns, the step, the settings, then the harness's own `results`,
`n-shot`, `versions`, `configs`).
"""

import difflib
import json
import logging
import os
from typing import Any, Sequence

from lm_eval import evaluator
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml

from transformer import files
from transformer.infer.harness.lm import RunLM
from transformer.run import guard
from transformer.run.provenance import CONVERTED_FROM
from transformer.run.restore import EvaluationError

RESULTS_FILE = "metrics.harness.json"  # beside eval.py's metrics.<split>.json
BOOTSTRAP_ITERS = 1000  # eval.py's standard errors (the harness's default, 100,000, takes minutes)
_NETWORK_WORDS = ("offline", "connect", "resolve", "internet", "hub", "couldn't reach", "timed out")


def lm_of(run: Any, batch_tokens: int = 4096) -> RunLM:
  """The harness LM of a restored `Run` (transformer.restore), a converted model's with its
  config.json (converted_from.json) for the Hugging Face tokenizer's special ids."""
  return RunLM(run.config, run.model, run.params, run.source_tokenizer, run.target_tokenizer,
               hf=converted_from(run.workdir), kind=run.kind, batch_tokens=batch_tokens)


def converted_from(workdir: str) -> dict[str, Any] | None:
  """The Hugging Face config.json a converted workdir came from, None for a run of ours."""
  source = os.path.join(workdir, CONVERTED_FROM)
  return json.loads(files.read_text(source))["config"] if files.exists(source) else None


def _manager(names: Sequence[str], include_path: str, standard_tasks: bool) -> TaskManager:
  """A TaskManager that knows `names`: --harness_include_path's alone when it has them all (the
  harness's own index takes half a minute to build), else with the harness's tasks."""
  if include_path and not files.isdir(include_path):
    raise EvaluationError(f"--harness_include_path={include_path}: no such directory")
  if include_path:
    manager = TaskManager(include_path=include_path, include_defaults=False)
    if all(n in manager.all_tasks for n in names) or not standard_tasks:
      return manager
  return TaskManager(include_path=include_path or None, include_defaults=standard_tasks)


def _spec(manager: TaskManager, name: str) -> Any:
  """The task's config (relative data_files made absolute, from its YAML's directory), or the
  name itself for a group, a tag or a Python task."""
  entry = manager.task_index[name]
  if entry.yaml_path is None or entry.kind.name != "TASK":
    return name
  cfg = load_yaml(entry.yaml_path, resolve_func=True)
  data_files = (cfg.get("dataset_kwargs") or {}).get("data_files")
  here = os.path.dirname(os.path.abspath(entry.yaml_path))
  absolute = lambda p: p if "://" in p or os.path.isabs(p) else os.path.join(here, p)  # noqa: E731
  if isinstance(data_files, str):
    cfg["dataset_kwargs"]["data_files"] = absolute(data_files)
  elif isinstance(data_files, dict):
    cfg["dataset_kwargs"]["data_files"] = {
        k: absolute(v) if isinstance(v, str) else [absolute(p) for p in v]
        for k, v in data_files.items()}
  cfg.pop("include", None)
  return cfg


def load_tasks(names: Sequence[str], include_path: str = "", standard_tasks: bool = True
               ) -> tuple[TaskManager, list[Any]]:
  """(the manager, the loaded task objects) of `names`; an unknown name (with the nearest ones)
  or a task whose data cannot be read (offline: needs the Hub) is a one-line EvaluationError."""
  manager = _manager(names, include_path, standard_tasks)
  loaded = []
  for name in names:
    if name not in manager.all_tasks:
      near = difflib.get_close_matches(name, manager.all_tasks, n=3, cutoff=0.6)
      raise EvaluationError(f"--harness_tasks: unknown task {name!r}" + (
          f" (nearest: {', '.join(near)})" if near else "") + (
          f"; tasks found in {include_path} and the harness's" if include_path else ""))
    try:
      loaded.append(manager.load(_spec(manager, name)))
    except Exception as e:  # pylint: disable=broad-except  (datasets' and the Hub's many errors)
      raise EvaluationError(_load_error(manager, name, e)) from None
  return manager, loaded


def _load_error(manager: TaskManager, name: str, error: Exception) -> str:
  """One line on why task `name`'s data could not be read."""
  cfg = manager.task_index[name].cfg or {}
  first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
  if any(w in f"{type(error).__name__} {first}".lower() for w in _NETWORK_WORDS):
    offline = "1" in (os.environ.get("HF_DATASETS_OFFLINE"), os.environ.get("HF_HUB_OFFLINE"))
    return (f"task {name!r} needs its data set {cfg.get('dataset_path')!r} from the Hugging Face "
            f"Hub, which cannot be reached{' offline (HF_DATASETS_OFFLINE=1)' if offline else ''}: "
            "download it once online, or point HF_DATASETS_CACHE at a cache that holds it "
            "(docs/evaluation.md)")
  return f"task {name!r}: its data could not be read: {type(error).__name__}: {first}"


def run_tasks(lm: RunLM, names: Sequence[str], num_fewshot: int | None = None,
              limit: int | None = None, include_path: str = "", standard_tasks: bool = True,
              log_samples: bool = False, bootstrap_iters: int = 0) -> dict[str, Any]:
  """The harness's results dict (simple_evaluate's) of `names` on `lm`; standard errors from
  `bootstrap_iters` resamples (0: none)."""
  if not names:
    raise EvaluationError("--harness_tasks: give one or more task names")
  manager, loaded = load_tasks(names, include_path, standard_tasks)
  for name in ("lm_eval", "datasets"):  # the harness's per-task warnings, not its errors
    logging.getLogger(name).setLevel(logging.ERROR)
  tasks = []
  for item in loaded:
    tasks += list(item["tasks"].values()) if not item.get("groups") else [
        *item["groups"].values()]
  results = evaluator.simple_evaluate(
      lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit or None, task_manager=manager,
      log_samples=log_samples, bootstrap_iters=bootstrap_iters, verbosity=None)
  return results


def flat_metrics(results: dict[str, Any]) -> dict[str, float]:
  """`<task>/<metric>` of every number in the harness's results (filter 'none' left out)."""
  out = {}
  for task, metrics in results.get("results", {}).items():
    for key, value in metrics.items():
      metric, _, filt = key.partition(",")
      if isinstance(value, (int, float)) and not isinstance(value, bool) and not metric.endswith(
          "_stderr") and metric != "sample_len":
        out[f"{task}/{metric}" + (f"_{filt}" if filt not in ("", "none") else "")] = float(value)
  return out


def evaluate_workdir(workdir: str, tasks: Sequence[str], num_fewshot: int | None = None,
                     limit: int = 0, include_path: str = "", step: int | str | None = None,
                     params: str = "auto", average_last: int = 0, ensemble: Sequence[str] = (),
                     out_dir: str | None = None, verbose: bool = True) -> dict[str, Any]:
  """Runs harness `tasks` on a checkpoint of `workdir` (and `ensemble`'s runs: one model), writes
  metrics.harness.json in `out_dir` (default: the workdir) and returns what it wrote."""
  from transformer.infer import api  # pylint: disable=g-import-not-at-top  (TFDS, the tasks)
  if ensemble and not out_dir:
    raise EvaluationError("an ensemble's harness results need their own directory: give --out")
  try:  # the run's own workdir, or a directory outside every run, never over a user's file
    guard.check(out_dir or workdir, "--out", [RESULTS_FILE], own=None if ensemble else workdir)
  except guard.WriteRefused as e:
    raise EvaluationError(str(e)) from None
  run = api.restore([workdir, *ensemble] if ensemble else workdir, step=step, params=params,
                    average_last=average_last)
  files.check_writable(out_dir or workdir)
  results = run_tasks(lm_of(run), list(tasks), num_fewshot, limit, include_path,
                      bootstrap_iters=BOOTSTRAP_ITERS)
  written = flat_metrics(results) | {
      "step": run.step if not ensemble else list(run.step), "params": run.params_source,
      "settings": {"tasks": list(tasks), "num_fewshot": num_fewshot, "limit": limit or None,
                   "ensemble": list(ensemble)},
      **{k: results[k] for k in ("results", "groups", "n-shot", "versions", "configs")
         if k in results}}
  guard.write_bytes(out_dir or workdir, RESULTS_FILE,
                    json.dumps(written, indent=1, default=str).encode("utf-8"))
  path = os.path.join(out_dir or workdir, RESULTS_FILE)
  if verbose:
    from lm_eval.utils import make_table  # pylint: disable=g-import-not-at-top
    print(make_table(results))
    print(f"wrote {path}")
  return written


def training_metrics(cfg: Any, model: Any, params: Any, task: Any, workdir: str, step: int
                     ) -> dict[str, float]:
  """eval/harness/<task>/<metric> of eval.harness_tasks on the parameters being trained, at an
  evaluation of theirs (eval.harness_every_steps; the last step's); else {}."""
  every = cfg.eval.harness_every_steps
  if every and step % every and step != cfg.train.num_steps:
    return {}
  names = [n.strip() for n in cfg.eval.harness_tasks.split(",") if n.strip()]
  lm = RunLM(cfg, model, params, task.source_tokenizer, task.target_tokenizer,
             hf=converted_from(workdir), kind=getattr(task, "kind", "seq2seq"))
  results = run_tasks(lm, names, limit=cfg.eval.harness_limit or None,
                      include_path=cfg.eval.harness_include_path)
  return {f"eval/harness/{k}": v for k, v in flat_metrics(results).items()}
