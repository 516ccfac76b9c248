"""benchmarks/encoder_only.py: per-seed workdirs aggregated into mean, range and mean F1 per cell
(checked against hand-computed numbers), the campaign's commands, and resume (finished runs skipped)."""

import json
import os

import pytest

from bench_loader import load_benchmark

enc = load_benchmark("encoder_only")


def _write(runs, name, accuracy, f1):
  os.makedirs(runs / name)
  (runs / name / "metrics.test.json").write_text(json.dumps({"accuracy": accuracy, "f1": f1}))


@pytest.fixture(name="runs")
def _runs(tmp_path):
  runs = tmp_path / "runs"
  for seed, acc, f1 in ((0, 0.75, 0.2), (1, 0.76, 0.3), (2, 0.80, 0.4)):
    _write(runs, f"scratch_0.01_seed{seed}", acc, f1)
  _write(runs, "pretrained_0.01", 0.70, 0.1)        # the old seedless name: seed 0
  _write(runs, "pretrained_0.01_seed1", 0.74, 0.3)
  _write(runs, "pretrained_1.0_seed1", 0.9, 0.5)
  os.makedirs(runs / "mlm_cmudict_seed0")            # not a classifier: ignored
  (runs / "mlm_cmudict_seed0" / "metrics.test.json").write_text('{"perplexity": 11.0}')
  return runs


def test_table_gives_mean_range_and_mean_f1_per_cell(runs):
  """By hand: scratch at 1% has 75, 76, 80 -> mean 77.0, range 75.0-80.0, F1 (0.2+0.3+0.4)/3,
  sample std sqrt((4+1+9)/2)/100; the seedless pretrained_0.01 is seed 0 beside seed 1 (70, 74
  -> 72.0); a cell without runs is '-'; the rows follow scratch, pretrained, pretrained3000."""
  results = enc.collect(str(runs))
  assert sorted(results["scratch"][0.01]) == [0, 1, 2]
  assert sorted(results["pretrained"][0.01]) == [0, 1]
  s = enc.summarise(results["scratch"][0.01])
  assert s["accuracy_mean"] == pytest.approx(0.77) and s["f1_mean"] == pytest.approx(0.3)
  assert (s["accuracy_min"], s["accuracy_max"]) == (0.75, 0.80)
  assert s["accuracy_std"] == pytest.approx(0.07 ** 0.5 / 10)
  assert enc.table(results) == [
      "| initialisation | 1% labels | 100% labels |", "|---|---|---|",
      "| from scratch | 77.0% [75.0-80.0, n=3] (F1 0.300) | - |",
      "| from the MLM checkpoint (1000 steps) | 72.0% [70.0-74.0, n=2] (F1 0.200) "
      "| 90.0% [90.0-90.0, n=1] (F1 0.500) |"]


def test_report_writes_every_seed_and_the_plot_with_ranges(runs, tmp_path):
  """results.json keeps each seed's metrics next to the summary; the plot draws the means with
  min-max error bars (scratch at 1%: 77 with bars down to 75 and up to 80)."""
  out = tmp_path / "out"
  enc.report(str(runs), str(out))
  saved = json.loads((out / "results.json").read_text())
  cell = saved["from scratch"]["0.01"]
  assert cell["per_seed"]["2"] == {"accuracy": 0.80, "f1": 0.4}
  assert cell["summary"]["seeds"] == [0, 1, 2]
  assert cell["summary"]["accuracy_mean"] == pytest.approx(0.77)
  assert (out / "table.md").read_text().splitlines()[2].startswith("| from scratch | 77.0%")
  assert (out / "label_efficiency.png").read_bytes()[:4] == b"\x89PNG"


def test_a_seedless_and_a_seed0_workdir_of_one_cell_is_an_error(runs):
  """Both would be seed 0 of pretrained at 1%: the error names the two workdirs."""
  _write(runs, "pretrained_0.01_seed0", 0.71, 0.1)
  with pytest.raises(ValueError, match="pretrained_0.01 and pretrained_0.01_seed0"):
    enc.collect(str(runs))


def test_commands_are_the_readme_commands_with_the_seed_keys():
  """One seed's runs: both masked LMs first, then per fraction scratch, pretrained (from the
  1000-step LM of the same seed) and pretrained3000, each with the seed, shuffle seed and data dir."""
  cmds = enc.commands("R", 2, ["0.1"], "D")
  seed = " --config.seed=2 --config.data.shuffle_seed=2 --config.data.data_dir=D"
  assert [(w, " ".join(t), " ".join(e)) for w, t, e in cmds] == [
      ("R/mlm_cmudict_seed2", "python train.py --config=configs/mlm.py:cmudict "
       "--workdir=R/mlm_cmudict_seed2" + seed,
       "python eval.py --workdir=R/mlm_cmudict_seed2 --split=test"),
      ("R/mlm_cmudict_3000_seed2", "python train.py --config=configs/mlm.py:cmudict "
       "--config.train.num_steps=3000 --workdir=R/mlm_cmudict_3000_seed2" + seed,
       "python eval.py --workdir=R/mlm_cmudict_3000_seed2 --split=test"),
      ("R/scratch_0.1_seed2", "python train.py --config=configs/classify.py "
       "--config.data.label_fraction=0.1 --workdir=R/scratch_0.1_seed2" + seed,
       "python eval.py --workdir=R/scratch_0.1_seed2 --split=test --step=best"),
      ("R/pretrained_0.1_seed2", "python train.py --config=configs/classify.py "
       "--config.data.label_fraction=0.1 --init_from=R/mlm_cmudict_seed2 "
       "--workdir=R/pretrained_0.1_seed2" + seed,
       "python eval.py --workdir=R/pretrained_0.1_seed2 --split=test --step=best"),
      ("R/pretrained3000_0.1_seed2", "python train.py --config=configs/classify.py "
       "--config.data.label_fraction=0.1 --init_from=R/mlm_cmudict_3000_seed2 "
       "--workdir=R/pretrained3000_0.1_seed2" + seed,
       "python eval.py --workdir=R/pretrained3000_0.1_seed2 --split=test --step=best")]


def test_run_missing_skips_finished_runs(runs, capsys):
  """A dry run of seed 1 at 1% lists exactly the runs without metrics.test.json: both masked LMs
  (their dummy dirs are seed 0) and pretrained3000, not scratch or pretrained."""
  enc.run_missing(str(runs), [1], ["0.01"], None, dry_run=True)
  printed = capsys.readouterr().out.splitlines()
  assert [line.split("--workdir=")[1].split()[0] for line in printed] == [
      str(runs / n) for n in ("mlm_cmudict_seed1", "mlm_cmudict_3000_seed1",
                              "pretrained3000_0.01_seed1")]
