r"""Runs side by side: the config keys that differ, steps, tokens, wall clock and the metrics, with
a warning wherever the comparison is not like for like.

  python -m transformer.infer.compare runs/g2p_tiny runs/g2p_tiny_rope [--split=test] \
      [--plot=runs/curves.png]
  python -m transformer.infer.compare 'runs/sweep_norm/*'     # a quoted glob: its workdirs

Each argument is a workdir, a glob of workdirs, or a `train.members` run's workdir (its members).
One row per run: the keys of config.json that differ between the runs, steps, tokens (training
tokens without padding, from the logged rates), wall clock, tokens/s, the last train/loss, dev/*
(the last in-training evaluation, on data.eval_split), the best value of the run's
checkpoint.keep_best_by and eval.py's metrics.<split>.json. Columns equal in every row are left
out, except results. Runs whose configs differ only in their seeds are one row: mean ± sample
standard deviation of each number, and n. Warnings name the runs whose steps, data, evaluation
split or evaluation set differ, and the unfinished ones. `--plot` overlays the learning curves.
The sweep report (transformer/sweeps/report.py) builds its table with these functions.
"""

import dataclasses
import glob
import io
import json
import math
import os
import re
import statistics
import sys
from typing import Any, Iterable, Mapping, Sequence

from absl import flags

from transformer import cli, files
from transformer.run import guard, metrics_log, provenance

# The keys of one seed of a run; runs that differ only in these are one group.
SEED_KEYS = ("seed", "data.shuffle_seed")
# Keys that cannot change a run's numbers (where files go, how often they are written, speed
# settings with the same results): runs differing only in these and their seeds are one group.
NO_EFFECT_KEYS = ("data.data_dir", "data.prefetch", "train.steps_per_dispatch",
                  "train.log_every_steps", "train.profile_start_step", "train.profile_num_steps",
                  "checkpoint.every_steps", "checkpoint.keep", "checkpoint.async_save",
                  "peak_flops")
# Keys that choose the examples a run trains and is evaluated on.
DATA_KEYS = ("data.dataset", "data.train_split", "data.source_key", "data.target_key",
             "data.train_file", "data.dev_file", "data.test_file", "data.text_file",
             "data.text_split", "data.train_fraction", "data.label_fraction", "data.label",
             "data.objective")
# Keys that choose how much of the evaluation split an in-training evaluation covers.
EVAL_SET_KEYS = ("eval.num_decode_examples", "eval.num_batches")
# Metrics that count what an evaluation covered: bookkeeping, not results.
COUNT_METRICS = ("decoded_examples", "scored_tokens", "split_examples", "split_tokens")
# Of the metrics logged during training, the ones shown (besides eval/*).
TRAIN_METRICS = ("train/loss",)
_METRICS_FILE = re.compile(r"^metrics\.(.+)\.json$")


class CompareError(ValueError):
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


@dataclasses.dataclass(frozen=True)
class Spread:
  """A number over the runs of a seed group: mean, sample standard deviation, min, max, n."""
  mean: float
  std: float
  min: float
  max: float
  n: int

  @classmethod
  def of(cls, values: Sequence[float]) -> "Spread":
    """The spread of `values` (std 0 for a single value); a NaN or an infinity among them is
    the mean (NaN, or that infinity), never averaged away, and the std is then NaN."""
    if not all(math.isfinite(v) for v in values):
      mean = math.fsum(values)  # NaN if any is, +-inf if an infinity is, NaN if both signs
      return cls(mean, math.nan, min(values), max(values), len(values))
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return cls(statistics.fmean(values), std, min(values), max(values), len(values))


