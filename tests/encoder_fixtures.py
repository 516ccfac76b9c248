"""Tiny encoder-only runs on real CMUdict words (with stress) through the real data layer.

`write_stress_files(directory)` writes train/dev/test `WORD<TAB>PHONES` files with stress digits
(the `stress` config's pronunciations, the library's own word split); `config(directory, head)`
is configs/base.py with a 2-layer d=32 encoder-only model on them: head 'mlm' trains the masked
LM on the words, 'classify' predicts the primary-stress position (data.label), 'tag' is not
built here (tests build tagging batches by hand).
"""

from __future__ import annotations

import os

from configs import base
from transformer.data import cmudict

from shared_dirs import shared_dir

MAX_LEN = 16


def write_stress_files(directory: str, num_train: int = 300, num_test: int = 40) -> dict[str, str]:
  """Writes {train,validation,test}.tsv under `directory`; returns {config key: path}."""
  splits = cmudict.load_splits(stress=True)
  os.makedirs(directory, exist_ok=True)
  paths = {}
  for key, split, n in (("train_file", "train", num_train), ("dev_file", "validation", num_test),
                        ("test_file", "test", num_test)):
    words = sorted((w, ps) for w, ps in splits[split].items() if len(w) < MAX_LEN - 2)[::11][:n]
    paths[key] = os.path.join(directory, f"{split}.tsv")
    with open(paths[key], "w") as f:
      f.writelines(f"{w}\t{p}\n" for w, ps in words for p in ps)
  return paths


def config(directory: str, head: str = "mlm", num_steps: int = 20, **overrides):
  """base.py with a 2-layer d=32 encoder-only model on `write_stress_files(directory)`."""
  cd = base.get_config()
  cd.model.update(arch="encoder_only", head=head, d_model=32, num_heads=4, mlp_dim=64,
                  num_encoder_layers=2, dropout_rate=0.0, max_len=32)
  cd.data.update(dataset="cmudict_g2p", data_dir=os.path.join(directory, "tfds"),
                 max_source_len=MAX_LEN, max_target_len=4 if head == "classify" else MAX_LEN,
                 batch_size=16, batching="pack", **write_stress_files(directory))
  if head == "mlm":
    cd.data.objective = "mlm"
  elif head == "classify":
    cd.data.label = "primary_stress"
  cd.train.update(num_steps=num_steps, schedule="constant", learning_rate=3e-3, warmup_steps=0,
                  log_every_steps=10, label_smoothing=0.0)
  cd.eval.update(every_steps=num_steps, batch_size=16)
  cd.checkpoint.update(every_steps=num_steps, keep=1)
  for key, value in overrides.items():
    cd.update_from_flattened_dict({key: value})
  return cd


def trained_mlm_run(tmp_path_factory, num_steps: int = 4) -> str:
  """The workdir of `config(<shared dir>/data, 'mlm', num_steps)` trained by train_and_evaluate,
  once per pytest invocation, shared by the test files that ask for it (tests/shared_dirs.py)."""
  from transformer.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  root = shared_dir(tmp_path_factory, f"encoder_mlm_{num_steps}", lambda root: train_and_evaluate(
      config(str(root / "data"), "mlm", num_steps=num_steps), str(root / "workdir")))
  return str(root / "workdir")
