"""The sweep report (transformer/sweeps/report.py): results.md without the columns the same for
every point (stated once above it), results.csv with every column, and plots whose panels each
have something to compare."""

import csv
import json
import os

from transformer.sweeps import report, spec


def _rows():
  return [{"point": "lr=0.5", "lr": "0.5", "params": 12345, "steps": 300, "dev/loss": 1.5,
           "dev/decoded_examples": 16.0, "dev/scored_tokens": 410.0, "test/wer": 0.25,
           "wall_seconds": None, "status": "done"},
          {"point": "lr=1.0", "lr": "1.0", "params": 12345, "steps": 300, "dev/loss": 1.25,
           "dev/decoded_examples": 16.0, "dev/scored_tokens": 410.0, "test/wer": 0.5,
           "wall_seconds": None, "status": "done"}]


def test_constant_columns_are_stated_once_above_the_table(tmp_path):
  """params, steps, decoded examples, scored tokens and status are the same for both points:
  results.md states them once and its table has only the point, the swept value and the metrics
  that differ; a column empty for every point is dropped unstated; the CSV keeps every column
  (a program reading it finds the same columns in every sweep). One point: nothing is dropped."""
  rows = _rows()
  assert report.constant_columns(rows, report.columns(rows)) == {
      "params": 12345, "steps": 300, "dev/decoded_examples": 16.0, "dev/scored_tokens": 410.0,
      "wall_seconds": None, "status": "done"}
  assert report.markdown(rows, "test/wer").splitlines() == [
      "Same for every point: params 12,345, steps 300, dev/decoded_examples 16, "
      "dev/scored_tokens 410, status done.",
      "",
      "| point | lr | dev/loss | test/wer |",
      "|---|---|---|---|",
      "| lr=0.5 | 0.5 | 1.5 | **0.25** |",
      "| lr=1.0 | 1.0 | 1.25 | 0.5 |"]
  report.write_csv(rows, str(tmp_path / "results.csv"))
  with open(tmp_path / "results.csv") as f:
    assert next(csv.reader(f)) == report.columns(rows)
  assert report.markdown(rows[:1]).splitlines()[0] == "| " + " | ".join(
      report.columns(rows[:1])) + " |"
  same_metric = [r | {"test/wer": 0.25} for r in rows]  # a tie: stated, no bold
  assert "test/wer 0.25" in report.markdown(same_metric, "test/wer").splitlines()[0]
  assert "**" not in report.markdown(same_metric, "test/wer")


def _point(tmp_path, name, rows):
  workdir = tmp_path / name
  workdir.mkdir()
  with open(workdir / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return spec.Point(0, {}, name, str(workdir), 20)


def test_plots_have_only_panels_with_something_to_compare(tmp_path):
  """curves.png gets a panel per curve some point logged at two steps or more: with a single
  evaluation (at the end) only train/loss; with two, eval/loss and eval/wer too; no curve at all,
  no figure. results.png needs the metric of two points or more."""
  train = [{"step": s, "train/loss": 1.0 / s} for s in (10, 20)]
  once = [_point(tmp_path, f"a{i}", train + [{"step": 20, "eval/loss": 1.0, "eval/wer": 0.5}])
          for i in range(2)]
  assert report.curve_panels(once, "test/wer") == ["train/loss"]
  fig = report.curves_figure(once, "test/wer")
  assert len(fig.axes) == 1 and fig.axes[0].get_title() == "train/loss"
  twice = _point(tmp_path, "b", train + [{"step": 10, "eval/loss": 2.0, "eval/wer": 0.7},
                                         {"step": 20, "eval/loss": 1.0, "eval/wer": 0.5}])
  fig = report.curves_figure(once + [twice], "test/wer")
  assert [ax.get_title() for ax in fig.axes] == ["train/loss", "eval/loss", "eval/wer"]
  assert report.curves_figure([_point(tmp_path, "c", train[:1])], "test/wer") is None
  rows = _rows()
  assert len(report.metric_figure(rows, "test/wer").axes) == 1
  assert report.metric_figure(rows[:1] + [rows[1] | {"test/wer": None}], "test/wer") is None
  out = report.write_report([_point(tmp_path, "d", train[:1])], str(tmp_path / "w"))
  assert "curves" not in out and "plot" not in out and os.path.exists(out["md"])
