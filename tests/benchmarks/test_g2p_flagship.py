"""benchmarks/g2p_flagship.py: the commands it runs, what it selects on, the seed statistics, and
that an interrupted campaign resumes without rerunning a finished seed (train.py and eval.py
replaced by fakes that write what they would)."""

import json
import os
import re
import statistics

import pytest

from bench_loader import load_benchmark

flagship = load_benchmark("g2p_flagship")
DEV_WER = {0: [0.5, 0.30, 0.32], 1: [0.5, 0.28, 0.27], 2: [0.6, 0.31, 0.35]}  # per evaluation
TEST_WER = {0: 0.33, 1: 0.29, 2: 0.30}


def write_trained(workdir: str, seed: int) -> None:
  """What train.py leaves: metrics.jsonl (DEV_WER's evaluations) and train_done.json."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for i, wer in enumerate(DEV_WER[seed]):
      f.write(json.dumps({"step": 100 * (i + 1), "train/loss": 1.0}) + "\n")
      f.write(json.dumps({"step": 100 * (i + 1), "eval/wer": wer, "eval/per": wer / 4,
                          "time/elapsed_s": 60.0 * (i + 1)}) + "\n")
  with open(os.path.join(workdir, "train_done.json"), "w") as f:
    json.dump({"step": 300}, f)


def fake_run(calls):
  """Stands in for subprocess: train.py writes metrics.jsonl + train_done.json, eval.py writes
  metrics.test.json, each from the seed in the workdir's name (seed<K> or a member's seed=K);
  train.py with train.members writes every member's workdir; eval.py --ensemble writes
  metrics.<split>.json into --out, its WER from the number of members."""
  def run(cmd):
    calls.append(cmd)
    workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
    members = next((a.split("=", 1)[1] for a in cmd if a.startswith("--config.train.members=")),
                   None)
    if cmd[1] == "train.py" and members:
      for member in members.split(";"):
        write_trained(os.path.join(workdir, member), int(member.split("=")[1]))
      return
    seed = int(re.search(r"seed=?(\d+)$", workdir).group(1))
    if cmd[1] == "train.py":
      write_trained(workdir, seed)
    elif any(a.startswith("--ensemble=") for a in cmd):
      out = next(a.split("=", 1)[1] for a in cmd if a.startswith("--out="))
      split = next(a.split("=", 1)[1] for a in cmd if a.startswith("--split="))
      members = next(a.split("=", 1)[1] for a in cmd if a.startswith("--ensemble=")).split(",")
      os.makedirs(out, exist_ok=True)
      with open(os.path.join(out, f"metrics.{split}.json"), "w") as f:
        json.dump({"wer": 0.2 - 0.01 * len(members), "per": 0.05, "loss": 0.25}, f)
    else:
      with open(os.path.join(workdir, "metrics.test.json"), "w") as f:
        json.dump({"wer": TEST_WER[seed], "per": TEST_WER[seed] / 4, "loss": 0.3}, f)
  return run


def test_campaign_selects_on_validation_tests_the_best_checkpoint_and_resumes(tmp_path, monkeypatch):
  """Each seed trains with its seed as both the init and the data-order seed, then eval.py tests
  the checkpoint that was best on validation (--step=best); the summary's validation entry is the
  evaluation with the lowest dev WER; test statistics are the mean/min/max/stdev of the seeds;
  a second invocation with more seeds runs only the new ones; another config in the same
  directory is refused."""
  calls = []
  monkeypatch.setattr(flagship, "_run", fake_run(calls))
  out = str(tmp_path / "fast")
  flagship.main(["--config=configs/g2p.py:fast", "--seeds=0,1", f"--out={out}",
                 "--data_dir=/d", "--config.train.num_steps=300"])
  assert len(calls) == 4
  train, test = calls[0], calls[1]
  assert train[1:4] == ["train.py", "--config=configs/g2p.py:fast", f"--workdir={out}/seed0"]
  assert {"--config.seed=0", "--config.data.shuffle_seed=0", "--config.train.num_steps=300",
          "--config.data.data_dir=/d"} <= set(train)
  assert test[1] == "eval.py" and {"--split=test", "--step=best"} <= set(test)
  flagship.main(["--config=configs/g2p.py:fast", "--seeds=0,1,2", f"--out={out}",
                 "--data_dir=/d", "--config.train.num_steps=300"])
  assert len(calls) == 6 and all("seed2" in " ".join(c) for c in calls[4:])
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["seeds"]["1"]["validation"]["wer"] == 0.27
  assert summary["seeds"]["1"]["validation"]["step"] == 300
  assert summary["seeds"]["0"]["validation"] == pytest.approx(
      {"step": 200, "minutes": 2.0, "wer": 0.30, "per": 0.075, "loss": None, "accuracy": None})
  wers = list(TEST_WER.values())
  assert summary["test"]["wer"] == pytest.approx({"mean": statistics.fmean(wers), "min": 0.29,
                                                  "max": 0.33, "std": statistics.stdev(wers)})
  with pytest.raises(SystemExit, match="campaign of configs/g2p.py:fast"):
    flagship.main(["--config=configs/g2p.py:best", "--seeds=0", f"--out={out}"])
  with pytest.raises(SystemExit):  # only --config.* flags pass on to train.py
    flagship.main(["--config=configs/g2p.py:fast", f"--out={out}", "--num_steps=3"])


def test_plot_labels_two_campaigns_of_one_config_apart(tmp_path, monkeypatch):
  """Campaigns of the same config (e.g. a recipe before and after a change) each keep their lines:
  their labels add the campaign directory's name; a config plotted once keeps its plain label."""
  plotted = {}

  def fake_plot(runs, key, finals, save_path):
    plotted.update(runs=runs, finals=finals, key=key, save=save_path)

  import transformer.run.curves  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(transformer.run.curves, "plot_time_to_quality", fake_plot)
  outs = []
  for name, config, wer in (("fast", "configs/g2p.py:fast", 0.27), ("fast_3600", "configs/g2p.py:fast", 0.29),
                            ("tiny", "configs/g2p.py:tiny", 0.40)):
    out = tmp_path / name
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"config": config, "seeds": {
        "0": {"wall_clock_s": 600.0, "test": {"wer": wer}}}}))
    outs.append(str(out))
  flagship.plot(outs, str(tmp_path / "plot.png"))
  assert plotted["finals"] == {"g2p.py:fast (fast) seed 0": (10.0, 0.27),
                               "g2p.py:fast (fast_3600) seed 0": (10.0, 0.29),
                               "g2p.py:tiny seed 0": (10.0, 0.40)}
  assert plotted["runs"]["g2p.py:fast (fast_3600) seed 0"] == os.path.join(outs[1], "seed0")


