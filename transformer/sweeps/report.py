"""A sweep's results, one row per point, as results.csv, results.md, results.png (the chosen
metric per point) and curves.png (every point's learning curves) in the sweep's workdir."""

import contextlib
import csv
import json
import logging
import os
import statistics
from typing import Any, Sequence

from transformer import files
from transformer.sweeps import runner, spec

# Metrics tried in order by metric='auto'; the first one that some point has is plotted.
AUTO_METRICS = ("test/wer", "test/bleu", "test/bits_per_char", "test/bits_per_byte",
                "test/bits_per_token", "test/loss", "dev/wer", "dev/bleu", "dev/loss")
HIGHER_IS_BETTER = ("bleu", "accuracy")


def count_params(workdir: str) -> int | None:
  """Parameters of the run's model, from its config.json (None if there is none yet)."""
  if not files.exists(os.path.join(workdir, "config.json")):
    return None
  try:
    from transformer.model import models  # pylint: disable=g-import-not-at-top  (JAX, only here)
    from transformer.run import restore  # pylint: disable=g-import-not-at-top  (as models)
    return models.parameter_count(restore.load_run_config(workdir).model)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("cannot count the parameters of %s: %s", workdir, str(e).splitlines()[:1])
    return None


def _metrics_jsonl(workdir: str) -> list[dict[str, Any]]:
  path = os.path.join(workdir, "metrics.jsonl")
  records = []
  if files.exists(path):
    for line in files.read_text(path).split("\n"):
      with contextlib.suppress(ValueError):  # a line cut by a kill (or the empty end)
        records.append(json.loads(line))
  return records


def _sort_metrics(keys: Sequence[str]) -> list[str]:
  first = ("loss", "accuracy", "perplexity")
  return sorted(keys, key=lambda k: (first.index(k) if k in first else len(first), k))


def collect(points: Sequence[spec.Point], eval_split: str = "test") -> list[dict[str, Any]]:
  """One row per point: swept values, params, steps, dev/* (the last in-training evaluation),
  test/* (eval.py's), median tokens/s after the first (compiling) window, wall seconds, status."""
  label = spec.labels([p.overrides for p in points])
  rows = []
  for p in points:
    row: dict[str, Any] = {"point": p.name}
    row |= {lab: spec.format_value(p.overrides[k]) if k in p.overrides else ""
            for k, lab in label.items()}
    record = runner.read_record(p)
    if record.get("params") is None and files.isdir(p.workdir):
      record["params"] = count_params(p.workdir)
      if record["params"] is not None:
        runner.write_record(p, record)
    row["params"] = record.get("params")
    logged = _metrics_jsonl(p.workdir)
    row["steps"] = max((r.get("step", 0) for r in logged), default=None)
    evals = [r for r in logged if any(k.startswith("eval/") for k in r)]
    if evals:
      dev = {k[len("eval/"):]: v for k, v in evals[-1].items() if k.startswith("eval/")}
      row |= {f"dev/{k}": dev[k] for k in _sort_metrics(list(dev))}
    test = runner.read_json(os.path.join(p.workdir, f"metrics.{eval_split}.json"))
    if isinstance(test, dict):
      names = [k for k, v in test.items() if k != "step"
               and isinstance(v, (int, float)) and not isinstance(v, bool)]
      row |= {f"{eval_split}/{k}": test[k] for k in _sort_metrics(names)}
    rates = [r["perf/tokens_per_sec"] for r in logged if "perf/tokens_per_sec" in r]
    row["tokens_per_sec"] = statistics.median(rates[1:] or rates) if rates else None
    row["wall_seconds"] = record.get("train_seconds")
    # Results copied without checkpoints (e.g. from a bucket) count as done by their metrics.
    finished = runner.trained_step(p) is not None or (row["steps"] or 0) >= p.num_steps
    row["status"] = "done" if finished else ("partial" if logged else "not run")
    rows.append(row)
  return rows


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
  """Every key of every row, in a stable order: first-seen, with metric groups kept together."""
  seen = list(dict.fromkeys(k for r in rows for k in r))
  tail = ["tokens_per_sec", "wall_seconds", "status"]
  metrics = [k for k in seen if "/" in k]
  dev = [k for k in metrics if k.startswith("dev/")]
  head = [k for k in seen if k not in metrics and k not in tail]
  return head + dev + [k for k in metrics if k not in dev] + [k for k in tail if k in seen]


def _fmt(key: str, value: Any) -> str:
  if value is None or value == "":
    return ""
  if key == "params" and isinstance(value, (int, float)):
    return f"{value / 1e6:.2f}M" if value >= 1e5 else f"{value:,}"
  if key == "wall_seconds" and isinstance(value, (int, float)):
    return f"{value / 60:.1f} min" if value >= 120 else f"{value:.0f} s"
  if key == "tokens_per_sec" and isinstance(value, (int, float)):
    return f"{value:,.0f}"
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
  """results.csv: every column, raw values, blank where a point has none."""
  cols = columns(rows)
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=cols, restval="")
    writer.writeheader()
    writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in cols} for row in rows)


