"""transformer.run.metrics_log, the one reader of metrics.jsonl, and its readers (compare, the
sweep report and watcher, resume, the plots): any bytes, NaN and infinities, torn and huge lines;
one warning naming the file and line, never a traceback, NaN shown and never averaged away."""

import json
import os

import pytest

from tests.run.test_compare import make_run
from transformer.run import compare, curves, table
from transformer.run import metrics_log, reporting
from transformer.sweeps import report, spec, watch

HOSTILE = (b'{"step": 1, "train/loss": 2.5}\n'
           b'\xff\xfe stray bytes\n'
           b'{"step": 2, "train/loss": NaN, "note": "text", "deep": {"a": 1}}\n'
           b'{"step": 3, "train/loss": Infinity, "eval/loss": -Infinity}\n'
           b'[1, 2]\n'
           b'{"train/loss": 1.0}\n'
           b'{"step": true, "train/loss": 1.0}\n'
           b'{"step": 4, "big": 1' + b'0' * 400 + b'}\n'
           + b'{"step": 5, "x": "' + b'a' * (metrics_log.MAX_LINE_BYTES + 10) + b'"}\n'
           + b'[' * 100000 + b'\n'
           b'{"step": 6, "train/loss": 1.5}\n'
           b'{"step": 7, "train/lo')


def _rows(rows):
  return [(r["step"], r.get("train/loss")) for r in rows]


def test_every_kind_of_line_is_read_or_named_once(tmp_path, caplog):
  """The rows that are rows, NaN and infinities kept, values that are not numbers dropped; the
  rest (stray bytes, non-objects, rows without an integer step, a huge line, deep nesting, a torn
  end) in one warning naming the file and the first such line."""
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(HOSTILE)
  rows = metrics_log.read(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 6]
  assert rows[1]["train/loss"] != rows[1]["train/loss"] and set(rows[1]) == {"step", "train/loss"}
  assert rows[2]["train/loss"] == float("inf") and rows[2]["eval/loss"] == float("-inf")
  assert set(rows[3]) == {"step"}  # an integer too large for a float is dropped
  warnings = [r.getMessage() for r in caplog.records if "metrics.jsonl" in r.getMessage()]
  assert warnings == [f"{path}:2: bytes that are not UTF-8 (and 6 more lines): skipped"]
  metrics_log.read(str(tmp_path))  # a watcher polling: named once per process
  assert len([r for r in caplog.records if "metrics.jsonl" in r.getMessage()]) == 1


def test_compare_shows_nan_and_never_averages_it_away(tmp_path, capsys):
  """compare on runs whose logs hold stray bytes and NaN: exit 0, the NaN run's loss NaN; a seed
  group holding a NaN has a NaN mean (not the other seeds' mean); best ignores a NaN."""
  a = make_run(tmp_path / "s0", seed=0, overrides={"checkpoint.keep_best_by": "eval/wer"})
  b = make_run(tmp_path / "s1", seed=1, overrides={"checkpoint.keep_best_by": "eval/wer"})
  with open(os.path.join(b, "metrics.jsonl"), "ab") as f:
    f.write(b'\x00\xff{"step": 1000, "ev\n{"step": 1000, "train/loss": NaN, "eval/wer": NaN}\n')
  assert compare.main([a, b]) == 0
  assert "| nan |" in capsys.readouterr().out
  result = compare.compare([a, b], group=False)
  assert result.run_rows[1]["train/loss"] != result.run_rows[1]["train/loss"]
  assert result.run_rows[1]["best dev/wer"] == pytest.approx(0.6)  # 0.5 + 100/1000, not NaN
  grouped = compare.compare([a, b]).rows[0]["train/loss"]
  assert grouped.mean != grouped.mean and table.format_cell("train/loss", grouped) == "nan"
  assert table.Spread.of([1.0, float("inf")]).mean == float("inf")


def test_the_sweep_report_never_bolds_a_nan(tmp_path):
  """A point whose metric is NaN is not the best (min() would pick it when first)."""
  rows = [{"point": "a", "dev/loss": float("nan")}, {"point": "b", "dev/loss": 2.0},
          {"point": "c", "dev/loss": 3.0}]
  text = report.markdown(rows, "dev/loss")
  assert "| b | **2** |" in text and "| a | nan |" in text
  fig = report.metric_figure(rows, "dev/loss")  # bars for the finite points only
  assert [p.get_width() for p in fig.axes[0].patches] == [2.0, 3.0]
  curves.plt.close(fig)


def test_watch_viz_and_the_sweep_report_read_a_hostile_log(tmp_path):
  """The watcher's status line, the plots and the report's rows from a log of every bad line."""
  (tmp_path / "p").mkdir()
  (tmp_path / "p" / "metrics.jsonl").write_bytes(HOSTILE)
  point = spec.Point(0, {}, "p", str(tmp_path / "p"), 10)
  assert watch.status_line("p", watch.metrics_rows(point.workdir), 10).startswith(
      "p: step 6/10  loss 1.5")
  assert [r["step"] for r in curves.read_metrics(str(tmp_path / "p"))] == [1, 2, 3, 4, 6]
  curves.plt.close(curves.plot_learning_curves(str(tmp_path / "p")))
  assert report.collect([point])[0]["steps"] == 6


def test_resume_keeps_the_rows_bytes_and_drops_what_is_no_row(tmp_path):
  """A resume rewrites metrics.jsonl without the lines that hold no row and the rows after its
  checkpoint, the kept rows byte for byte (NaN included); stray bytes are no traceback."""
  (tmp_path / "metrics.jsonl").write_bytes(HOSTILE)
  rep = reporting.Reporter(str(tmp_path), {}, True, start_step=3, show_progress=False)
  rep.close()
  kept = (tmp_path / "metrics.jsonl").read_bytes().split(b"\n")
  assert kept == [HOSTILE.split(b"\n")[i] for i in (0, 2, 3)] + [b""]
  assert _rows(json.loads(line) for line in kept[:1]) == [(1, 2.5)]
