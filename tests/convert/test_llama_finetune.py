"""Fine-tuning a converted Llama with the command docs/hf_conversion.md shows (`train.py
--config=configs/lm.py:char --init_from=<converted> --config.data.dataset=text_files`), on a corpus
that spells the tokenizer's special tokens as text (`<s>`, `</s>`, `<unk>`, as docs and code do).

Offline: test_llama.py's tiny random Llama 2 (128 positions, Llama's <unk> <s> </s> at 0, 1, 2),
converted, then trained for 2 steps with dropout off, so the first logged loss is the converted
parameters' own. The reference is the converted model's evaluation (scoring.make_eval_step) of
the same first batch.
"""

import json
import os
import shlex

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformer  # noqa: E402
from transformer.config import excluded_ids  # noqa: E402
from transformer.data import load_task  # noqa: E402
from transformer.model import scoring  # noqa: E402
from transformer.run import restore  # noqa: E402
from transformer.train.loop import train_and_evaluate  # noqa: E402
from configs import lm  # noqa: E402
import test_llama  # noqa: E402

STEPS = 2
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def documented() -> tuple[str, dict[str, str]]:
  """(config variant, --config.* overrides) of the Llama fine-tune command that
  docs/hf_conversion.md shows."""
  with open(os.path.join(REPO, "docs", "hf_conversion.md"), encoding="utf-8") as f:
    text = f.read()
  start = text.index("python train.py --config=configs/lm.py:char --workdir=runs/llama_tuned")
  lines = text[start:].splitlines()
  end = next(i for i, line in enumerate(lines) if not line.endswith("\\"))
  words = shlex.split(" ".join(line.rstrip("\\") for line in lines[:end + 1]))
  variant = next(w for w in words if w.startswith("--config=")).split(":")[1]
  return variant, dict(w[len("--config."):].split("=", 1) for w in words
                       if w.startswith("--config."))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(root, the converted workdir) of test_llama's tiny random Llama 2."""
  root = tmp_path_factory.mktemp("llamaft")
  workdir = test_llama.conversions(root, test_llama.hf_model)("llama2")[3]
  return root, workdir


def _corpus(root) -> str:
  """test_llama's corpus with the specials spelled in every third line."""
  lines = [f"{line} </s> <s> said <unk>" if i % 3 == 0 else line
           for i, line in enumerate(test_llama.bench.corpus())]
  path = root / "corpus.txt"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def test_fine_tuning_on_spelled_specials_logs_the_models_own_loss(converted):
  """The documented fine-tune command on a corpus spelling <s>, </s>, <unk> as text: the
  training rows hold no id the converted model never predicts (model.excluded_ids), and the
  first logged train/loss is the converted model's evaluation loss of that first batch (a few
  nats, not the 1e26 of an excluded id's -1e30 logit)."""
  root, workdir = converted
  variant, overrides = documented()
  assert overrides["data.dataset"] == "text_files" and "model.dropout_rate" in overrides
  cd = lm.get_config(variant)
  for key, value in overrides.items():  # typed as the config's value
    section, name = key.split(".")
    cd[section][name] = type(cd[section][name])(float(value) if value[0].isdigit() else value)
  cd.update_from_flattened_dict({
      "data.text_file": _corpus(root), "data.data_dir": str(root / "tfds"),
      "data.batch_size": 8, "train.num_steps": STEPS, "train.log_every_steps": 1,
      "train.warmup_steps": 1, "eval.every_steps": STEPS, "eval.num_batches": 1,
      "checkpoint.every_steps": STEPS})
  tuned = str(root / "tuned")
  train_and_evaluate(cd, tuned, init_from=workdir)
  with open(os.path.join(tuned, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  logged = next(m["train/loss"] for m in lines if m.get("step") == 1 and "train/loss" in m)

  run = transformer.restore(workdir)
  cfg = restore.load_run_config(tuned)
  batch = next(iter(load_task(cfg, tuned).train_iterator()))
  ids = np.asarray(batch["targets"])[np.asarray(batch["weights"]) > 0]
  assert ids.size and not set(ids.tolist()) & set(excluded_ids(run.config.model))
  sums = scoring.make_eval_step(run.model)(run.params, batch)
  own = float(sums["loss_sum"]) / float(sums["weight_sum"])
  assert own < 2 * np.log(run.config.model.vocab_size)
  np.testing.assert_allclose(logged, own, rtol=1e-5)
