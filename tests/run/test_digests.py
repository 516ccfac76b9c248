"""Checksummed checkpoints and a run's files bound together (transformer/run/checkpoints.py).

A flipped bit, a truncated or missing file, or a missing digest.json is caught before a
checkpoint is used: resume falls back to the newest step that verifies (and the run saves the
failing step anew, bit for bit), evaluation and restore() refuse in one line naming the newest good
step, a divergence names the last checkpoint that verifies. The config and tokenizer a checkpoint
was trained with are recorded in it: an edited config.json or tokenizer file is refused; an edited
records cache of the data is read again from the prepared data.
"""

import glob
import json
import os
import shutil

import pytest

import g2p_mini
import synthetic_task
from test_checkpoints import assert_bitwise_equal, ckpt_cfg, config_dict, toy_state
from transformer.infer import api, evaluation
from transformer.run import checkpoints, digests, restore
from transformer.run.restore import EvaluationError
from transformer.train import loop


def _state_files(step_dir):
  return sorted(glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")))


def flip_bit(path, at=None):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2 if at is None else at] ^= 1
  open(path, "wb").write(bytes(data))


def _largest_state_file(step_dir):
  return max(_state_files(step_dir), key=os.path.getsize)


# ----------------------------------------------------------------------------- digests


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "no_digest"])
def test_verify_step_names_the_damaged_file(tmp_path, damage):
  """verify_step passes an intact step and names what is wrong with a damaged one; the step next
  to it still verifies."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1, keep=3),
                                  config=config_dict())
  ckpt.save(1, toy_state(0))
  ckpt.save(2, toy_state(1))
  ckpt.close()
  step_dir = os.path.join(ckpt.directory, "2")
  assert ckpt.verify(1) is None and ckpt.verify(2) is None
  target = _largest_state_file(step_dir)
  if damage == "flip":
    flip_bit(target)
  elif damage == "truncate":
    with open(target, "r+b") as f:
      f.truncate(os.path.getsize(target) // 2)
  elif damage == "remove":
    os.remove(target)
  else:
    os.remove(os.path.join(step_dir, digests.DIGEST_FILE))
  reason = digests.verify_step(step_dir)
  name = os.path.relpath(target, step_dir)
  expected = {"flip": f"{name} does not match its digest",
              "truncate": f"{name} does not match its digest", "remove": f"{name} is missing",
              "no_digest": "no digest.json"}[damage]
  assert reason is not None and expected in reason, reason
  assert digests.verify_step(os.path.join(ckpt.directory, "1")) is None
  reader = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(), read_only=True)
  assert reader.latest_good_step() == 1
  reader.close()


def test_a_step_written_before_digests_fails_verification(tmp_path):
  """A step without digest.json whose meta has no "digest" key (a format written before digests)
  fails verification in one line."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg(every_steps=1), config=config_dict())
  ckpt.save(1, toy_state())
  ckpt.close()
  step_dir = os.path.join(ckpt.directory, "1")
  os.remove(os.path.join(step_dir, digests.DIGEST_FILE))
  meta_path = os.path.join(step_dir, "meta", "metadata")
  meta = json.load(open(meta_path))
  del meta["digest"]
  json.dump(meta, open(meta_path, "w"))
  assert digests.verify_step(step_dir) == "no digest.json"


# ----------------------------------------------------------------------------- resume


def _read_params(step_dir):
  return restore._read_state(os.path.dirname(step_dir), int(os.path.basename(step_dir)))


def test_resume_falls_back_past_a_corrupt_checkpoint_and_saves_it_anew(tmp_path, caplog):
  """One flipped bit in the latest checkpoint: resume names it in one line, says it resumes from
  the previous step, keeps the damaged copy as <step>.corrupt, and training writes that step
  again bit for bit equal to the original; a divergence after a fallback names the checkpoint
  that verifies."""
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 20, "checkpoint.keep": 3})
  loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())
  step20 = os.path.join(workdir, "checkpoints", "20")
  original = _read_params(step20)
  flip_bit(_largest_state_file(step20))
  longer = synthetic_task.config(**{"train.num_steps": 30, "checkpoint.keep": 3})
  with caplog.at_level("WARNING"):
    result = loop.train_and_evaluate(longer, workdir, task=synthetic_task.ReverseTask())
  assert result["step"] == 30
  lines = [r.getMessage() for r in caplog.records]
  assert any("checkpoints/20 fails verification" in m and "does not match its digest" in m
             for m in lines), lines
  assert any("Resuming from step 10, the newest checkpoint that verifies" in m for m in lines)
  assert os.path.isdir(step20 + digests.CORRUPT_SUFFIX)
  assert digests.verify_step(step20) is None
  assert_bitwise_equal(_read_params(step20), original)

  # The newest checkpoint (30) damaged again, and a loss that turns NaN after the fallback:
  # the divergence names step 20, the newest checkpoint that verifies.
  flip_bit(_largest_state_file(os.path.join(workdir, "checkpoints", "30")))
  longest = synthetic_task.config(**{"train.num_steps": 40, "checkpoint.keep": 3})
  with pytest.raises(loop.TrainingDiverged, match=r"last checkpoint that verifies: step 20 "):
    loop.train_and_evaluate(longest, workdir, task=synthetic_task.ReverseTask(nan_batch=24))


