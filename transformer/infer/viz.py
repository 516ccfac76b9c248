"""Plots of a model: attention heat maps (text and images), positional encodings, label
efficiency. Each returns a matplotlib Figure (the Agg backend run/curves.py chooses, where the
learning-curve plots live), saved as a PNG at `save_path` when given:

  att = transformer.restore("runs/g2p").attention("phoneme")
  plot_attention(att.cross[-1], queries=att.target_tokens, keys=att.source_tokens)
"""

import math
from typing import Any, Sequence

import numpy as np

from transformer.model.positional import sinusoidal_table
from transformer.run.curves import finish, plt


def plot_attention(weights: Any, queries: Sequence[str] | None = None,
                   keys: Sequence[str] | None = None, title: str = "", ncols: int = 4,
                   save_path: str | None = None) -> Any:
  """Heat maps, one per head, of one layer's weights [heads, queries, keys] (or [queries, keys])."""
  w = np.asarray(weights, np.float32)
  w = w[None] if w.ndim == 2 else w
  if w.ndim != 3:
    raise ValueError(f"plot_attention: weights must be [heads, queries, keys], got {w.shape}")
  heads, t, s = w.shape
  for name, labels, size in (("queries", queries, t), ("keys", keys, s)):
    if labels is not None and len(labels) != size:
      raise ValueError(f"plot_attention: {len(labels)} {name} labels for {size} {name}")
  ncols = max(1, min(ncols, heads))
  nrows = math.ceil(heads / ncols)
  fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(
      max(2.5, 0.28 * s + 1.0) * ncols, max(2.5, 0.28 * t + 1.0) * nrows))
  for ax in axes.flat[heads:]:
    ax.axis("off")
  for h, ax in enumerate(axes.flat[:heads]):
    ax.imshow(w[h], vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_title(f"head {h}", fontsize=9)
    ax.set_xticks(range(s), keys if keys is not None else range(s), rotation=90, fontsize=7)
    ax.set_yticks(range(t), queries if queries is not None else range(t), fontsize=7)
  if title:
    fig.suptitle(title)
  return finish(fig, save_path)


def plot_positional_encoding(max_len: int = 64, d_model: int = 128, table: Any = None,
                             save_path: str | None = None) -> Any:
  """The sinusoidal table [positions, d_model] (or `table`) and its dot-product similarity."""
  table = np.asarray(sinusoidal_table(max_len, d_model) if table is None else table, np.float32)
  if table.ndim != 2:
    raise ValueError(f"plot_positional_encoding: table must be [positions, d], got {table.shape}")
  similarity = table @ table.T  # [pos, pos]: depends (mostly) on the distance between positions
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
  fig.colorbar(left.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1), ax=left)
  left.set(title="positional encoding", xlabel="dimension", ylabel="position")
  fig.colorbar(right.imshow(similarity, cmap="viridis"), ax=right)
  right.set(title="dot-product similarity", xlabel="position", ylabel="position")
  return finish(fig, save_path)


def plot_label_efficiency(results: dict[str, dict[float, float]], metric: str = "test accuracy",
                          baseline: float | None = None, save_path: str | None = None,
                          spread: dict[str, dict[float, tuple[float, float]]] | None = None) -> Any:
  """`metric` against the fraction of training labels per initialisation ({'from scratch': {0.01:
  0.75, ...}}); `baseline`: a dashed line; `spread` ({name: {fraction: (low, high)}}): bars."""
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for name, points in results.items():
    xs = sorted(points)
    ys = [100 * points[x] for x in xs]
    ranges = (spread or {}).get(name, {})
    if any(x in ranges for x in xs):
      lows = [y - 100 * ranges[x][0] if x in ranges else 0.0 for x, y in zip(xs, ys)]
      highs = [100 * ranges[x][1] - y if x in ranges else 0.0 for x, y in zip(xs, ys)]
      if min(lows + highs) < -1e-9:
        raise ValueError(f"spread of {name!r} does not contain its value at every fraction")
      ax.errorbar([100 * x for x in xs], ys, yerr=[lows, highs], marker="o", capsize=3,
                  label=name)
    else:
      ax.plot([100 * x for x in xs], ys, marker="o", label=name)
  if baseline is not None:
    ax.axhline(100 * baseline, color="gray", linestyle="--", label="majority class")
  ax.set(xscale="log", xlabel="training labels used (%)", ylabel=f"{metric} (%)")
  ax.grid(True, alpha=0.3)
  ax.legend()
  return finish(fig, save_path, tight=False)


def plot_image_attention(image: Any, attention_map: Any, title: str = "",
                         save_path: str | None = None) -> Any:
  """An image (pixels [H, W] or [H, W, C] in [0, 1]) beside the same image under its attention
  map [grid, grid] (e.g. api.image_attention_map), each map cell stretched over its patch."""
  pixels = np.asarray(image, np.float32)
  pixels = pixels[..., 0] if pixels.ndim == 3 and pixels.shape[-1] == 1 else pixels
  amap = np.asarray(attention_map, np.float32)
  if amap.ndim != 2 or pixels.shape[0] % amap.shape[0] or pixels.shape[1] % amap.shape[1]:
    raise ValueError(f"plot_image_attention: a map {amap.shape} does not tile an image "
                     f"{pixels.shape[:2]}")
  cell = (pixels.shape[0] // amap.shape[0], pixels.shape[1] // amap.shape[1])
  stretched = np.kron(amap / max(float(amap.max()), 1e-12), np.ones(cell))
  gray = "gray" if pixels.ndim == 2 else None
  fig, axes = plt.subplots(1, 2, figsize=(6, 3))
  axes[0].imshow(pixels, cmap=gray, vmin=0.0, vmax=1.0)
  axes[0].set_title("image", fontsize=9)
  axes[1].imshow(pixels, cmap=gray, vmin=0.0, vmax=1.0)
  axes[1].imshow(stretched, cmap="inferno", alpha=0.6, vmin=0.0, vmax=1.0)
  axes[1].set_title("attention", fontsize=9)
  for ax in axes:
    ax.axis("off")
  if title:
    fig.suptitle(title)
  return finish(fig, save_path)