@dataclasses.dataclass
class Comparison:
  """compare()'s answer: the runs, the differing config keys, one row per run and one per group
  (a seed group's numbers are Spreads), the columns shown, the warnings; `text()` prints it."""
  runs: list[RunFiles]
  keys: list[str]
  run_rows: list[dict[str, Any]]
  groups: list[list[int]]
  rows: list[dict[str, Any]]
  columns: list[str]
  warnings: list[str]

  def markdown(self) -> str:
    """The table, one row per run or seed group."""
    return markdown_table(self.rows, self.columns)

  def text(self) -> str:
    """The warnings (one line each), the table and, for seed groups, what ± means."""
    lines = [f"warning: {w}" for w in self.warnings]
    lines += [""] if lines else []
    lines.append(self.markdown().rstrip("\n"))
    if any(len(g) > 1 for g in self.groups):
      lines.append("\nA row of n > 1 runs (the same config but for the seed): mean ± sample "
                   "standard deviation.")
    return "\n".join(lines) + "\n"

  def plot(self, save_path: str | None = None) -> Any:
    """The learning curves overlaid (viz.plot_compared_curves: a seed group is its mean and
    range), one panel per metric logged by two rows or more; None where no metric is."""
    # matplotlib and Flax (viz's tables) load only for a plot: the table needs neither.
    from transformer.infer import viz  # pylint: disable=g-import-not-at-top
    curves = {_label(row): [self.runs[i].logged for i in group]
              for row, group in zip(self.rows, self.groups)}
    return viz.plot_compared_curves(curves, save_path=save_path)


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
      raise CompareError(f"{path}: not a JSON file ({str(e).splitlines()[0][:200]})") from None
    return None


def is_workdir(path: str) -> bool:
  """Whether `path` holds a run's config.json."""
  return files.exists(os.path.join(path, "config.json"))


def read_run(workdir: str, strict: bool = True) -> RunFiles:
  """The files of the run in `workdir`; `strict`: a workdir without a config.json that reads is a
  CompareError (else an empty config, for a run not started yet)."""
  config = _read_json(os.path.join(workdir, "config.json"), strict)
  if strict and not isinstance(config, dict):
    raise CompareError(f"{workdir} is not a workdir (no config.json)" if config is None else
                       f"{workdir}/config.json: not a run's config")
  evaluated = {}
  if files.isdir(workdir):
    for name in files.listdir(workdir):
      if (found := _METRICS_FILE.match(name)) and isinstance(
          metrics := _read_json(os.path.join(workdir, name), False), dict):
        evaluated[found.group(1)] = metrics
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
  workdirs it matches), in order, each once; raises CompareError naming one that names none."""
  out: list[str] = []
  for arg in paths_or_globs:
    if any(c in arg for c in "*?["):
      found = [w for m in sorted(glob.glob(arg)) for w in ([m] if is_workdir(m) else _members(m))]
      if not found:
        raise CompareError(f"{arg} matches no workdir (a directory with config.json)")
    elif is_workdir(arg):
      found = [arg]
    elif not (found := _members(arg)):
      hint = ("; quote a glob ('dir/*') to keep only its workdirs"
              if files.exists(arg) and not files.isdir(arg) else "")
      raise CompareError(f"{arg} is not a workdir (no config.json){hint}")
    seen = {os.path.realpath(p) for p in out}
    out += [p for p in found if os.path.realpath(p) not in seen]
  if not out:
    raise CompareError("no workdirs given: name one or more (or a quoted glob)")
  return out


def _same(values: Sequence[Any]) -> bool:
  """Whether `values` are all equal (compared as JSON text: a list equals its tuple)."""
  return len({json.dumps(v, sort_keys=True, default=str) for v in values}) <= 1


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
  """The keys (in first-seen order) whose values are not the same in every one of the flat
  `configs`; a key some lack differs."""
  keys = list(dict.fromkeys(k for c in configs for k in c))
  return [k for k in keys if not (all(k in c for c in configs) and _same([c[k] for c in configs]))]


def seed_groups(configs: Sequence[Mapping[str, Any]]) -> list[list[int]]:
  """The indices of `configs` grouped by all but SEED_KEYS and NO_EFFECT_KEYS, groups in the
  order of their first member."""
  groups: dict[str, list[int]] = {}
  for i, c in enumerate(configs):
    rest = {k: v for k, v in c.items() if k not in SEED_KEYS and k not in NO_EFFECT_KEYS}
    groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(i)
  return list(groups.values())


def is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_result(column: str) -> bool:
  """A metric column (dev/wer, test/loss, best dev/loss, ...), not a count of what it covered."""
  return "/" in column and column.rsplit("/", 1)[1] not in COUNT_METRICS


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


def run_row(run: RunFiles, keys: Sequence[str], split: str | None = None) -> dict[str, Any]:
  """One run's row: 'run', the `keys` of its config, then what it logged and evaluated."""
  row: dict[str, Any] = {"run": run.path} | {k: run.config.get(k) for k in keys}
  numbers = {"steps": run.steps, "tokens": tokens_seen(run.logged),
             "wall_seconds": wall_seconds(run), "tokens_per_sec": median_rate(run.logged)}
  for key in TRAIN_METRICS:
    numbers[key] = next((r[key] for r in reversed(run.logged) if is_number(r.get(key))), None)
  row |= {k: v for k, v in numbers.items() if v is not None}
  return row | last_eval(run.logged) | best_eval(run) | split_metrics(run, split)


