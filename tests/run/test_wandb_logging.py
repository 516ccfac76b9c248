"""Weights & Biases beside TensorBoard (transformer/run/wandb_logging.py), in W&B's offline mode.

A run with train.wandb_project set writes an offline W&B run in its workdir whose config is the
run's config with its provenance, whose history holds the same scalars at the same steps as
metrics.jsonl, and which a resumed run continues (the same run id, from the workdir); without
the key nothing of W&B is written; without the package the key is one ConfigError naming the
extra, before any data loads. No network: WANDB_MODE=offline, and every W&B directory in tmp.
"""

import glob
import importlib.util
import json
import os
import struct

import pytest

import synthetic_task
from transformer.config import ConfigError
from transformer.run import wandb_logging
from transformer.train import loop

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top,wrong-import-position

BLOCK = 32768  # the .wandb file: a LevelDB-style log of protobuf Records in blocks of 32 KiB


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
  for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                      ("WANDB_DISABLE_GIT", "true"), ("WANDB_DISABLE_CODE", "true"),
                      ("WANDB_CONSOLE", "off"), ("WANDB_DIR", str(tmp_path / "wandb_dir")),
                      ("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config")),
                      ("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache")),
                      ("WANDB_DATA_DIR", str(tmp_path / "wandb_data"))):
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("WANDB_API_KEY", raising=False)


def records(path: str) -> list[bytes]:
  """The payloads of the records in a .wandb file (W&B's LevelDB-style transaction log)."""
  data = open(path, "rb").read()
  assert data[:4] == b":W&B", path
  pos, out, pending = 7, [], b""
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
      pos += BLOCK - pos % BLOCK
      continue
    length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
      out.append(pending)
      pending = b""
  return out


def offline_run(path: str) -> tuple[dict, list[dict]]:
  """(config, history rows) of one offline run's .wandb file."""
  config, history = {}, []
  for raw in records(path):
    record = wandb_internal_pb2.Record.FromString(raw)
    kind = record.WhichOneof("record_type")
    if kind == "history":
      history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                      for item in record.history.item})
    elif kind in ("run", "config"):
      items = record.run.config.update if kind == "run" else record.config.update
      config |= {item.key: json.loads(item.value_json) for item in items}
  return {k: v.get("value", v) if isinstance(v, dict) else v for k, v in config.items()}, history


def _train(workdir: str, num_steps: int, **overrides) -> None:
  cd = synthetic_task.config(**{"train.num_steps": num_steps, "train.log_every_steps": 5,
                                "eval.every_steps": 10, **overrides})
  loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())


def _jsonl(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_an_offline_run_logs_what_metrics_jsonl_holds_and_a_resumed_run_continues_it(tmp_path):
  workdir = str(tmp_path / "reverse")
  keys = {"train.wandb_project": "transformer-tests", "train.wandb_mode": "offline"}
  _train(workdir, 10, **keys)
  run_id = open(os.path.join(workdir, wandb_logging.WANDB_RUN_ID)).read().strip()
  first = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", f"run-{run_id}.wandb"))
  assert len(first) == 1
  config, history = offline_run(first[0])
  assert config["train"]["wandb_project"] == "transformer-tests"
  assert config["model"]["d_model"] == 32
  with open(os.path.join(workdir, "provenance.json")) as f:
    assert config["provenance"] == json.load(f)  # the run's provenance, as written beside it
  logged = {(row["step"], k): v for row in history for k, v in row.items() if "/" in k}
  written = {(row["step"], k): v for row in _jsonl(workdir) for k, v in row.items() if k != "step"}
  assert {k for _, k in written} >= {"train/loss", "eval/loss", "time/elapsed_s"}
  assert logged.keys() == written.keys()
  assert all(logged[k] == pytest.approx(v, rel=1e-6) for k, v in written.items())

  _train(workdir, 20, **keys)  # resumed from step 10: the same W&B run, continued
  assert open(os.path.join(workdir, wandb_logging.WANDB_RUN_ID)).read().strip() == run_id
  files = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", f"run-{run_id}.wandb")))
  assert len(files) == 2
  later = {(row["step"], k): v for row in offline_run(next(f for f in files if f != first[0]))[1]
           for k, v in row.items() if "/" in k}
  resumed = {(row["step"], k): v for row in _jsonl(workdir) for k, v in row.items()
             if k != "step" and row["step"] > 10}
  assert later.keys() == resumed.keys() and min(s for s, _ in later) == 15
  assert all(later[k] == pytest.approx(v, rel=1e-6) for k, v in resumed.items())


def test_without_the_key_nothing_of_wandb_is_written(tmp_path):
  workdir = str(tmp_path / "plain")
  _train(workdir, 5)
  assert not os.path.exists(os.path.join(workdir, "wandb"))
  assert not os.path.exists(os.path.join(workdir, wandb_logging.WANDB_RUN_ID))


def test_a_missing_package_is_one_line_naming_the_key_and_the_extra(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(ConfigError) as e:
    _train(str(tmp_path / "w"), 5, **{"train.wandb_project": "p"})  # before any data loads
  assert str(e.value) == ("train.wandb_project='p' needs the wandb package: "
                          "pip install -e '.[wandb]'")
  assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")


def test_an_online_run_without_credentials_or_a_bad_mode_is_refused_before_the_workdir(
    tmp_path, monkeypatch):
  """Online (train.wandb_mode, else WANDB_MODE, else W&B's default) without an API key, or a
  WANDB_MODE W&B does not know, or a project name W&B refuses: one ConfigError before the
  workdir exists, not W&B's traceback after it was written; offline, or a key in the netrc W&B
  reads, passes."""
  monkeypatch.delenv("WANDB_MODE")
  monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
  workdir = tmp_path / "w"
  with pytest.raises(ConfigError, match=r"^train.wandb_project='p' logs online but W&B has no "
                     r"API key \(WANDB_API_KEY, or `wandb login`\); or log locally: "
                     r"--config.train.wandb_mode=offline$"):
    _train(str(workdir), 5, **{"train.wandb_project": "p"})
  assert not workdir.exists()
  monkeypatch.setenv("WANDB_MODE", "ofline")
  with pytest.raises(ConfigError, match=r"^WANDB_MODE='ofline' is not a W&B mode"):
    _train(str(workdir), 5, **{"train.wandb_project": "p"})
  assert not workdir.exists()
  wandb_logging.check_wandb("p", "offline")
  for project, found in (("team/p", r"\(found /\)"), ("p" * 129, r"\(got 129\)")):
    with pytest.raises(ConfigError, match=r"W&B takes at most 128 characters and none of "
                       r"/ \\ # \? % : " + found):
      wandb_logging.check_wandb(project, "offline")
  monkeypatch.setenv("WANDB_MODE", "online")
  (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
  wandb_logging.check_wandb("p")
