"""A sweep's results, one row per point, as results.csv, results.md, results.png (the chosen
metric per point) and curves.png (every point's learning curves) in the sweep's workdir."""

import csv
import io
import logging
import os
from typing import Any, Sequence

from transformer import files, metrics as metrics_lib
from transformer.run import compare, guard, metrics_log, results, table
from transformer.sweeps import runner, spec

# Metrics tried in order by metric='auto'; the first one that some point has is plotted.
AUTO_METRICS = ("test/wer", "test/bleu", "test/bits_per_char", "test/bits_per_byte",
                "test/bits_per_token", "test/loss", "dev/wer", "dev/bleu", "dev/loss")
# Columns results.md shows even when every point has the same value (others are left out).
KEPT = ("point", "params", "steps", "status")


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
    run = results.read_run(p.workdir, strict=False)
    logged = run.logged
    row["steps"] = run.steps
    row |= results.last_eval(logged) | results.split_metrics(run, eval_split)
    row["tokens_per_sec"] = results.median_rate(logged)
    row["wall_seconds"] = record.get("train_seconds")
    # Results copied without checkpoints (e.g. from a bucket) count as done by their metrics.
    finished = runner.trained_step(p) is not None or (row["steps"] or 0) >= p.num_steps
    stopped = None if finished else runner.stopped_early(p)
    row["status"] = "done" if finished else (
        f"stopped by {stopped.get('by')} at step {stopped.get('step')}" if stopped
        else "partial" if logged else "not run")
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


def _write(path: str, data: bytes) -> None:
  """Writes a report file through the guard (recorded as the sweep's own, so a rerun replaces
  it)."""
  guard.write_bytes(os.path.dirname(os.path.abspath(path)), os.path.basename(path), data)


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
  """results.csv: every column, raw values, blank where a point has none."""
  cols = columns(rows)
  text = io.StringIO(newline="")
  writer = csv.DictWriter(text, fieldnames=cols, restval="")
  writer.writeheader()
  writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in cols} for row in rows)
  _write(path, text.getvalue().encode("utf-8"))


def markdown(rows: Sequence[dict[str, Any]], metric: str | None = None,
             groups: Sequence[Sequence[int]] = ()) -> str:
  """A Markdown table of the rows, the best value of `metric` in bold (none when all tie); the
  columns equal in every row (but KEPT and results) left out and their values stated once above
  it. `groups`
  (compare.seed_groups of the points' overrides): where one has n > 1 points, a second table with
  one row per group, mean ± std."""
  cols = table.shown_columns(rows, columns(rows), keep=KEPT)
  same = [f"{c} {table.format_cell(c, rows[0].get(c))}" for c in columns(rows)
          if c not in cols and rows[0].get(c) not in (None, "")]
  values = [r.get(metric) for r in rows if metrics_log.is_finite(r.get(metric))]
  better = max if metric and metrics_lib.better_mode(metric) == "max" else min
  best = better(values) if metric and len(set(values)) > 1 else None  # a tie singles out none
  text = f"Same for every point: {', '.join(same)}.\n\n" if same else ""
  text += table.markdown_table(rows, cols, bold=None if best is None else (metric, best))
  if any(len(g) > 1 for g in groups):
    grouped = [table.group_row([rows[i] for i in g], (), name="point") for g in groups]
    cols = [c for c in table.shown_columns(grouped, columns(grouped), keep=("n", *KEPT))
            if c != "point"]  # the swept values name each group
    text += ("\nPoints that differ only in their seeds, n of them: mean ± sample standard "
             "deviation.\n\n" + table.markdown_table(grouped, cols))
  return text


def metric_figure(rows: Sequence[dict[str, Any]], metric: str) -> Any:
  """Horizontal bars: `metric` per point that has it; None for fewer than two (no comparison)."""
  from transformer.run.curves import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  have = [r for r in rows if metrics_log.is_finite(r.get(metric))]
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


def plot_curves(points: Sequence[spec.Point], metric: str | None, path: str) -> bool:
  """train/loss, eval/loss and the metric's eval/ curve of every point against the step, each
  panel only where two points logged it; False if none did (nothing written)."""
  from transformer.run import curves  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  keys = ["train/loss", "eval/loss"]
  if metric and "/" in metric and metric.split("/", 1)[1] != "loss":
    keys.append("eval/" + metric.split("/", 1)[1])
  fig = curves.plot_compared_curves({p.name: [results.read_logged(p.workdir)] for p in points},
                                    keys)
  if fig is not None:
    _save(fig, path)
  return fig is not None


def _save(fig: Any, path: str) -> None:
  from transformer.run.curves import plt  # pylint: disable=g-import-not-at-top  (Agg; plots only)
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=100, bbox_inches="tight")
  plt.close(fig)
  _write(path, png.getvalue())


def write_report(points: Sequence[spec.Point], workdir: str, metric: str = "auto",
                 eval_split: str = "test", title: str = "") -> dict[str, Any]:
  """Writes results.csv (every column), .md (constant columns stated above the table), .png and
  curves.png (where they have something to compare); returns {'rows', 'metric', 'markdown' (the
  tables of results.md) and the paths}; raises spec.SweepError (one line) for a workdir the
  guard refuses (inside a run, or holding a report file the sweep did not write)."""
  spec.check_workdir(workdir)
  rows = collect(points, eval_split or "test")
  chosen = metric if metric != "auto" else next(
      (m for m in AUTO_METRICS if any(r.get(m) is not None for r in rows)), None)
  out = {"rows": rows, "metric": chosen, "csv": os.path.join(workdir, "results.csv"),
         "md": os.path.join(workdir, "results.md")}
  write_csv(rows, out["csv"])
  out["markdown"] = markdown(rows, chosen, compare.seed_groups([p.overrides for p in points]))
  _write(out["md"], ((f"{title}\n\n" if title else "") + out["markdown"]).encode("utf-8"))
  if chosen and (fig := metric_figure(rows, chosen)) is not None:
    out["plot"] = os.path.join(workdir, "results.png")
    _save(fig, out["plot"])
  if plot_curves(points, chosen, os.path.join(workdir, "curves.png")):
    out["curves"] = os.path.join(workdir, "curves.png")
  return out
