"""Tests of transformer/run/curves.py: each plot shows exactly the metrics a workdir logged, as a
PNG."""

import json

import pytest

from transformer.run import curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_learning_curves_plots_the_logged_values(tmp_path, caplog):
  """Each default metric (train/loss and eval/*) is one panel whose line is the logged (step,
  value) pairs of metrics.jsonl; a corrupt line is skipped with a warning naming file:line."""
  records = [{"step": 10, "train/loss": 3.0, "train/grad_norm": 1.0},
             {"step": 20, "train/loss": 2.5, "eval/loss": 2.7, "eval/wer": 0.9},
             {"step": 30, "train/loss": 2.0},
             {"step": 40, "train/loss": 1.5, "eval/loss": 2.1, "eval/wer": 0.6}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  fig = curves.plot_learning_curves(str(tmp_path), save_path=str(tmp_path / "c.png"))
  panels = {ax.get_title(): ax for ax in fig.axes if ax.lines}
  assert set(panels) == {"train/loss", "eval/loss", "eval/wer"}
  line = panels["train/loss"].lines[0]
  assert list(line.get_xdata()) == [10, 20, 30, 40] and list(line.get_ydata()) == [3.0, 2.5, 2.0, 1.5]
  assert list(panels["eval/wer"].lines[0].get_ydata()) == [0.9, 0.6]
  assert (tmp_path / "c.png").read_bytes().startswith(PNG_MAGIC)
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\nnot json\n')
  curves.plt.close(curves.plot_learning_curves(str(tmp_path)))
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
  fig = curves.plot_time_to_quality({"A": str(tmp_path / "a"), "B": str(tmp_path / "b")},
                                 finals={"A": (6.0, 0.25)}, save_path=str(tmp_path / "t.png"))
  ax = fig.axes[0]
  lines = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
  assert list(lines["A"].get_xdata()) == [2.0, 5.0] and list(lines["A"].get_ydata()) == [50, 30]
  assert list(lines["B"].get_xdata()) == [1.5, 3.0] and list(lines["B"].get_ydata()) == [60, 40]
  star = [line for line in ax.lines if line.get_marker() == "*"]
  assert len(star) == 1 and list(star[0].get_xdata()) == [6.0] and list(star[0].get_ydata()) == [25]
  assert star[0].get_color() == lines["A"].get_color()
  assert (tmp_path / "t.png").read_bytes().startswith(PNG_MAGIC)
  (tmp_path / "c").mkdir()
  (tmp_path / "c" / "metrics.jsonl").write_text('{"step": 1, "eval/wer": 0.5}\n')
  with pytest.raises(ValueError, match="logged no eval/wer with time/elapsed_s"):
    curves.plot_time_to_quality({"C": str(tmp_path / "c")})