def test_ensembles_of_the_first_seeds_at_their_best_checkpoints(tmp_path, monkeypatch):
  """--ensemble evaluates seeds 0+1 and 0+1+2 as ensembles (each member at --step=best, both
  splits, files into their own directory); an ensemble's wall clock is its members' training
  times plus its test evaluation; a rerun evaluates nothing again."""
  calls = []
  monkeypatch.setattr(flagship, "_run", fake_run(calls))
  out = str(tmp_path / "fast")
  argv = ["--config=configs/g2p.py:fast", "--seeds=0,1,2", f"--out={out}", "--ensemble"]
  flagship.main(argv)
  ens = [c for c in calls if any(a.startswith("--ensemble=") for a in c)]
  assert len(calls) == 6 + 4 and len(ens) == 4
  assert ens[0][1:] == ["eval.py", f"--workdir={out}/seed0", f"--ensemble={out}/seed1",
                        f"--out={out}/ensemble0_1", "--split=validation", "--step=best"]
  assert ens[3][1:] == ["eval.py", f"--workdir={out}/seed0",
                        f"--ensemble={out}/seed1,{out}/seed2", f"--out={out}/ensemble0_1_2",
                        "--split=test", "--step=best"]
  summary = json.load(open(os.path.join(out, "summary.json")))
  three = summary["ensembles"]["0,1,2"]
  assert three["seeds"] == [0, 1, 2] and three["test"]["wer"] == pytest.approx(0.18)
  assert summary["ensembles"]["0,1"]["validation"]["wer"] == pytest.approx(0.19)
  trained = sum(summary["seeds"][s]["train_s"] for s in "012")
  assert three["wall_clock_s"] == pytest.approx(trained + three["test_s"], abs=0.11)
  flagship.main(argv)
  assert len(calls) == 10


def test_members_train_the_seeds_as_one_program_then_test_each(tmp_path, monkeypatch):
  """--members: one train.py with train.members=seed=0;seed=1;seed=2, each member tested at its
  best checkpoint, the ensembles over the members' workdirs; an ensemble's wall clock counts the
  one program once; a rerun trains nothing; the same directory without --members is refused."""
  calls = []
  monkeypatch.setattr(flagship, "_run", fake_run(calls))
  out = str(tmp_path / "gpu")
  argv = ["--config=configs/g2p.py:gpu", "--seeds=0,1,2", f"--out={out}", "--members",
          "--ensemble", "--data_dir=/d"]
  flagship.main(argv)
  trains = [c for c in calls if c[1] == "train.py"]
  assert len(trains) == 1
  assert {f"--workdir={out}/members", "--config.train.members=seed=0;seed=1;seed=2",
          "--config.seed=0", "--config.data.data_dir=/d"} <= set(trains[0])
  tests = [c for c in calls if c[1] == "eval.py" and "--split=test" in c and
           not any(a.startswith("--ensemble=") for a in c)]
  assert [t[2] for t in tests] == [f"--workdir={out}/members/seed={s}" for s in range(3)]
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["members"] and summary["seeds"]["1"]["validation"]["wer"] == 0.27
  assert summary["seeds"]["2"]["test"]["wer"] == TEST_WER[2]
  three = summary["ensembles"]["0,1,2"]
  ens = [c for c in calls if any(a.startswith("--ensemble=") for a in c)]
  assert ens[-1][2:4] == [f"--workdir={out}/members/seed=0",
                          f"--ensemble={out}/members/seed=1,{out}/members/seed=2"]
  assert three["wall_clock_s"] == pytest.approx(
      summary["seeds"]["0"]["train_s"] + three["test_s"], abs=0.11)
  n = len(calls)
  flagship.main(argv)
  assert len(calls) == n
  with pytest.raises(SystemExit, match="as members; use another --out"):
    flagship.main(["--config=configs/g2p.py:gpu", "--seeds=0,1,2", f"--out={out}"])
  with pytest.raises(SystemExit):
    flagship.main(["--config=configs/g2p.py:gpu", "--seeds=0", f"--out={out}", "--members"])