def _label(row: Mapping[str, Any]) -> str:
  return str(row.get("run", row.get("point", "")))


def group_label(names: Sequence[str]) -> str:
  """runs/s/a, runs/s/b -> runs/s/{a,b}; names without one parent joined by ' + '."""
  if len(names) == 1:
    return names[0]
  parents = {os.path.dirname(n) for n in names}
  if len(parents) == 1:
    return os.path.join(parents.pop(), "{" + ",".join(os.path.basename(n) for n in names) + "}")
  return " + ".join(names)


def group_row(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], name: str = "run"
              ) -> dict[str, Any]:
  """One row for the `rows` of a seed group: its label (column `name`), n, each of the config
  `keys` (the values, comma-joined, where they differ: the seeds) and each number as a Spread."""
  out: dict[str, Any] = {name: group_label([str(r.get(name, "")) for r in rows]), "n": len(rows)}
  for column in dict.fromkeys(k for r in rows for k in r):
    if column == name:
      continue
    values = [r[column] for r in rows if r.get(column) is not None]
    if column not in keys and values and all(is_number(v) for v in values):
      out[column] = Spread.of(values)
    elif _same(values):
      out[column] = values[0] if values else None
    else:
      out[column] = ",".join(str(v) for v in dict.fromkeys(values))
  return out


def shown_columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                  keep: Sequence[str] = ()) -> list[str]:
  """`columns` less those whose cells are the same in every row (of two or more), except `keep`
  and results (is_result): a result the runs share is still their result."""
  if len(rows) < 2:
    return list(columns)
  return [c for c in columns if c in keep or is_result(c)
          or len({format_cell(c, r.get(c)) for r in rows}) > 1]


def _column_order(columns: Sequence[str], keys: Sequence[str]) -> list[str]:
  """run, n, the config keys, steps ... tokens/s, train metrics, dev/*, best, eval.py splits."""
  fixed = ["run", "n", *keys, "steps", "tokens", "wall_seconds", "tokens_per_sec",
           *TRAIN_METRICS]

  def rank(c: str) -> int:
    if c in fixed:
      return fixed.index(c)
    return len(fixed) + (0 if c.startswith("dev/") else 1 if c.startswith("best ") else 2)

  return sorted(columns, key=rank)  # stable: first-seen order within a rank


def _number(key: str, x: float, like: float | None = None) -> str:
  """A number of column `key` in the unit its size (or `like`'s) calls for: M tokens or
  parameters, minutes or seconds, thousands separated rates, else 4 digits."""
  size = x if like is None else like
  if key in ("params", "tokens"):
    return f"{x / 1e6:.2f}M" if size >= 1e5 else f"{x:,.0f}"
  if key == "wall_seconds":
    return f"{x / 60:.1f} min" if size >= 120 else f"{x:.0f} s"
  if key == "tokens_per_sec":
    return f"{x:,.0f}"
  return str(x) if isinstance(x, int) else f"{x:.4g}"


