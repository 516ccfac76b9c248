r"""Runs side by side: the config keys that differ, steps, tokens, wall clock and the metrics, with
a warning wherever the comparison is not like for like.

  python -m transformer.run.compare runs/g2p_tiny runs/g2p_tiny_rope [--split=test] \
      [--plot=runs/curves.png]
  python -m transformer.run.compare 'runs/sweep_norm/*'     # a quoted glob: its workdirs

Each argument is a workdir, a glob of workdirs, or a `train.members` run's workdir (its members).
One row per run: the keys of config.json that differ between the runs, steps, tokens (training
tokens without padding, from the logged rates), wall clock, tokens/s, the last train/loss, dev/*
(the last in-training evaluation, on data.eval_split), the best value of the run's
checkpoint.keep_best_by and eval.py's metrics.<split>.json. Columns equal in every row are left
out, except results. Runs whose configs differ only in their seeds are one row: mean ± sample
standard deviation of each number, and n. Warnings name the runs whose steps, data, evaluation
split or evaluation set differ, and the unfinished ones. `--plot` overlays the learning curves.
The workdirs are read by results.py; the table is table.py's, as the sweep report's is.
"""

import dataclasses
import io
import json
import os
import sys
from typing import Any, Mapping, Sequence

from absl import flags

from transformer import cli
from transformer.run import guard, provenance, results, table

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
# Of the metrics logged during training, the ones shown (besides eval/*).
TRAIN_METRICS = ("train/loss",)


@dataclasses.dataclass
class Comparison:
  """compare()'s answer: the runs, the differing config keys, one row per run and one per group
  (a seed group's numbers are Spreads), the columns shown, the warnings; `text()` prints it."""
  runs: list[results.RunFiles]
  keys: list[str]
  run_rows: list[dict[str, Any]]
  groups: list[list[int]]
  rows: list[dict[str, Any]]
  columns: list[str]
  warnings: list[str]

  def markdown(self) -> str:
    """The table, one row per run or seed group."""
    return table.markdown_table(self.rows, self.columns)

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
    """The learning curves overlaid (curves.plot_compared_curves: a seed group is its mean and
    range), one panel per metric logged by two rows or more; None where no metric is."""
    # matplotlib loads only for a plot: the table does not need it.
    from transformer.run import curves  # pylint: disable=g-import-not-at-top
    logged = {_label(row): [self.runs[i].logged for i in group]
              for row, group in zip(self.rows, self.groups)}
    return curves.plot_compared_curves(logged, save_path=save_path)


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
  """The keys (in first-seen order) whose values are not the same in every one of the flat
  `configs`; a key some lack differs."""
  keys = list(dict.fromkeys(k for c in configs for k in c))
  return [k for k in keys
          if not (all(k in c for c in configs) and table.same([c[k] for c in configs]))]


def seed_groups(configs: Sequence[Mapping[str, Any]]) -> list[list[int]]:
  """The indices of `configs` grouped by all but SEED_KEYS and NO_EFFECT_KEYS, groups in the
  order of their first member."""
  groups: dict[str, list[int]] = {}
  for i, c in enumerate(configs):
    rest = {k: v for k, v in c.items() if k not in SEED_KEYS and k not in NO_EFFECT_KEYS}
    groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(i)
  return list(groups.values())


def run_row(run: results.RunFiles, keys: Sequence[str], split: str | None = None
            ) -> dict[str, Any]:
  """One run's row: 'run', the `keys` of its config, then what it logged and evaluated."""
  row: dict[str, Any] = {"run": run.path} | {k: run.config.get(k) for k in keys}
  numbers = {"steps": run.steps, "tokens": results.tokens_seen(run.logged),
             "wall_seconds": results.wall_seconds(run),
             "tokens_per_sec": results.median_rate(run.logged)}
  for key in TRAIN_METRICS:
    numbers[key] = next((r[key] for r in reversed(run.logged) if table.is_number(r.get(key))),
                        None)
  row |= {k: v for k, v in numbers.items() if v is not None}
  return (row | results.last_eval(run.logged) | results.best_eval(run)
          | results.split_metrics(run, split))


def _label(row: Mapping[str, Any]) -> str:
  return str(row.get("run", row.get("point", "")))


