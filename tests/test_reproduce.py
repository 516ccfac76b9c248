"""benchmarks/reproduce.py: comparison with tolerances, paste-ready rows, exit status, commands."""

import json
import os

import pytest

from bench_loader import REPO, load_benchmark

reproduce = load_benchmark("reproduce")
Claim = reproduce.Claim
CLAIMS = (Claim("a", "eval/wer", 0.734, 0.02, "README.md"),
          Claim("a", "eval/loss", 0.603, 0.01, "configs/g2p.py"),
          Claim("b", "eval/per", 0.2, 0.01, "README.md"))


def test_compare_applies_each_tolerance_and_fails_missing_metrics():
  """A value within its absolute tolerance passes, one beyond it fails, a metric the run did not
  write fails, and claims of runs not measured are left out."""
  measured = {"a": {"metrics": {"eval/wer": 0.7539, "eval/loss": 0.6141}}}
  rows = reproduce.compare(CLAIMS, measured)
  assert [(c.metric, v, ok) for c, v, ok in rows] == [
      ("eval/wer", 0.7539, True), ("eval/loss", 0.6141, False)]
  rows = reproduce.compare(CLAIMS, {"b": {"error": "train.py exited 1: boom"}})
  assert [(c.run, v, ok) for c, v, ok in rows] == [("b", None, False)]


def test_report_prints_pass_fail_and_rows_that_paste_back():
  """The table says PASS/FAIL with values as the docs write them, and the printed rows evaluate
  to the claims with the measured values (rounded to the docs' precision): paste-ready."""
  rows = reproduce.compare(CLAIMS, {"a": {"metrics": {"eval/wer": 0.7539, "eval/loss": 0.6141}}})
  text = reproduce.report(rows)
  assert "73.4%" in text and "75.4%" in text and "PASS" in text and "FAIL" in text
  pasted = [eval(line.strip().rstrip(","), {"Claim": Claim})  # pylint: disable=eval-used
            for line in text.splitlines() if line.strip().startswith("Claim(")]
  assert pasted == [CLAIMS[0]._replace(stated=0.754), CLAIMS[1]._replace(stated=0.614)]


def test_as_written_matches_the_docs_conventions():
  """Rates are written as percentages with one decimal, losses with three decimals."""
  assert reproduce.as_written("eval/wer", 0.734) == "73.4%"
  assert reproduce.as_written("eval/accuracy", 0.8125) == "81.2%"
  assert reproduce.as_written("eval/loss", 0.6029) == "0.603"


def test_main_runs_each_documented_command_and_exits_by_the_comparison(tmp_path, monkeypatch,
                                                                        capsys):
  """main() runs the documented train.py command of each selected run with a fresh workdir under
  --workdir and the given data dir, writes --results, and exits 0 only when every claim holds;
  an unknown run name is a usage error naming it."""
  calls = []

  def fake_train(run, workdir, data_dir):
    calls.append(reproduce.command(run, workdir, data_dir))
    return {"metrics": {c.metric: c.stated for c in reproduce.CLAIMS if c.run == run},
            "wall_clock_s": 1.0}

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


def test_every_documented_command_names_an_existing_config():
  """Each run's config file exists and its variant is one the file accepts."""
  for args in reproduce.RUNS.values():
    path, _, variant = args[0].removeprefix("--config=").partition(":")
    assert os.path.exists(os.path.join(REPO, path))
    module = __import__(f"configs.{os.path.basename(path)[:-3]}", fromlist=["get_config"])
    module.get_config(variant)


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
