"""Plots of scaling.json's fits (matplotlib, imported only here): the IsoFLOP curves with their
parabolas and vertices, the compute-optimal frontier N*(C) of both approaches with Approach 3's
interval and the held-out budgets' observed vertices, and Approach 3's residuals."""

from typing import Any, Mapping

import matplotlib
import matplotlib.ticker
import numpy as np


def _approach3_loss(a3: Mapping[str, Any], n: np.ndarray, d: np.ndarray) -> np.ndarray:
  return a3["E"] + a3["A"] * n ** -a3["alpha"] + a3["B"] * d ** -a3["beta"]


def isoflop_panel(ax: Any, result: Mapping[str, Any]) -> None:
  """Loss against parameters per budget: runs, each fitted budget's parabola and its vertex."""
  runs = result["runs"]
  budgets = sorted({r["budget"] for r in runs})
  colours = dict(zip(budgets, matplotlib.colormaps["viridis"](np.linspace(0, 0.9, len(budgets)))))
  profiles = {p["budget"]: p for p in result["approach2"]["profiles"]}
  for b in budgets:
    mine = [r for r in runs if r["budget"] == b]
    held = b in result["held_out_budgets"]
    ax.scatter([r["params"] for r in mine], [r["loss"] for r in mine], s=14, color=colours[b],
               marker="x" if held else "o", label=f"{b:.2g}" + (" (held out)" if held else ""))
    p = profiles.get(b)
    if p:
      n = np.geomspace(min(r["params"] for r in mine), max(r["params"] for r in mine), 50)
      c0, c1, c2 = p["coefficients"]
      ax.plot(n, c0 + c1 * np.log(n) + c2 * np.log(n) ** 2, color=colours[b], lw=1)
      ax.plot(p["n_opt"], p["loss_opt"], "*", color=colours[b], ms=10, mec="k", mew=0.5)
  ax.set(xscale="log", xlabel="parameters N", ylabel=result["metric"], title="IsoFLOP curves")
  ax.legend(title="FLOPs", fontsize=7)


def frontier_panel(ax: Any, result: Mapping[str, Any]) -> None:
  """N*(C): Approach 2's vertices and power law, Approach 3's optimum and 95% interval, and the
  held-out budgets' observed vertices."""
  a2, a3 = result["approach2"], result["approach3"]
  budgets = [p["budget"] for p in a2["profiles"]]
  predicted = [float(k) for k in a3["predictions"]]
  c = np.geomspace(min(budgets) / 1.5, max(budgets + predicted) * 1.5, 30)
  ax.plot([p["budget"] for p in a2["profiles"]], [p["n_opt"] for p in a2["profiles"]], "o",
          color="C0", label="IsoFLOP vertices (fitted)")
  ax.plot(c, a2["k_n"] * c ** a2["a"], color="C0", lw=1, label=f"Approach 2: a={a2['a']:.2f}")
  for k, p in a3["predictions"].items():
    low, high = p["intervals"]["n_opt"] or (p["n_opt"], p["n_opt"])
    ax.errorbar(float(k), p["n_opt"], [[p["n_opt"] - low], [high - p["n_opt"]]], fmt="s",
                color="C1", capsize=3, label="Approach 3 prediction (95%)")
  for k, held in result["held_out"].items():
    vertex = held["observed"]["vertex_params"]
    if vertex:
      ax.plot(float(k), vertex, "*", color="k", ms=10, label="held-out vertex (observed)")
  ax.set(xscale="log", yscale="log", xlabel="training FLOPs C", ylabel="N*",
         title=f"Frontier (Approach 3: a={a3['a']:.2f})")
  handles, labels = ax.get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  ax.legend(unique.values(), unique.keys(), fontsize=7)


def residual_panel(ax: Any, result: Mapping[str, Any]) -> None:
  """Approach 3's residuals ln(fitted) - ln(observed) of every run against N, by budget."""
  a3, runs = result["approach3"], result["runs"]
  for b in sorted({r["budget"] for r in runs}):
    mine = [r for r in runs if r["budget"] == b]
    n = np.array([r["params"] for r in mine], float)
    d = np.array([r["tokens"] for r in mine], float)
    loss = np.array([r["loss"] for r in mine], float)
    held = b in result["held_out_budgets"]
    ax.scatter(n, np.log(_approach3_loss(a3, n, d)) - np.log(loss), s=14,
               marker="x" if held else "o", label=f"{b:.2g}" + (" (held out)" if held else ""))
  ax.axhline(0, color="k", lw=0.5)
  ax.set(xscale="log", xlabel="parameters N", ylabel="ln fitted - ln observed",
         title="Approach 3 residuals")
  ax.legend(title="FLOPs", fontsize=7)


def plot(result: Mapping[str, Any], save_path: str) -> None:
  """The three panels side by side, saved to `save_path`."""
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top  (after the backend)
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
  isoflop_panel(axes[0], result)
  frontier_panel(axes[1], result)
  residual_panel(axes[2], result)
  for ax in axes:  # a log axis spanning under a decade labels its minor ticks, which collide
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  axes[1].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  fig.tight_layout()
  fig.savefig(save_path, dpi=110)
  plt.close(fig)
