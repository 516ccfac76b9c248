"""Plots of what workdirs logged: one run's learning curves, several runs' overlaid (a seed group
as its mean and range), a metric against wall-clock minutes. Each returns a matplotlib Figure (Agg
backend: headless), saved as a PNG at `save_path` when given:

  plot_learning_curves("runs/g2p_tiny", save_path="runs/g2p_tiny/curves.png")
"""

import math
import os
from typing import Any, Sequence

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
  matplotlib.use("Agg")  # headless by default; notebooks keep their inline backend
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from transformer import files  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.run import metrics_log  # pylint: disable=wrong-import-position


def finish(fig: Any, save_path: str | None, tight: bool = True) -> Any:
  """Lays `fig` out tightly, saves it as a PNG at `save_path` when given; returns it."""
  if tight:
    fig.tight_layout()
  if save_path:
    os.makedirs(os.path.dirname(os.path.abspath(save_path)), exist_ok=True)
    fig.savefig(save_path, dpi=100, bbox_inches="tight")
  return fig


def read_metrics(metrics_path: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl file (or of `<workdir>/metrics.jsonl`), read by metrics_log."""
  path = metrics_log.path_of(metrics_path)
  if not files.exists(path):
    raise FileNotFoundError(f"{path} not found: no metrics were logged")
  return metrics_log.read(path)


def plot_learning_curves(metrics_path: str, keys: Sequence[str] | None = None,
                         save_path: str | None = None) -> Any:
  """Each metric (default: train/loss, eval/*) against the step, from a workdir or metrics.jsonl."""
  records = read_metrics(metrics_path)
  logged = sorted({k for r in records for k, v in r.items()
                   if k != "step" and isinstance(v, (int, float))})
  if keys is None:
    keys = [k for k in logged if k == "train/loss" or k.startswith("eval/")] or logged[:4]
  keys = [k for k in keys if k in logged]
  if not keys:
    raise ValueError(f"plot_learning_curves: none of the requested metrics is in {metrics_path} "
                     f"(logged: {logged})")
  ncols = min(3, len(keys))
  nrows = math.ceil(len(keys) / ncols)
  fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(4.2 * ncols, 3.2 * nrows))
  for ax in axes.flat[len(keys):]:
    ax.axis("off")
  for key, ax in zip(keys, axes.flat):
    points = [(r["step"], r[key]) for r in records if key in r and "step" in r]
    steps, values = zip(*points)
    ax.plot(steps, values, marker="." if len(points) < 30 else None)
    ax.set(title=key, xlabel="step")
    ax.grid(alpha=0.3)
  return finish(fig, save_path)


def _curve(records: Sequence[dict[str, Any]], key: str) -> dict[int, float]:
  """{step: value} of `key` in one run's metrics.jsonl records (a later record of a step wins)."""
  return {r["step"]: r[key] for r in records
          if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), int)}


def plot_compared_curves(runs: dict[str, Sequence[Sequence[dict[str, Any]]]],
                         keys: Sequence[str] | None = None, save_path: str | None = None) -> Any:
  """Learning curves of several runs overlaid, one panel per metric (default: train/loss and
  every eval/* but the counts), only panels two runs (the one run, if one) have data for; `runs`:
  label -> the metrics.jsonl records of each of its seeds (several: their mean over the steps
  all logged, in a band from min to max). None when no panel has enough data."""
  if keys is None:
    logged = {k for seeds in runs.values() for records in seeds for r in records for k in r}
    counts = ("decoded_examples", "scored_tokens")
    keys = ["train/loss"] + sorted(k for k in logged if k.startswith("eval/")
                                   and k.split("/", 1)[1] not in counts)
  curves = {key: {} for key in keys}
  for key in keys:
    for label, seeds in runs.items():
      per_seed = [c for c in (_curve(records, key) for records in seeds) if c]
      steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
      if steps:
        curves[key][label] = (steps, np.array([[c[s] for s in steps] for c in per_seed]))
  panels = [k for k in keys if len(curves[k]) >= min(2, len(runs))]
  if not panels:
    return None
  ncols = min(3, len(panels))
  nrows = math.ceil(len(panels) / ncols)
  fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(4.5 * ncols, 3.4 * nrows))
  for ax in axes.flat[len(panels):]:
    ax.remove()
  colors = {label: f"C{i % 10}" for i, label in enumerate(runs)}
  for key, ax in zip(panels, axes.flat):
    for label, (steps, values) in curves[key].items():
      n = len(values)
      ax.plot(steps, values.mean(axis=0), color=colors[label], marker="." if len(steps) < 30
              else None, label=label if n == 1 else f"{label} (n={n})")
      if n > 1:
        ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=colors[label],
                        alpha=0.2, linewidth=0)
    ax.set(title=key, xlabel="step")
    ax.grid(alpha=0.3)
  handles = {h.get_label(): h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]}
  fig.legend(list(handles.values()), list(handles), loc="lower center", fontsize=8,
             ncol=min(3, len(handles)), bbox_to_anchor=(0.5, 1.0))
  return finish(fig, save_path)


def plot_time_to_quality(runs: dict[str, str], key: str = "eval/wer",
                         finals: dict[str, tuple[float, float]] | None = None,
                         save_path: str | None = None) -> Any:
  """`key` against wall-clock minutes (time/elapsed_s) for `runs` (label -> workdir or its
  metrics.jsonl), fractions as percentages; `finals` (label -> (minutes, value)): stars."""
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  curves = {}
  for label, path in runs.items():
    points = [(r["time/elapsed_s"] / 60, r[key]) for r in read_metrics(path)
              if key in r and "time/elapsed_s" in r]
    if not points:
      raise ValueError(f"plot_time_to_quality: {path} logged no {key} with time/elapsed_s "
                       f"(runs from before elapsed time was logged cannot be placed on this plot)")
    curves[label] = points
  scale = 100.0 if all(0 <= v <= 1 for points in curves.values() for _, v in points) else 1.0
  for label, points in curves.items():
    minutes, values = zip(*points)
    (line,) = ax.plot(minutes, [v * scale for v in values], marker=".", label=label)
    if finals and label in finals:
      m, v = finals[label]
      ax.plot([m], [v * scale], marker="*", markersize=12, color=line.get_color(), linestyle="")
  ax.set(xlabel="wall-clock minutes", ylabel=key + (" (%)" if scale != 1 else ""),
         title=f"{key} against time" + (" (stars: test split)" if finals else ""))
  ax.grid(alpha=0.3)
  ax.legend()
  return finish(fig, save_path)
