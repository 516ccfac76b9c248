"""The sweep report (transformer/sweeps/report.py): results.md without the columns the same for
every point (stated once above it), results.csv with every column, and plots whose panels each
have something to compare."""

import csv
import json
import os

import pytest

from transformer.sweeps import report, spec


def _rows():
  return [{"point": "lr=0.5", "lr": "0.5", "params": 12345, "steps": 300, "dev/loss": 1.5,
           "dev/decoded_examples": 16.0, "dev/scored_tokens": 410.0, "test/wer": 0.25,
           "wall_seconds": None, "status": "done"},
          {"point": "lr=1.0", "lr": "1.0", "params": 12345, "steps": 300, "dev/loss": 1.25,
           "dev/decoded_examples": 16.0, "dev/scored_tokens": 410.0, "test/wer": 0.5,
           "wall_seconds": None, "status": "done"}]


def test_constant_columns_are_stated_once_above_the_table(tmp_path):
  """Decoded examples and scored tokens are the same for both points: results.md states them once
  above a table of the point, the swept value, params, steps, status and the metrics; a column
  empty for every point is dropped unstated; the CSV keeps every column (a program reading it
  finds the same columns in every sweep). One point: nothing is dropped."""
  rows = _rows()
  assert report.markdown(rows, "test/wer").splitlines() == [
      "Same for every point: dev/decoded_examples 16, dev/scored_tokens 410.",
      "",
      "| point | lr | params | steps | dev/loss | test/wer | status |",
      "|---|---|---|---|---|---|---|",
      "| lr=0.5 | 0.5 | 12,345 | 300 | 1.5 | **0.25** | done |",
      "| lr=1.0 | 1.0 | 12,345 | 300 | 1.25 | 0.5 | done |"]
  tied = [r | {"test/wer": 0.25} for r in rows]  # every point ties: no value is singled out
  assert "**" not in report.markdown(tied, "test/wer")
  f1 = [r | {"test/f1": v} for r, v in zip(rows, (0.4, 0.6))]
  assert "**0.6**" in report.markdown(f1, "test/f1")  # F1: higher is better
  report.write_csv(rows, str(tmp_path / "results.csv"))
  with open(tmp_path / "results.csv") as f:
    assert next(csv.reader(f)) == report.columns(rows)
  assert report.markdown(rows[:1]).splitlines()[0].startswith("| point | lr | params | steps |")
  assert "dev/decoded_examples" in report.markdown(rows[:1]).splitlines()[0]


def _point(tmp_path, name, rows):
  workdir = tmp_path / name
  workdir.mkdir()
  with open(workdir / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return spec.Point(0, {}, name, str(workdir), 20)


def test_plots_have_only_panels_with_something_to_compare(tmp_path):
  """curves.png gets a panel per curve that two points logged; no such curve, no file.
  results.png needs the metric of two points or more."""
  train = [{"step": s, "train/loss": 1.0 / s} for s in (10, 20)]
  pair = [_point(tmp_path, f"a{i}", train + [{"step": 20, "eval/loss": 1.0}]) for i in range(2)]
  path = str(tmp_path / "curves.png")
  assert report.plot_curves(pair, "test/wer", path) and os.path.exists(path)
  alone = _point(tmp_path, "b", [{"step": 10, "eval/wer": 0.7}, {"step": 20, "eval/wer": 0.5}])
  assert not report.plot_curves([alone, _point(tmp_path, "c", [])], "test/wer",
                                str(tmp_path / "none.png"))
  assert not os.path.exists(tmp_path / "none.png")
  rows = _rows()
  assert len(report.metric_figure(rows, "test/wer").axes) == 1
  assert report.metric_figure(rows[:1] + [rows[1] | {"test/wer": None}], "test/wer") is None
  out = report.write_report([_point(tmp_path, "d", train[:1])], str(tmp_path / "w"))
  assert "plot" not in out and os.path.exists(out["md"])  # one point: nothing to compare


def test_the_report_never_replaces_a_file_it_did_not_write(tmp_path):
  """results.md a user wrote in the sweep's workdir is refused before anything is read, and kept;
  the files the report wrote itself are replaced by the next report; a workdir inside a run is
  refused."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "results.md").write_text("my notes\n")
  point = _point(tmp_path, "d", [{"step": 10, "train/loss": 1.0}])
  with pytest.raises(spec.SweepError, match="results.md exists and was not written here"):
    report.write_report([point], str(workdir))
  assert (workdir / "results.md").read_text() == "my notes\n"
  (workdir / "results.md").unlink()
  first = report.write_report([point], str(workdir))["markdown"]
  assert report.write_report([point], str(workdir), title="again")["markdown"] == first
  assert (workdir / "results.md").read_text().startswith("again\n")
  (tmp_path / "d" / "checkpoints").mkdir()  # d is now a run's workdir
  with pytest.raises(spec.SweepError, match="inside the run"):
    report.write_report([point], str(tmp_path / "d" / "sweep"))


def test_a_sweep_workdir_from_before_its_files_were_recorded_stays_the_sweeps(tmp_path):
  """A workdir holding a sweep's manifest (sweep.json) and no record of what was written there
  is a sweep's from before: its report files are replaced (and recorded from then on); a
  sweep.json that is not a manifest protects nothing."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "results.md").write_text("an older report\n")
  (workdir / "sweep.json").write_text('{"config": "c.py", "sweep": "s.py", "base_overrides": {}, '
                                      '"points": []}')
  point = _point(tmp_path, "d", [{"step": 10, "train/loss": 1.0}])
  report.write_report([point], str(workdir))
  assert (workdir / "results.md").read_text() != "an older report\n"
  (workdir / ".written.json").unlink()
  (workdir / "sweep.json").write_text('{"my": "notes"}')
  with pytest.raises(spec.SweepError, match="sweep.json, .*curves.png exist and were not written"):
    report.write_report([point], str(workdir))
