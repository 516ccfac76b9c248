"""benchmarks/reproduce.py: the records' numbers as claims, comparison with tolerances, exit
status, commands."""

import json
import os

import pytest

from bench_loader import REPO, load_benchmark

reproduce = load_benchmark("reproduce")
Claim = reproduce.Claim
WHERE = "docs/results/a/record.json"
CLAIMS = (Claim("a", "eval/wer", 73.4, 2.0, WHERE),
          Claim("a", "eval/loss", 0.603, 0.01, WHERE),
          Claim("b", "eval/per", 20.0, 1.0, "docs/results/b/record.json"))


def _record(repo, run, metrics):
  """Writes docs/results/<run>/record.json under `repo` with these metrics."""
  path = repo / "docs" / "results" / run
  path.mkdir(parents=True)
  (path / "record.json").write_text(json.dumps({"name": run, "metrics": metrics}))


def test_claims_are_the_records_dev_metrics_with_the_scripts_tolerances(tmp_path):
  """Each run's claims are its record's dev_* metrics that have a tolerance (test metrics, null
  values and metrics without a tolerance are not claims); a missing record, or one with nothing
  to compare, is one line naming the record."""
  _record(tmp_path, "a", {"dev_wer": 39.4, "dev_per": 9.9, "dev_loss": 0.343, "test_wer": 40.4,
                          "dev_accuracy": None, "dev_perplexity": 1.41})
  assert reproduce.load_claims(["a"], str(tmp_path)) == (
      Claim("a", "eval/wer", 39.4, 2.0, WHERE), Claim("a", "eval/per", 9.9, 1.0, WHERE),
      Claim("a", "eval/loss", 0.343, 0.01, WHERE))
  with pytest.raises(ValueError, match=r"^docs/results/b/record.json: no such record"):
    reproduce.load_claims(["a", "b"], str(tmp_path))
  (tmp_path / "docs/results/b").mkdir()
  (tmp_path / "docs/results/b/record.json").write_text("{")
  with pytest.raises(ValueError, match=r"b/record.json: no record metrics .*JSONDecodeError"):
    reproduce.load_claims(["b"], str(tmp_path))
  _record(tmp_path, "c", {"test_wer": 40.4})
  with pytest.raises(ValueError, match=r"c/record.json: no dev_\* metric among accuracy"):
    reproduce.load_claims(["c"], str(tmp_path))


def test_compare_applies_each_tolerance_in_record_units_and_fails_missing_metrics():
  """The run's fractions are compared in the record's units (percent points for WER): a value
  within its absolute tolerance passes, one beyond it fails, a metric the run did not write
  fails, and claims of runs not measured are left out."""
  measured = {"a": {"metrics": {"eval/wer": 0.7539, "eval/loss": 0.6141}}}
  rows = reproduce.compare(CLAIMS, measured)
  assert [(c.metric, round(v, 4), ok) for c, v, ok in rows] == [
      ("eval/wer", 75.39, True), ("eval/loss", 0.6141, False)]
  rows = reproduce.compare(CLAIMS, {"b": {"error": "train.py exited 1: boom"}})
  assert [(c.run, v, ok) for c, v, ok in rows] == [("b", None, False)]


def test_report_prints_pass_fail_and_the_measured_values_in_record_units():
  """The table says PASS/FAIL with values as the docs write them, then each record's measured
  metrics under the record's keys, rounded as the docs write them."""
  rows = reproduce.compare(CLAIMS, {"a": {"metrics": {"eval/wer": 0.7539, "eval/loss": 0.6141}}})
  text = reproduce.report(rows)
  assert "73.4%" in text and "75.4%" in text and "PASS" in text and "FAIL" in text
  assert f'{WHERE}: {{"dev_wer": 75.4, "dev_loss": 0.614}}' in text


def test_as_written_matches_the_docs_conventions():
  """Rates are written as percentages with one decimal, losses with three decimals."""
  assert reproduce.as_written("eval/wer", 73.4) == "73.4%"
  assert reproduce.as_written("eval/accuracy", 81.25) == "81.2%"
  assert reproduce.as_written("eval/loss", 0.6029) == "0.603"


