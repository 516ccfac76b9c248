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


def test_plot_learning_curves_plots_the_logged_values(tmp_path, caplog):
  """Each default metric (train/loss and eval/*) is one panel whose line is the logged (step,
  value) pairs of metrics.jsonl; a corrupt line is skipped with a warning naming file:line."""
  records = [{"step": 10, "train/loss": 3.0, "train/grad_norm": 1.0},
             {"step": 20, "train/loss": 2.5, "eval/loss": 2.7, "eval/wer": 0.9},
             {"step": 30, "train/loss": 2.0},
             {"step": 40, "train/loss": 1.5, "eval/loss": 2.1, "eval/wer": 0.6}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  fig = viz.plot_learning_curves(str(tmp_path), save_path=str(tmp_path / "c.png"))
  panels = {ax.get_title(): ax for ax in fig.axes if ax.lines}
  assert set(panels) == {"train/loss", "eval/loss", "eval/wer"}
  line = panels["train/loss"].lines[0]
  assert list(line.get_xdata()) == [10, 20, 30, 40] and list(line.get_ydata()) == [3.0, 2.5, 2.0, 1.5]
  assert list(panels["eval/wer"].lines[0].get_ydata()) == [0.9, 0.6]
  assert (tmp_path / "c.png").read_bytes().startswith(PNG_MAGIC)
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\nnot json\n')
  viz.plt.close(viz.plot_learning_curves(str(tmp_path)))
  assert f"{tmp_path}/metrics.jsonl:2: not a JSON line" in caplog.text


def test_plot_time_to_quality_places_each_evaluation_at_its_wall_clock_minute(tmp_path):
  """Each run is one line through its (time/elapsed_s / 60, eval/wer x 100) points, rows without
  the metric skipped; a final (minutes, value) is a star in the run's colour; a run that logged
  no elapsed time is an error naming its file."""
  for name, rows in (("a", [(60, None), (120, 0.5), (300, 0.3)]), ("b", [(90, 0.6), (180, 0.4)])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "time/elapsed_s": t} | ({"eval/wer": w} if w is not None else {}))
        + "\n" for i, (t, w) in enumerate(rows)))
  fig = viz.plot_time_to_quality({"A": str(tmp_path / "a"), "B": str(tmp_path / "b")},
                                 finals={"A": (6.0, 0.25)}, save_path=str(tmp_path / "t.png"))
  ax = fig.axes[0]
  curves = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
  assert list(curves["A"].get_xdata()) == [2.0, 5.0] and list(curves["A"].get_ydata()) == [50, 30]
  assert list(curves["B"].get_xdata()) == [1.5, 3.0] and list(curves["B"].get_ydata()) == [60, 40]
  star = [line for line in ax.lines if line.get_marker() == "*"]
  assert len(star) == 1 and list(star[0].get_xdata()) == [6.0] and list(star[0].get_ydata()) == [25]
  assert star[0].get_color() == curves["A"].get_color()
  assert (tmp_path / "t.png").read_bytes().startswith(PNG_MAGIC)
  (tmp_path / "c").mkdir()
  (tmp_path / "c" / "metrics.jsonl").write_text('{"step": 1, "eval/wer": 0.5}\n')
  with pytest.raises(ValueError, match="logged no eval/wer with time/elapsed_s"):
    viz.plot_time_to_quality({"C": str(tmp_path / "c")})


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
