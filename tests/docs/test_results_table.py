"""benchmarks/results_table.py: the README's results table is the one the records give."""

import json
import os
import re

import pytest

from bench_loader import REPO, load_benchmark
from test_records import anchors

results_table = load_benchmark("results_table")
README = os.path.join(REPO, "README.md")
LINK = re.compile(r"\]\(([^)#]+)(?:#([^)]*))?\)")


def _record(repo, dirname, **fields):
  """Writes docs/results/<name>/record.json under `repo` with the schema's keys."""
  record = {"name": dirname, "title": f"{dirname} title", "task": "G2P (CMUdict)",
            "config": "configs/g2p.py:fast", "overrides": [], "command": "python train.py",
            "commit": None, "hardware": "2-core x86_64 CPU", "versions": None,
            "wall_clock_s": 2712.0, "rates": {}, "metrics": {"test_wer": 26.1, "test_per": 6.4},
            "seeds": [0], "report": "docs/g2p.md#recipes"} | fields
  path = repo / "docs" / "results" / dirname
  path.mkdir(parents=True)
  (path / "record.json").write_text(json.dumps(record))
  return record


def test_rows_format_each_field_from_the_record(tmp_path):
  """A row shows the task, the config with its overrides, the hardware, the wall clock in
  readable units, the metrics as the docs write them (percent with one decimal, a loss with
  three, the seeds' range and count) and links to the report and the record."""
  _record(tmp_path, "a", seeds=[0, 1, 2], spread={"test_wer": [25.3, 26.8]},
          overrides=["--config.model.dropout_rate=0.0"])
  _record(tmp_path, "b", config="configs/lm.py:nanogpt_cpu", metrics={"val_loss": 1.8172},
          wall_clock_s=None, hardware="1x NVIDIA H200", report="docs/performance.md#character-lm-against-nanogpt")
  got = results_table.table((("a", ("test_wer", "test_per")), ("b", ("val_loss",))),
                            repo=tmp_path).splitlines()
  assert got[:2] == list(results_table.HEADER)
  assert got[2] == ("| G2P (CMUdict) | `g2p.py:fast` `model.dropout_rate=0.0` | 2-core x86_64 CPU "
                    "| 45.2 min | test WER 26.1% (25.3-26.8%), test PER 6.4%; 3 seeds "
                    "| [g2p](docs/g2p.md#recipes), [record](docs/results/a/record.json) |")
  assert got[3] == ("| G2P (CMUdict) | `lm.py:nanogpt_cpu` | 1x NVIDIA H200 | - | val loss 1.817 "
                    "| [performance](docs/performance.md#character-lm-against-nanogpt), "
                    "[record](docs/results/b/record.json) |")
  assert [results_table.format_wall_clock(s) for s in (42.0, 200.0, 7920.0)] == [
      "42 s", "3.3 min", "2.2 h"]
  assert [results_table.format_value(k, v) for k, v in (
      ("test_per_rope", 11.47), ("x_mfu_pct", 27.6), ("x_tokens_per_s", 319483),
      ("dev_perplexity", 20.74), ("test_f1_scratch", 0.2791))] == [
          "11.5%", "27.6%", "319,483", "20.740", "0.279"]


def test_bad_records_are_one_line_errors_naming_the_file(tmp_path):
  """A missing record, one without a schema key, one whose name is not its directory and a
  metric the record lacks are each a RecordError naming the record.json."""
  error = results_table.RecordError
  with pytest.raises(error, match=r"docs/results/nope/record.json: no such record"):
    results_table.load_record("nope", tmp_path)
  _record(tmp_path, "c", name="other")
  with pytest.raises(error, match=r"c/record.json: name 'other' is not its directory 'c'"):
    results_table.load_record("c", tmp_path)
  (tmp_path / "docs/results/c/record.json").write_text(json.dumps({"name": "c"}))
  with pytest.raises(error, match=r"c/record.json: missing key 'title'"):
    results_table.load_record("c", tmp_path)
  _record(tmp_path, "d")
  with pytest.raises(error, match=r"no metric 'dev_wer' \(has test_wer, test_per\)"):
    results_table.table((("d", ("dev_wer",)),), repo=tmp_path)


def test_check_fails_in_one_line_when_a_number_changes_and_write_repairs_it(tmp_path,
                                                                            monkeypatch, capsys):
  """--write puts the generated table between the markers, --check then passes; after a record's
  number changes --check exits 1 with one line naming the differing row, and --write fixes it."""
  _record(tmp_path, "a")
  monkeypatch.setattr(results_table, "REPO", str(tmp_path))
  monkeypatch.setattr(results_table, "ROWS", (("a", ("test_wer",)),))
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n\n{results_table.BEGIN}\nold\n{results_table.END}\n\nrest\n")
  assert results_table.main(["--write", str(readme)]) == 0
  assert "test WER 26.1%" in readme.read_text() and readme.read_text().endswith("\n\nrest\n")
  assert results_table.main(["--check", str(readme)]) == 0
  path = tmp_path / "docs/results/a/record.json"
  path.write_text(path.read_text().replace("26.1", "25.9"))
  capsys.readouterr()
  assert results_table.main(["--check", str(readme)]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "line 3 of the table" in err and "25.9%" in err
  assert results_table.main(["--write", str(readme)]) == 0
  assert results_table.main(["--check", str(readme)]) == 0
  readme.write_text("no markers\n")
  assert results_table.main(["--check", str(readme)]) == 1
  assert "needs one <!-- results:begin -->" in capsys.readouterr().err


def test_readme_table_is_the_generated_one():
  """README.md's results table equals the one generated from docs/results (so a record whose
  number changes fails this test until the README is regenerated), within the row budget."""
  with open(README, encoding="utf-8") as f:
    _, written, _ = results_table.split_readme(f.read())
  assert len(results_table.ROWS) <= 16
  generated = results_table.table()
  assert written == generated, results_table.difference(written, generated)


def test_every_row_links_a_report_section_and_a_record_that_exist():
  """Each row links a report page that exists (and its heading, when the link names one) and
  the record.json it was generated from."""
  for line in results_table.table().splitlines()[2:]:
    links = LINK.findall(line)
    assert len(links) == 2, line
    (page, anchor), (record, _) = links
    assert os.path.exists(os.path.join(REPO, page)), f"{page} (linked by {line[:60]})"
    assert not anchor or anchor in anchors(os.path.join(REPO, page)), f"{page}#{anchor}"
    assert os.path.exists(os.path.join(REPO, record)), record