def _column_order(columns: Sequence[str], keys: Sequence[str]) -> list[str]:
  """run, n, the config keys, steps ... tokens/s, train metrics, dev/*, best, eval.py splits."""
  fixed = ["run", "n", *keys, "steps", "tokens", "wall_seconds", "tokens_per_sec",
           *TRAIN_METRICS]

  def rank(c: str) -> int:
    if c in fixed:
      return fixed.index(c)
    return len(fixed) + (0 if c.startswith("dev/") else 1 if c.startswith("best ") else 2)

  return sorted(columns, key=rank)  # stable: first-seen order within a rank


def _by_value(runs: Sequence[results.RunFiles], values: Sequence[Any], key: str = "") -> str:
  """'200 (runs/b), 1000 (runs/a, runs/c)': each value (of column `key`) with its runs."""
  names: dict[str, list[str]] = {}
  for run, value in zip(runs, values):
    names.setdefault(table.format_cell(key, value) or "(none)", []).append(run.path)
  return ", ".join(f"{v} ({', '.join(n)})" for v, n in names.items())


def _key_warnings(runs: Sequence[results.RunFiles], keys: Sequence[str], what: str) -> list[str]:
  """'<what>: <key>: <values by run>' for each of `keys` whose value differs between the runs."""
  out = []
  for key in keys:
    values = [r.config.get(key) for r in runs]
    if not table.same(values):
      out.append(f"{what}: {key}: {_by_value(runs, values, key)}")
  return out


def _data_warnings(runs: Sequence[results.RunFiles]) -> list[str]:
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


def _coverage_warnings(runs: Sequence[results.RunFiles], split: str | None) -> list[str]:
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
      if not table.same([v for _, v in counted]):
        out.append(f"different evaluation sets: {name} coverage {count}: "
                   f"{_by_value([r for r, _ in counted], [v for _, v in counted])}")
  return out


def comparison_warnings(runs: Sequence[results.RunFiles], split: str | None = None
                        ) -> list[str]:
  """One line per way `runs` are not like for like: steps, data, evaluation split or set; and
  one per unfinished run."""
  if len(runs) < 2:
    out = []
  else:
    steps = [r.steps for r in runs]
    out = [f"steps differ: {_by_value(runs, steps)}; compare runs trained equally long"] if (
        not table.same(steps)) else []
    out += _key_warnings(runs, DATA_KEYS, "different data")
    out += _data_warnings(runs)
    out += [w + "; their dev/* metrics are on different data"
            for w in _key_warnings(runs, ["data.eval_split"], "different evaluation split")]
    eval_sets = _key_warnings(runs, EVAL_SET_KEYS, "different evaluation sets")
    counted = [(r, results.last_eval(r.logged).get("dev/decoded_examples")) for r in runs]
    counted = [(r, v) for r, v in counted if v is not None]
    if not eval_sets and not table.same([v for _, v in counted]):
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
  row per seed group. Raises results.WorkdirError (one line) for a path that holds no workdir."""
  if isinstance(paths_or_globs, str):
    paths_or_globs = [paths_or_globs]
  runs = [results.read_run(p) for p in results.expand(paths_or_globs)]
  configs = [r.config for r in runs]
  keys = differing_keys(configs)
  run_rows = [run_row(r, keys, split) for r in runs]
  groups = seed_groups(configs) if group else [[i] for i in range(len(runs))]
  grouped = any(len(g) > 1 for g in groups)
  rows = [table.group_row([run_rows[i] for i in g], keys) if grouped else run_rows[g[0]]
          for g in groups]
  columns = _column_order(list(dict.fromkeys(k for r in rows for k in r)), keys)
  shown = table.shown_columns(rows, columns, keep=("run", "n"))
  return Comparison(runs, keys, run_rows, groups, rows, shown, comparison_warnings(runs, split))


def _define(f: flags.FlagValues) -> None:
  flags.DEFINE_string("split", "", "eval.py's metrics of this split only (default: every "
                      "metrics.<split>.json found)", flag_values=f)
  flags.DEFINE_string("plot", "", "write the learning curves overlaid to this PNG", flag_values=f)
  flags.DEFINE_bool("group", True, "one row (mean ± std, n) per group of runs that differ only "
                    "in their seeds; --nogroup: one row per run", flag_values=f)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line: prints the warnings and the table; the exit status (2: a bad path)."""
  args, paths = cli.parse_own_flags("python -m transformer.run.compare RUN [RUN|'GLOB' ...]",
                                    _define, sys.argv[1:] if argv is None else argv)
  try:
    if args.plot:  # before anything is read: a path no command may write is refused at once
      guard.check(args.plot, "--plot", is_file=True)
    result = compare(paths, split=args.split or None, group=args.group)
  except (results.WorkdirError, guard.WriteRefused) as e:
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