def format_cell(key: str, value: Any) -> str:
  """A value as a table cell: sizes and durations readable, metrics to 4 digits, config values
  as written, a Spread as 'mean ± std' ('mean' alone when its values are equal)."""
  if isinstance(value, Spread):
    mean = int(value.mean) if value.mean.is_integer() else value.mean
    if value.n < 2 or value.std == 0 or math.isnan(value.std):
      return _number(key, mean)
    return f"{_number(key, mean)} ± {_number(key, value.std, like=value.mean)}"
  if value is None or value == "":
    return ""
  if is_number(value) and (key in ("params", "tokens", "wall_seconds", "tokens_per_sec")
                           or isinstance(value, float) and "/" in key):
    return _number(key, value)
  if isinstance(value, (list, dict)):
    return json.dumps(value)
  return (repr(value) if isinstance(value, float) else str(value)).replace("|", "\\|")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   bold: tuple[str, Any] | None = None) -> str:
  """A Markdown table of `rows` in `columns`; bold=(column, value): that cell in bold."""
  lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
  for row in rows:
    cells = [format_cell(k, row.get(k)) for k in columns]
    if bold is not None and bold[0] in columns and row.get(bold[0]) == bold[1]:
      i = columns.index(bold[0])
      cells[i] = f"**{cells[i]}**"
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _by_value(runs: Sequence[RunFiles], values: Sequence[Any], key: str = "") -> str:
  """'200 (runs/b), 1000 (runs/a, runs/c)': each value (of column `key`) with its runs."""
  names: dict[str, list[str]] = {}
  for run, value in zip(runs, values):
    names.setdefault(format_cell(key, value) or "(none)", []).append(run.path)
  return ", ".join(f"{v} ({', '.join(n)})" for v, n in names.items())


def _key_warnings(runs: Sequence[RunFiles], keys: Sequence[str], what: str) -> list[str]:
  """'<what>: <key>: <values by run>' for each of `keys` whose value differs between the runs."""
  out = []
  for key in keys:
    values = [r.config.get(key) for r in runs]
    if not _same(values):
      out.append(f"{what}: {key}: {_by_value(runs, values, key)}")
  return out


def _data_warnings(runs: Sequence[RunFiles]) -> list[str]:
  """Each run whose provenance.json fingerprints other data than the first run's (that has one)
  in a split both read (data.train_split, data.eval_split)."""
  fingerprinted = [r for r in runs if r.provenance and r.provenance.get("data")]
  if len(fingerprinted) < 2:
    return []
  first, out = fingerprinted[0], []
  for run in fingerprinted[1:]:
    splits = dict.fromkeys(r.config.get(f"data.{k}") for r in (first, run)
                           for k in ("train_split", "eval_split"))
    for split in filter(None, splits):
      try:
        difference = provenance.data_difference(first.provenance["data"], run.provenance["data"],
                                                split)
      except (KeyError, TypeError, AttributeError):  # a fingerprint of another layout
        difference = None
      if difference is not None:
        out.append(f"different data: {run.path} read {difference} ({first.path}'s data, "
                   "provenance.json)")
  return out


def _coverage_warnings(runs: Sequence[RunFiles], split: str | None) -> list[str]:
  """Splits eval.py evaluated for some runs only, and coverages of a split that differ."""
  out = []
  splits = [split] if split else sorted({s for r in runs for s in r.evaluated})
  for name in splits:
    have = [r for r in runs if name in r.evaluated]
    lacking = [r.path for r in runs if name not in r.evaluated]
    if lacking and (have or split):
      out.append(f"no metrics.{name}.json in {', '.join(lacking)} (python eval.py "
                 f"--workdir={lacking[0]} --split={name})")
    for count in ("decoded_examples", "scored_tokens"):
      counted = [(r, (r.evaluated[name].get("coverage") or {}).get(count)) for r in have]
      counted = [(r, v) for r, v in counted if v is not None]
      if not _same([v for _, v in counted]):
        out.append(f"different evaluation sets: {name} coverage {count}: "
                   f"{_by_value([r for r, _ in counted], [v for _, v in counted])}")
  return out