def constant_columns(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> dict[str, Any]:
  """{column: value} of the columns (but `point`) whose value is the same in every row, of two
  rows or more; a column empty in every row maps to None."""
  if len(rows) < 2:
    return {}
  out = {}
  for k in cols:
    values = [None if r.get(k) == "" else r.get(k) for r in rows]
    if k != "point" and all(v == values[0] for v in values):
      out[k] = values[0]
  return out


def markdown(rows: Sequence[dict[str, Any]], metric: str | None = None) -> str:
  """A Markdown table of the rows without the columns the same for every point (their values
  stated once above it); the best value of `metric` in bold."""
  constant = constant_columns(rows, columns(rows))
  cols = [k for k in columns(rows) if k not in constant]
  values = [r.get(metric) for r in rows if isinstance(r.get(metric), (int, float))]
  better = max if metric and any(h in metric for h in HIGHER_IS_BETTER) else min
  best = better(values) if metric in cols and values else None
  same = [f"{k} {_fmt(k, v)}" for k, v in constant.items() if v is not None]
  lines = [f"Same for every point: {', '.join(same)}.", ""] if same else []
  lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
  for row in rows:
    cells = [_fmt(k, row.get(k)) for k in cols]
    if best is not None and row.get(metric) == best:
      cells[cols.index(metric)] = f"**{cells[cols.index(metric)]}**"
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def metric_figure(rows: Sequence[dict[str, Any]], metric: str) -> Any:
  """Horizontal bars: `metric` per point that has it; None for fewer than two (no comparison)."""
  from transformer.infer.viz import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  have = [r for r in rows if isinstance(r.get(metric), (int, float))]
  if len(have) < 2:
    return None
  fig, ax = plt.subplots(figsize=(7, 0.45 * max(len(have), 2) + 1.2))
  ax.barh([r["point"] for r in have], [r[metric] for r in have], color="tab:blue")
  ax.invert_yaxis()  # the sweep's order, top to bottom
  for i, r in enumerate(have):
    ax.text(r[metric], i, f" {r[metric]:.4g}", va="center", fontsize=8)
  ax.set(xlabel=metric, title=f"{metric} per point")
  ax.grid(axis="x", alpha=0.3)
  fig.tight_layout()
  return fig


def curve_panels(points: Sequence[spec.Point], metric: str | None) -> list[str]:
  """The curves worth a panel: train/loss, eval/loss and the metric's eval/ key, each only where
  some point logged it at two steps or more (one evaluation is a value, not a curve)."""
  keys = ["train/loss", "eval/loss"]
  if metric and "/" in metric and metric.split("/", 1)[1] != "loss":
    keys.append("eval/" + metric.split("/", 1)[1])
  logged = [_metrics_jsonl(p.workdir) for p in points]
  return [k for k in keys if any(len({r["step"] for r in rows if k in r and "step" in r}) >= 2
                                 for rows in logged)]


def curves_figure(points: Sequence[spec.Point], metric: str | None) -> Any:
  """curve_panels' curves of every point against the step; None when there is none."""
  from transformer.infer.viz import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  keys = curve_panels(points, metric)
  if not keys:
    return None
  fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
  for key, ax in zip(keys, axes[0]):
    for p in points:
      xy = [(r["step"], r[key]) for r in _metrics_jsonl(p.workdir) if key in r and "step" in r]
      if xy:
        ax.plot(*zip(*xy), marker="." if len(xy) < 30 else None, label=p.name)
    ax.set(title=key, xlabel="step")
    ax.grid(alpha=0.3)
  handles, names = axes[0][0].get_legend_handles_labels()
  if handles:
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=8,
               bbox_to_anchor=(0.5, -0.02 - 0.05 * ((len(names) - 1) // 3)))
  fig.tight_layout(rect=(0, 0.08 + 0.05 * ((len(names) - 1) // 3) if handles else 0, 1, 1))
  return fig


def _save(fig: Any, path: str) -> None:
  from transformer.infer.viz import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)


def write_report(points: Sequence[spec.Point], workdir: str, metric: str = "auto",
                 eval_split: str = "test", title: str = "") -> dict[str, Any]:
  """Writes results.csv (every column), .md (constant columns stated above the table), .png and
  curves.png (where they have something to compare); returns {'rows', 'metric', and the paths}."""
  os.makedirs(workdir, exist_ok=True)
  rows = collect(points, eval_split or "test")
  chosen = metric if metric != "auto" else next(
      (m for m in AUTO_METRICS if any(r.get(m) is not None for r in rows)), None)
  out = {"rows": rows, "metric": chosen, "csv": os.path.join(workdir, "results.csv"),
         "md": os.path.join(workdir, "results.md")}
  write_csv(rows, out["csv"])
  with open(out["md"], "w") as f:
    f.write((f"{title}\n\n" if title else "") + markdown(rows, chosen))
  for key, name, fig in (("plot", "results.png", chosen and metric_figure(rows, chosen)),
                         ("curves", "curves.png", curves_figure(points, chosen))):
    if fig is not None:
      out[key] = os.path.join(workdir, name)
      _save(fig, out[key])
  return out