def test_resume_refuses_when_no_checkpoint_verifies(tmp_path):
  workdir = str(tmp_path / "run")
  cd = synthetic_task.config(**{"train.num_steps": 10})
  loop.train_and_evaluate(cd, workdir, task=synthetic_task.ReverseTask())
  flip_bit(_largest_state_file(os.path.join(workdir, "checkpoints", "10")))
  longer = synthetic_task.config(**{"train.num_steps": 20})
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoint in .* verifies"):
    loop.train_and_evaluate(longer, workdir, task=synthetic_task.ReverseTask())
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "10"))  # nothing moved, nothing lost


# ----------------------------------------------------------------------------- reading a run back


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
  """A ReverseTask run with checkpoints at steps 10 and 20: tests/train/test_steps_ema.py's
  (shared; copy it before changing it)."""
  return synthetic_task.trained_run(tmp_path_factory, "ema", **{"train.num_steps": 20,
                                                                 "train.ema_decay": 0.9})


@pytest.fixture(scope="module")
def g2p_run(tmp_path_factory):
  return g2p_mini.trained_run(tmp_path_factory)


def test_evaluation_refuses_a_corrupt_step_and_offers_the_newest_good_one(synthetic_run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(synthetic_run, workdir)
  cfg = restore.load_run_config(workdir)
  flip_bit(_largest_state_file(os.path.join(workdir, "checkpoints", "20")))
  with pytest.raises(EvaluationError) as e:
    restore.read_params(cfg, workdir)
  message = str(e.value)
  assert "\n" not in message
  assert "checkpoints/20 fails verification" in message and "use --step=10" in message, message
  assert restore.read_params(cfg, workdir, step=10).step == 10
  with pytest.raises(EvaluationError, match="fails verification"):
    restore.read_params(cfg, workdir, average_last=2)
  # train.py --init_from has no --step: its advice names what it can do instead.
  from transformer.config import ConfigError  # pylint: disable=g-import-not-at-top
  from transformer.train import finetune  # pylint: disable=g-import-not-at-top
  where = os.path.join(workdir, "checkpoints", "20")
  with pytest.raises(ConfigError) as e:
    finetune.init_params(workdir)
  assert str(e.value).startswith(f"--init_from={workdir}: its newest checkpoint {where} fails "
                                 "verification (") and "--step" not in str(e.value)
  assert str(e.value).endswith(f"--init_from reads the newest step: `mv {where} {where}.corrupt` "
                               "to start from step 10, the newest that verifies")
  os.rename(where, where + ".corrupt")  # the advice, followed
  assert finetune.init_params(workdir) is not None


def test_restore_refuses_an_edited_config_json(g2p_run, tmp_path):
  """config.json edited after training (positional): restore() and eval refuse in one line naming
  the key; an evaluation override of an overridable key stays allowed."""
  workdir = str(tmp_path / "run")
  shutil.copytree(g2p_run, workdir)
  path = os.path.join(workdir, "config.json")
  saved = json.load(open(path))
  saved["model"]["positional"] = "rope" if saved["model"]["positional"] != "rope" else "learned"
  json.dump(saved, open(path, "w"))
  with pytest.raises(EvaluationError, match=r"config.json is not the config checkpoint .* was "
                     r"trained with: model.positional="):
    api.restore(workdir)
  shutil.copy(os.path.join(g2p_run, "config.json"), path)
  cfg = restore.load_run_config(workdir, {"model.attention_impl": "fused",
                                              "data.data_dir": str(tmp_path)})
  assert restore.read_params(cfg, workdir).step == 60


def test_restore_refuses_a_swapped_tokenizer(g2p_run, tmp_path):
  """Two entries of the workdir's tokenizer file swapped: restore() refuses, naming the file."""
  workdir = str(tmp_path / "run")
  shutil.copytree(g2p_run, workdir)
  path = os.path.join(workdir, "tokenizers", "target", "tokenizer.json")
  text = open(path).read()
  tok = json.loads(text)
  units = next(v for v in tok.values() if isinstance(v, list) and len(v) > 6)
  units[4], units[5] = units[5], units[4]
  json.dump(tok, open(path, "w"))
  with pytest.raises(EvaluationError, match=r"tokenizers/target/tokenizer.json is not the "
                     r"tokenizer checkpoint .* was trained with"):
    api.restore(workdir)


def test_an_edited_records_cache_is_read_again(g2p_run, tmp_path, caplog):
  """An edited records-cache file next to the prepared data does not match its digest: it is read
  again from the prepared records (one warning line) and the evaluation is the untouched one's."""
  data = str(tmp_path / "data")
  shutil.copytree(os.path.join(os.path.dirname(g2p_run), "data"), data)
  workdir = str(tmp_path / "run")
  shutil.copytree(g2p_run, workdir)
  overrides = {"data.data_dir": os.path.join(data, "tfds"), "eval.num_decode_examples": 8}
  before = evaluation.evaluate_split(workdir, split="validation", verbose=False,
                                     overrides=overrides)
  caches = glob.glob(os.path.join(data, "tfds", "**", "cache", "validation-*.json"),
                     recursive=True)
  assert len(caches) == 1, caches
  original = json.load(open(caches[0]))
  records = json.loads(json.dumps(original))
  records[0][1], records[1][1] = records[1][1], records[0][1]
  json.dump(records, open(caches[0], "w"), ensure_ascii=False)
  with caplog.at_level("WARNING"):
    after = evaluation.evaluate_split(workdir, split="validation", verbose=False,
                                      overrides=overrides)
  assert any("differs from its digest" in r.getMessage() for r in caplog.records)
  assert after["loss"] == before["loss"] and after["wer"] == before["wer"]
  assert json.load(open(caches[0])) == original  # rewritten from the prepared records


def test_the_data_fingerprint_covers_the_records_cache(g2p_run, tmp_path):
  """provenance.json's data fingerprint holds the digest of the training split's records cache;
  an edited cache is a difference data_difference names."""
  from transformer.run import provenance  # pylint: disable=g-import-not-at-top
  from transformer.data import load_task  # pylint: disable=g-import-not-at-top
  data = str(tmp_path / "data")
  shutil.copytree(os.path.join(os.path.dirname(g2p_run), "data"), data)
  recorded = json.load(open(os.path.join(g2p_run, "provenance.json")))["data"]
  assert recorded["splits"]["train"]["cache_sha256"]
  cfg = restore.load_run_config(g2p_run, {"data.data_dir": os.path.join(data, "tfds")})
  task = load_task(cfg, None, process_index=0, process_count=1)
  assert provenance.data_difference(recorded, provenance.data_fingerprint(task, ["train"]),
                                    "train") is None
  (cache,) = glob.glob(os.path.join(data, "tfds", "**", "cache", "train-*.json"), recursive=True)
  records = json.load(open(cache))
  records[0][1] = records[1][1]
  json.dump(records, open(cache, "w"), ensure_ascii=False)
  difference = provenance.data_difference(recorded, provenance.data_fingerprint(task, ["train"]),
                                          "train")
  assert difference is not None and "records cache" in difference, difference


def test_a_step_directory_renamed_to_another_number_fails_verification(tmp_path):
  """digest.json records its step's directory name: step 60 renamed to 90 does not verify (its
  state says step 60), and the message names the step it was written for."""
  step = tmp_path / "60"
  (step / "state").mkdir(parents=True)
  (step / "state" / "a").write_bytes(b"weights")
  digests.write_step_digest(str(step))
  assert digests.verify_step(str(step)) is None
  assert digests.verify_step(str(step), metadata_only=True) is None
  step.rename(tmp_path / "90")
  for metadata_only in (False, True):
    assert digests.verify_step(str(tmp_path / "90"), metadata_only) == (
        "digest.json was written for step 60 (the directory was renamed)")
