"""transformer.run.compare: runs side by side, from workdirs written by hand (config.json of a
validated config, metrics.jsonl, train_done.json, provenance.json, metrics.<split>.json); no
training. The differing keys, the warnings, the seed groups' numbers, globs, bad paths, the plot,
the command line, and the sweep report's table built with the same functions."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import transformer
from transformer import config as config_lib, schema
from transformer.run import compare, results, table
from transformer.sweeps import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fingerprint(train_sha="aaa", dev_sha="bbb"):
  """A provenance.json data fingerprint of two splits (array_record contents)."""
  split = lambda sha: {"files": 1, "bytes": 100, "records": 10, "records_sha256": sha}  # noqa: E731
  return {"dataset": "cmudict_g2p", "version": "1.0.0", "dir": "/data/cmudict_g2p/1.0.0",
          "splits": {"train": split(train_sha), "validation": split(dev_sha)}}


def make_run(path, steps=1000, seed=0, overrides=None, done=True, dev_wer=0.5, train_loss=0.3,
             eval_every=500, data=None, test=None, decoded=100):
  """A workdir as a run leaves it: eval/* every `eval_every` steps (dev_wer + 100/step),
  train/loss every 100 (train_loss at the end), rates of 2 steps/s and 1,800 tokens/s."""
  cd = schema.get_config()
  cd.seed, cd.train.num_steps = seed, steps
  cd.update_from_flattened_dict(dict(overrides or {}))
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config_lib.to_dict(config_lib.from_configdict(cd)), f)
  with open(os.path.join(path, "provenance.json"), "w") as f:
    json.dump({"git": "abc", "data": data or fingerprint()}, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for s in range(100, steps + 1, 100):
      f.write(json.dumps({"step": s, "train/loss": train_loss * steps / s,
                          "perf/steps_per_sec": 2.0, "perf/tokens_per_sec": 2000.0,
                          "perf/nonpad_tokens_per_sec": 1800.0, "time/elapsed_s": s / 2}) + "\n")
      if s % eval_every == 0:
        f.write(json.dumps({"step": s, "eval/loss": 10 / s, "eval/wer": dev_wer + 100 / s,
                            "eval/decoded_examples": decoded}) + "\n")
  if done:
    with open(os.path.join(path, "train_done.json"), "w") as f:
      json.dump({"step": steps, "reason": "num_steps", "wall_seconds": steps / 2 + 1.5,
                 "metrics": {}}, f)
  if test is not None:
    with open(os.path.join(path, "metrics.test.json"), "w") as f:
      json.dump({"split": "test", "step": steps, "wer": test, "loss": 2 * test,
                 "decode": "greedy", "coverage": {"decoded_examples": 50}}, f)
  return str(path)


def test_the_differing_keys_and_only_they_are_columns(tmp_path):
  """An ablation of two keys against its baseline: exactly those keys are columns, in the
  config's order; steps, tokens and wall clock (equal) are left out, results are not."""
  a = make_run(tmp_path / "base", dev_wer=0.5)
  b = make_run(tmp_path / "rope", dev_wer=0.4, overrides={"model.positional": "rope",
                                                          "train.learning_rate": 0.5})
  result = compare.compare([a, b])
  assert result.keys == ["model.positional", "train.learning_rate"]
  assert result.warnings == []
  assert result.columns == ["run", "model.positional", "train.learning_rate", "train/loss",
                            "dev/loss", "dev/wer", "best dev/loss"]
  assert [r["dev/wer"] for r in result.rows] == [pytest.approx(0.6), pytest.approx(0.5)]
  table = result.markdown().splitlines()
  assert table[0] == ("| run | model.positional | train.learning_rate | train/loss | dev/loss | "
                      "dev/wer | best dev/loss |")
  assert table[3] == f"| {b} | rope | 0.5 | 0.3 | 0.01 | 0.5 | 0.01 |"
  # One run alone: every column, nothing to leave out.
  alone = compare.compare([a])
  assert {"steps", "tokens", "wall_seconds", "tokens_per_sec"} <= set(alone.columns)
  assert alone.rows[0]["steps"] == 1000 and alone.rows[0]["wall_seconds"] == 501.5
  assert transformer.compare is compare.compare


def test_tokens_best_and_split_metrics(tmp_path):
  """tokens: each logged window's non-padding tokens per step times its steps; the best value
  of checkpoint.keep_best_by in its mode with its step; eval.py's metrics.<split>.json numbers."""
  a = make_run(tmp_path / "a", steps=600, eval_every=200, test=0.3,
               overrides={"checkpoint.keep_best_by": "eval/wer"})
  with open(os.path.join(a, "metrics.jsonl"), "a") as f:  # a later, worse evaluation
    f.write(json.dumps({"step": 700, "eval/wer": 0.9}) + "\n")
  row = compare.compare([a]).rows[0]
  assert row["tokens"] == pytest.approx(6 * 100 * 1800 / 2)
  assert row["best dev/wer"] == pytest.approx(0.5 + 100 / 600) and row["best step"] == 600
  assert row["test/wer"] == 0.3 and row["test/loss"] == 0.6 and "test/coverage" not in row
  b = make_run(tmp_path / "b", overrides={"checkpoint.keep_best_by": "eval/wer",
                                          "checkpoint.best_mode": "max"})
  assert compare.compare([b]).rows[0]["best dev/wer"] == pytest.approx(0.5 + 100 / 500)


def test_unlike_comparisons_are_flagged_naming_the_runs(tmp_path):
  """A 200-step run against the 1,000-step quickstart, a different evaluation split, other data
  (a key, and a fingerprint), other evaluation sets, an unfinished run: one line each."""
  quick = make_run(tmp_path / "quick")
  short = make_run(tmp_path / "short", steps=200, eval_every=100)
  assert compare.compare([quick, short]).warnings == [
      f"steps differ: 1000 ({quick}), 200 ({short}); compare runs trained equally long"]
  split = make_run(tmp_path / "split", overrides={"data.eval_split": "test"})
  assert compare.compare([quick, split]).warnings == [
      f"different evaluation split: data.eval_split: validation ({quick}), test ({split}); "
      "their dev/* metrics are on different data"]
  half = make_run(tmp_path / "half", overrides={"data.label_fraction": 0.5})
  assert compare.compare([quick, half]).warnings == [
      f"different data: data.label_fraction: 1.0 ({quick}), 0.5 ({half})"]
  other = make_run(tmp_path / "other", data=fingerprint(train_sha="ccc"))
  (line,) = compare.compare([quick, other]).warnings
  assert line.startswith(f"different data: {other} read cmudict_g2p 1.0.0 train (") and (
      "records sha256 ccc" in line and line.endswith(f"({quick}'s data, provenance.json)"))
  fewer = make_run(tmp_path / "fewer", overrides={"eval.num_decode_examples": 20}, decoded=20)
  assert compare.compare([quick, fewer]).warnings == [
      f"different evaluation sets: eval.num_decode_examples: 0 ({quick}), 20 ({fewer})"]
  running = make_run(tmp_path / "running", done=False)
  assert compare.compare([quick, running]).warnings == [
      f"unfinished (no train_done.json): {running} (at step 1000 of 1000)"]
  tested = make_run(tmp_path / "tested", test=0.3)
  assert compare.compare([quick, tested]).warnings == [
      f"no metrics.test.json in {quick} (python eval.py --workdir={quick} --split=test)"]


def test_seed_groups_show_mean_spread_and_n(tmp_path):
  """Runs that differ only in their seeds (here a train.members=seeds:3 run, named by its
  workdir: its members) are one row, n=3, each number's mean and sample standard deviation as
  numpy computes them; another config stays a row of its own."""
  wers, losses = [0.41, 0.45, 0.52], [0.31, 0.29, 0.36]
  for i, (w, l) in enumerate(zip(wers, losses)):
    make_run(tmp_path / "members" / f"seed={i}", seed=i, dev_wer=w - 0.1, train_loss=l)
  other = make_run(tmp_path / "rope", overrides={"model.positional": "rope"})
  result = compare.compare([str(tmp_path / "members"), other])
  assert result.groups == [[0, 1, 2], [3]]
  group, single = result.rows
  assert group["run"] == f"{tmp_path}/members/{{seed=0,seed=1,seed=2}}" and group["n"] == 3
  assert group["seed"] == "0,1,2" and group["model.positional"] == "sinusoidal"
  for column, values in (("dev/wer", wers), ("train/loss", losses)):
    spread = group[column]
    assert spread.n == 3
    assert spread.mean == pytest.approx(np.mean(values))
    assert spread.std == pytest.approx(np.std(values, ddof=1))
    assert (spread.min, spread.max) == (pytest.approx(min(values)), pytest.approx(max(values)))
  assert single["n"] == 1 and single["dev/wer"].n == 1
  text = result.markdown()
  assert f"| {np.mean(wers):.4g} ± {np.std(wers, ddof=1):.4g} |" in text
  assert result.columns[:4] == ["run", "n", "seed", "model.positional"]
  assert len(compare.compare([str(tmp_path / "members"), other], group=False).rows) == 4
  # A spread in its column's unit; a config value as written.
  assert table.format_cell("wall_seconds", table.Spread.of([600, 720])) == "11.0 min ± 1.4 min"
  assert table.format_cell("best step", table.Spread.of([5000, 5000, 6000])) == "5333 ± 577.4"
  assert table.format_cell("steps", table.Spread.of([200, 200])) == "200"
  assert table.format_cell("data.label_fraction", 1.0) == "1.0"


def test_globs_keep_workdirs_once_and_bad_paths_are_one_line(tmp_path, capsys):
  """A glob over a sweep's directory keeps its workdirs (not results.md), each once even when
  also named; a path or glob that names no workdir is one error line and exit status 2."""
  sweep = tmp_path / "sweep"
  a, b = make_run(sweep / "lr=0.5"), make_run(sweep / "lr=1.0")
  (sweep / "results.md").write_text("|")
  assert results.expand([f"{sweep}/*", a]) == [a, b]
  assert results.expand([f"{sweep}/lr=1*"]) == [b]
  for args, culprit in (([a, str(tmp_path / "nowhere")], f"{tmp_path}/nowhere is not a workdir"),
                        ([f"{tmp_path}/x*"], f"{tmp_path}/x* matches no workdir"),
                        ([str(sweep / "results.md")], "results.md is a file, not a workdir"),
                        ([str(tmp_path)], f"{tmp_path} is not a workdir (no config.json)")):
    assert compare.main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and culprit in err, err
  (tmp_path / "broken").mkdir()
  (tmp_path / "broken" / "config.json").write_text("{not json")
  with pytest.raises(results.WorkdirError, match=r"broken/config.json: not a JSON file"):
    compare.compare([str(tmp_path / "broken")])


def test_plot_overlays_only_metrics_several_runs_logged(tmp_path):
  """One panel per metric two runs logged (train/loss, eval/loss; not eval/wer, logged by one;
  never the counts), a seed group as one curve; the PNG is written; None when no metric is
  shared."""
  a = make_run(tmp_path / "a")
  b = make_run(tmp_path / "b", overrides={"model.positional": "rope"})
  for s in (1, 2):
    make_run(tmp_path / f"s{s}", seed=s, overrides={"model.positional": "rope"})
  with open(os.path.join(b, "metrics.jsonl")) as f:
    records = [{k: v for k, v in json.loads(line).items() if k != "eval/wer"} for line in f]
  with open(os.path.join(b, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  result = compare.compare([a, b])
  path = tmp_path / "curves.png"
  fig = result.plot(save_path=str(path))
  assert [ax.get_title() for ax in fig.axes] == ["train/loss", "eval/loss"]
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  grouped = compare.compare([a, str(tmp_path / "s*")]).plot()
  assert [ax.get_title() for ax in grouped.axes] == ["train/loss", "eval/loss", "eval/wer"]
  assert [len(ax.get_lines()) for ax in grouped.axes] == [2, 2, 2]  # a, and the group's mean
  lonely = make_run(tmp_path / "lonely", steps=50)  # logs nothing
  assert compare.compare([a, lonely]).plot() is None


def test_command_line_prints_warnings_above_the_table_and_plots(tmp_path):
  """`python -m transformer.run.compare A B --split=test --plot=F`: the warning, the table
  with test/* columns, the PNG."""
  a = make_run(tmp_path / "g2p_tiny", test=0.4)
  b = make_run(tmp_path / "g2p_tiny_rope", steps=200, eval_every=100, test=0.45,
               overrides={"model.positional": "rope"})
  plot = tmp_path / "curves.png"
  out = subprocess.run([sys.executable, "-m", "transformer.run.compare", a, b, "--split=test",
                        f"--plot={plot}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT), check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert lines[0] == (f"warning: steps differ: 1000 ({a}), 200 ({b}); compare runs trained "
                      "equally long")
  header = lines[2].split(" | ")
  assert header[:3] == ["| run", "model.positional", "train.num_steps"] and "test/wer |" in lines[2]
  assert lines[4].startswith(f"| {a} | sinusoidal | 1000 | 1000 |") and " 0.4 |" in lines[4]
  assert lines[-1] == f"wrote {plot}" and plot.read_bytes()[:4] == b"\x89PNG"


def test_the_sweep_report_leaves_out_constant_columns_and_groups_seeds(tmp_path):
  """report.markdown (table's functions, as compare's): a swept key and counts equal in every point are left
  out (their values stated once above the table), params/steps/status kept; points that differ only in their seeds get a second table."""
  rows = [{"point": f"seed={s},lr={lr}", "seed": str(s), "lr": str(lr), "opt": "adam",
           "params": 1000, "steps": 3, "dev/decoded_examples": 5, "dev/wer": w,
           "status": "done"}
          for (s, lr), w in zip([(0, 1.0), (1, 1.0), (0, 2.0), (1, 2.0)], [0.1, 0.2, 0.3, 0.5])]
  overrides = [{"seed": s, "train.learning_rate": lr} for s, lr in [(0, 1.0), (1, 1.0), (0, 2.0),
                                                                    (1, 2.0)]]
  text = report.markdown(rows, "dev/wer", compare.seed_groups(overrides))
  same, lines = text.splitlines()[:2], text.splitlines()[2:]
  assert same == ["Same for every point: opt adam, dev/decoded_examples 5.", ""]
  assert lines[0] == "| point | seed | lr | params | steps | dev/wer | status |"
  assert lines[2] == "| seed=0,lr=1.0 | 0 | 1.0 | 1,000 | 3 | **0.1** | done |"
  assert lines[9] == "| n | lr | params | steps | dev/wer | status |"  # seeds 0,1 in both
  assert lines[11] == f"| 2 | 1.0 | 1,000 | 3 | 0.15 ± {np.std([0.1, 0.2], ddof=1):.4g} | done |"
  assert lines[12] == f"| 2 | 2.0 | 1,000 | 3 | 0.4 ± {np.std([0.3, 0.5], ddof=1):.4g} | done |"


def test_an_evaluation_file_that_holds_no_metrics_is_named_and_skipped(tmp_path, caplog):
  """metrics.test.json of stray bytes or a JSON list: one warning naming the file; the run's
  other columns are still shown."""
  a = make_run(tmp_path / "a")
  for content in (b"\xff\xfe garbage", b"[1, 2]"):
    with open(os.path.join(a, "metrics.test.json"), "wb") as f:
      f.write(content)
    caplog.clear()
    row = compare.compare([a]).rows[0]
    assert not any(k.startswith("test/") for k in row) and row["steps"] is not None
    assert "metrics.test.json: not a JSON object of eval.py's metrics" in caplog.text
