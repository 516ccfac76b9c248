"""benchmarks/reproduce.py: claims read from the records, tolerances, paste-ready metrics, exit
status, commands."""

import json
import os

import pytest

from bench_loader import REPO, load_benchmark

reproduce = load_benchmark("reproduce")
Claim = reproduce.Claim
CLAIMS = (Claim("a", "dev_wer", 73.4, 2.0),
          Claim("a", "dev_loss", 0.603, 0.01),
          Claim("b", "dev_per", 20.0, 1.0))


def write_record(results, name, **fields):
  record = {"name": name, "command": f"python train.py --config=configs/g2p.py:tiny "
                                     f"--workdir=runs/{name}", "overrides": [], "metrics": {}}
  os.makedirs(results / name)
  (results / name / "record.json").write_text(json.dumps(record | fields))


def test_claims_are_the_records_dev_metrics_with_a_tolerance(tmp_path):
  """Each dev metric of a record that has a tolerance is a claim in the record's units; other
  splits (not what train.py's final evaluation measures), unknown metrics and nulls are not."""
  write_record(tmp_path, "r", metrics={"dev_wer": 39.38, "dev_per": 9.93, "dev_loss": 0.3434,
                                       "test_wer": 40.4, "dev_bleu": 1.0, "dev_accuracy": None})
  assert reproduce.claims(("r",), str(tmp_path)) == (
      Claim("r", "dev_wer", 39.38, 2.0), Claim("r", "dev_per", 9.93, 1.0),
      Claim("r", "dev_loss", 0.3434, 0.01))


def test_train_args_are_the_records_command_without_its_workdir(tmp_path):
  """The record's train.py arguments without --workdir, its overrides appended unless the command
  gives them; a command other than `python train.py` is an error naming the record."""
  record = {"name": "r", "command": "python train.py --config=configs/g2p.py:fast "
                                    "--workdir=runs/x --config.model.dropout_rate=0.0",
            "overrides": ["--config.model.dropout_rate=0.0", "--config.seed=1"]}
  assert reproduce.train_args(record) == ["--config=configs/g2p.py:fast",
                                          "--config.model.dropout_rate=0.0", "--config.seed=1"]
  with pytest.raises(ValueError, match="record r: not a train.py command"):
    reproduce.train_args(record | {"command": "python benchmarks/g2p_flagship.py --seeds=0"})


def test_compare_applies_each_tolerance_and_fails_missing_metrics():
  """A value within its absolute tolerance passes (train_done.json's fractions read as the
  record's percentages), one beyond it fails, a metric the run did not write fails, and claims
  of runs not measured are left out."""
  measured = {"a": {"metrics": {"eval/wer": 0.7539, "eval/loss": 0.6141}}}
  rows = reproduce.compare(CLAIMS, measured)
  assert [(c.metric, round(v, 4), ok) for c, v, ok in rows] == [
      ("dev_wer", 75.39, True), ("dev_loss", 0.6141, False)]
  rows = reproduce.compare(CLAIMS, {"b": {"error": "train.py exited 1: boom"}})
  assert [(c.run, v, ok) for c, v, ok in rows] == [("b", None, False)]


def test_report_prints_pass_fail_and_metrics_that_paste_into_the_record():
  """The table says PASS/FAIL with values as the records write them, and the printed line of each
  run is its measured metrics as a record's "metrics" entry."""
  rows = reproduce.compare(CLAIMS, {"a": {"metrics": {"eval/wer": 0.7539, "eval/loss": 0.6141}}})
  text = reproduce.report(rows)
  assert "73.40" in text and "75.39" in text and "PASS" in text and "FAIL" in text
  (line,) = [l for l in text.splitlines() if "docs/results/a/record.json" in l]
  assert json.loads("{" + line.split(": ", 1)[1] + "}") == {
      "metrics": {"dev_wer": 75.39, "dev_loss": 0.6141}}


def test_as_written_matches_the_records_conventions():
  """Rates are percentages with two decimals, losses have four."""
  assert reproduce.as_written("dev_wer", 73.4) == "73.40"
  assert reproduce.as_written("dev_accuracy", 81.256) == "81.26"
  assert reproduce.as_written("dev_loss", 0.60291) == "0.6029"


def test_main_runs_each_records_command_and_exits_by_the_comparison(tmp_path, monkeypatch,
                                                                     capsys):
  """main() runs the record's train.py command of each selected run with a fresh workdir under
  --workdir and the given data dir, writes --results, and exits 0 only when every claim holds;
  an unknown run name is a usage error naming it."""
  calls = []
  record = reproduce.read_record("g2p_tiny")

  def fake_train(args, workdir, data_dir):
    calls.append(reproduce.command(args, workdir, data_dir))
    return {"metrics": {f"eval/{k[4:]}": v / 100 if k[4:] in reproduce.PERCENT else v
                        for k, v in record["metrics"].items() if k.startswith("dev_")},
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


def test_every_rerun_record_has_claims_and_names_an_existing_config():
  """Each run's record states dev WER and loss (what the rerun checks) and its command's config
  file exists and accepts its variant."""
  for run in reproduce.RUNS:
    assert {c.metric for c in reproduce.claims((run,))} >= {"dev_wer", "dev_loss"}, run
    args = reproduce.train_args(reproduce.read_record(run))
    path, _, variant = args[0].removeprefix("--config=").partition(":")
    assert os.path.exists(os.path.join(REPO, path))
    module = __import__(f"configs.{os.path.basename(path)[:-3]}", fromlist=["get_config"])
    module.get_config(variant)


@pytest.mark.slow
def test_train_runs_a_real_command_and_collects_its_results(tmp_path):
  """train() runs train.py for real (a 2-step g2p:tiny in a fresh data dir) and returns its
  final metrics with the command, git state and the data fingerprint of provenance.json; a
  failing command comes back as one error line, not an exception."""
  tiny = ["--config=configs/g2p.py:tiny", "--config.train.num_steps=2",
          "--config.eval.every_steps=2", "--config.checkpoint.every_steps=2",
          "--config.eval.num_batches=1", "--config.eval.num_decode_examples=4"]
  got = reproduce.train(tiny, str(tmp_path / "w"), str(tmp_path / "d"))
  assert got["step"] == 2 and {"eval/wer", "eval/loss"} <= set(got["metrics"])
  assert got["data"]["dataset"] == "cmudict_g2p/no_stress" and got["git_sha"]
  bad = reproduce.train(["--config=configs/g2p.py:huge"], str(tmp_path / "b"), str(tmp_path / "d"))
  assert bad["error"].startswith("train.py exited 1") and "huge" in bad["error"]