def comparison_warnings(runs: Sequence[RunFiles], split: str | None = None) -> list[str]:
  """One line per way `runs` are not like for like: steps, data, evaluation split or set; and
  one per unfinished run."""
  if len(runs) < 2:
    out = []
  else:
    steps = [r.steps for r in runs]
    out = [f"steps differ: {_by_value(runs, steps)}; compare runs trained equally long"] if (
        not _same(steps)) else []
    out += _key_warnings(runs, DATA_KEYS, "different data")
    out += _data_warnings(runs)
    out += [w + "; their dev/* metrics are on different data"
            for w in _key_warnings(runs, ["data.eval_split"], "different evaluation split")]
    eval_sets = _key_warnings(runs, EVAL_SET_KEYS, "different evaluation sets")
    counted = [(r, last_eval(r.logged).get("dev/decoded_examples")) for r in runs]
    counted = [(r, v) for r, v in counted if v is not None]
    if not eval_sets and not _same([v for _, v in counted]):
      eval_sets = [f"different evaluation sets: dev/decoded_examples: "
                   f"{_by_value([r for r, _ in counted], [v for _, v in counted])}"]
    out += eval_sets
    out += _coverage_warnings(runs, split)
  for run in runs:
    if run.done is None:
      target = run.config.get("train.num_steps")
      at = f"at step {run.steps} of {target}" if run.steps is not None else "nothing logged"
      out.append(f"unfinished (no train_done.json): {run.path} ({at})")
  return out


def compare(paths_or_globs: Sequence[str] | str, split: str | None = None,
            group: bool = True) -> Comparison:
  """The runs of `paths_or_globs` (workdirs, globs of workdirs, members runs) side by side;
  `split`: eval.py's metrics of that split only (default: every split evaluated); `group`: one
  row per seed group. Raises CompareError (one line) for a path that holds no workdir."""
  if isinstance(paths_or_globs, str):
    paths_or_globs = [paths_or_globs]
  runs = [read_run(p) for p in expand(paths_or_globs)]
  configs = [r.config for r in runs]
  keys = differing_keys(configs)
  run_rows = [run_row(r, keys, split) for r in runs]
  groups = seed_groups(configs) if group else [[i] for i in range(len(runs))]
  grouped = any(len(g) > 1 for g in groups)
  rows = [group_row([run_rows[i] for i in g], keys) if grouped else run_rows[g[0]] for g in groups]
  columns = _column_order(list(dict.fromkeys(k for r in rows for k in r)), keys)
  shown = shown_columns(rows, columns, keep=("run", "n"))
  return Comparison(runs, keys, run_rows, groups, rows, shown, comparison_warnings(runs, split))


def _define(f: flags.FlagValues) -> None:
  flags.DEFINE_string("split", "", "eval.py's metrics of this split only (default: every "
                      "metrics.<split>.json found)", flag_values=f)
  flags.DEFINE_string("plot", "", "write the learning curves overlaid to this PNG", flag_values=f)
  flags.DEFINE_bool("group", True, "one row (mean ± std, n) per group of runs that differ only "
                    "in their seeds; --nogroup: one row per run", flag_values=f)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line: prints the warnings and the table; the exit status (2: a bad path)."""
  args, paths = cli.parse_own_flags("python -m transformer.infer.compare RUN [RUN|'GLOB' ...]",
                                    _define, sys.argv[1:] if argv is None else argv)
  try:
    if args.plot:  # before anything is read: a path no command may write is refused at once
      guard.check(args.plot, "--plot", is_file=True)
    result = compare(paths, split=args.split or None, group=args.group)
  except (CompareError, guard.WriteRefused) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"error: {cli.error_line(e) or e}", file=sys.stderr)
    return 1
  print(result.text(), end="")
  if args.plot:
    fig = result.plot()
    if fig is None:
      print("warning: --plot: no metric was logged by two of the runs; nothing plotted")
    else:
      png = io.BytesIO()
      fig.savefig(png, format="png", dpi=100, bbox_inches="tight")
      guard.write_bytes(os.path.dirname(os.path.abspath(args.plot)), os.path.basename(args.plot),
                        png.getvalue())
      print(f"wrote {args.plot}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