def test_main_runs_each_documented_command_and_exits_by_the_comparison(tmp_path, monkeypatch,
                                                                        capsys):
  """main() runs the documented train.py command of each selected run with a fresh workdir under
  --workdir and the given data dir, compares with the run's record, writes --results, and exits
  0 only when every claim holds; an unknown run name is a usage error naming it, a run without
  a record one error line."""
  calls = []
  _record(tmp_path, "g2p_tiny", {"dev_wer": 39.4, "dev_per": 9.9})

  def fake_train(run, workdir, data_dir):
    calls.append(reproduce.command(run, workdir, data_dir))
    return {"metrics": {"eval/wer": 0.394, "eval/per": 0.099}, "wall_clock_s": 1.0}

  monkeypatch.setattr(reproduce, "REPO", str(tmp_path))
  monkeypatch.setattr(reproduce, "train", fake_train)
  args = ["--only=g2p_tiny", f"--data_dir={tmp_path / 'd'}", f"--workdir={tmp_path / 'w'}",
          f"--results={tmp_path / 'r.json'}"]
  assert reproduce.main(args) == 0
  assert calls == [[reproduce.sys.executable, "train.py", "--config=configs/g2p.py:tiny",
                    f"--workdir={tmp_path / 'w' / 'g2p_tiny'}",
                    f"--config.data.data_dir={tmp_path / 'd'}"]]
  assert set(json.load(open(tmp_path / "r.json"))) == {"g2p_tiny"}
  assert "FAIL" not in capsys.readouterr().out
  monkeypatch.setattr(reproduce, "train",
                      lambda *a: {"metrics": {"eval/wer": 0.5}, "wall_clock_s": 1.0})
  assert reproduce.main(args[:-1]) == 1
  with pytest.raises(SystemExit):
    reproduce.main(["--only=g2p_huge"])
  assert "unknown run 'g2p_huge'" in capsys.readouterr().err
  assert reproduce.main(["--only=g2p_decoder_only_tiny"]) == 1
  assert capsys.readouterr().err.startswith(
      "error: docs/results/g2p_decoder_only_tiny/record.json: no such record")


def test_every_documented_run_has_a_config_and_a_record_to_compare_with():
  """Each run's config file exists, its variant is one the file accepts, and its record in
  docs/results gives it something to compare."""
  for run, args in reproduce.RUNS.items():
    path, _, variant = args[0].removeprefix("--config=").partition(":")
    assert os.path.exists(os.path.join(REPO, path))
    module = __import__(f"configs.{os.path.basename(path)[:-3]}", fromlist=["get_config"])
    module.get_config(variant)
    assert reproduce.load_claims([run])


@pytest.mark.slow
def test_train_runs_a_real_command_and_collects_its_results(tmp_path, monkeypatch):
  """train() runs train.py for real (a 2-step g2p:tiny in a fresh data dir) and returns its
  final metrics with the command, git state and the data fingerprint of provenance.json; a
  failing command comes back as one error line, not an exception."""
  tiny = ["--config=configs/g2p.py:tiny", "--config.train.num_steps=2",
          "--config.eval.every_steps=2", "--config.checkpoint.every_steps=2",
          "--config.eval.num_batches=1", "--config.eval.num_decode_examples=4"]
  monkeypatch.setitem(reproduce.RUNS, "smoke", tiny)
  monkeypatch.setitem(reproduce.RUNS, "broken", ["--config=configs/g2p.py:huge"])
  got = reproduce.train("smoke", str(tmp_path / "w"), str(tmp_path / "d"))
  assert got["step"] == 2 and {"eval/wer", "eval/loss"} <= set(got["metrics"])
  assert got["data"]["dataset"] == "cmudict_g2p/no_stress" and got["git_sha"]
  bad = reproduce.train("broken", str(tmp_path / "b"), str(tmp_path / "d"))
  assert bad["error"].startswith("train.py exited 1") and "huge" in bad["error"]
