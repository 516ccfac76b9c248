"""Tests of transformer/infer/viz.py: each plot shows exactly the data it was given, labelled, as a PNG."""

import json

import numpy as np
import pytest

from transformer.infer import viz

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_plot_attention_one_panel_per_head_with_token_labels(tmp_path):
  """A [heads, queries, keys] array becomes one heat map per head showing that head's weights,
  with the query tokens on the y axis and the key tokens on the x axis; saved as a PNG."""
  w = _softmax(np.random.default_rng(0).normal(size=(3, 4, 5))).astype(np.float32)
  queries, keys = ["<s>", "K", "AE", "T"], list("cats")[:4] + ["</s>"]
  path = tmp_path / "att" / "a.png"
  fig = viz.plot_attention(w, queries, keys, title="cross", save_path=str(path))
  panels = [ax for ax in fig.axes if ax.images]
  assert len(panels) == 3
  for h, ax in enumerate(panels):
    np.testing.assert_array_equal(ax.images[0].get_array(), w[h])
    assert [t.get_text() for t in ax.get_xticklabels()] == keys
    assert [t.get_text() for t in ax.get_yticklabels()] == queries
  assert path.read_bytes().startswith(PNG_MAGIC)
  with pytest.raises(ValueError, match="3 queries labels for 4 queries"):
    viz.plot_attention(w, queries[:3], keys)


def test_plot_positional_encoding_matches_the_paper_formula():
  """The left panel is PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...) computed here in
  NumPy, and the right panel its dot-product similarity PE @ PE^T."""
  length, d = 20, 16
  p, j = np.arange(length)[:, None], np.arange(d)[None, :]
  angle = p / 10000.0 ** (2 * (j // 2) / d)
  table = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
  fig = viz.plot_positional_encoding(max_len=length, d_model=d)
  left, right = [ax for ax in fig.axes if ax.images]
  np.testing.assert_allclose(left.images[0].get_array(), table, atol=1e-5)
  np.testing.assert_allclose(right.images[0].get_array(), table @ table.T, atol=1e-4)


def test_plot_label_efficiency_draws_each_initialisation_in_percent(tmp_path):
  """One line per initialisation at the given label fractions (as %), plus the dashed baseline."""
  path = tmp_path / "le.png"
  results = {"scratch": {0.01: 0.75, 0.1: 0.77, 1.0: 0.78}, "pretrained": {1.0: 0.8, 0.01: 0.76}}
  fig = viz.plot_label_efficiency(results, baseline=0.72, save_path=str(path))
  lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
  np.testing.assert_allclose(lines["scratch"].get_xdata(), [1, 10, 100])
  np.testing.assert_allclose(lines["scratch"].get_ydata(), [75, 77, 78])
  np.testing.assert_allclose(lines["pretrained"].get_ydata(), [76, 80])
  np.testing.assert_allclose(lines["majority class"].get_ydata(), [72, 72])
  assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_label_efficiency_draws_the_spread_as_error_bars():
  """With `spread`, each point's (low, high) becomes an error bar around its value, in percent
  (75 with 74-77 spans 74..77); a point it omits gets a zero bar; a range missing its value fails."""
  results = {"scratch": {0.01: 0.75, 1.0: 0.78}}
  fig = viz.plot_label_efficiency(results, spread={"scratch": {0.01: (0.74, 0.77)}})
  (bars,) = fig.axes[0].containers
  assert bars.get_label() == "scratch"
  np.testing.assert_allclose(np.asarray(bars.lines[0].get_ydata(), float), [75, 78])
  segments = bars.lines[2][0].get_segments()
  np.testing.assert_allclose(np.array([s[:, 1] for s in segments], float), [[74, 77], [78, 78]])
  with pytest.raises(ValueError, match="spread of 'scratch' does not contain"):
    viz.plot_label_efficiency(results, spread={"scratch": {1.0: (0.79, 0.8)}})
