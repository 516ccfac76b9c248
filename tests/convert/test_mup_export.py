"""A µP run exports as a standard model that scores in Hugging Face as the run does: the
multipliers folded into the weights (parametrization.to_standard) are checked against
transformers' own forward pass, not only against our logits.

Offline: test_llama's tiny random Llama is converted to give a Llama-shaped config and
tokenizer; an untied µP model of that shape (d_model twice its base width) trains from scratch
for two steps, is exported with `convert.to_hf` and loaded by transformers. `-m slow`: the fold is
checked against our own logits in the default suite (tests/model/test_parametrization.py).
"""

import json

import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import to_dict  # noqa: E402
from transformer.run import restore  # noqa: E402
from transformer.train.loop import train_and_evaluate  # noqa: E402
import test_convert_round_trip  # noqa: E402
import test_llama  # noqa: E402


@pytest.mark.slow
def test_untied_mup_run_exports_to_hugging_faces_scores(tmp_path):
  source = tmp_path / "llama"
  test_convert_round_trip.save("llama", source)
  convert.from_hf(str(source), str(tmp_path / "llama_ours"))
  cd = ml_collections.ConfigDict(to_dict(restore.load_run_config(str(tmp_path / "llama_ours"))))
  assert not cd.model.tie_embeddings
  (tmp_path / "corpus.txt").write_text("\n".join(test_llama.bench.corpus()) + "\n")
  cd.model.update(parametrization="mup", mup_base_width=cd.model.d_model // 2)
  cd.data.update(dataset="text_files", text_file=str(tmp_path / "corpus.txt"), batch_size=4,
                 max_target_len=32, data_dir=str(tmp_path / "tfds"))
  cd.train.update(num_steps=2, warmup_steps=0, schedule="constant", learning_rate=3e-2,
                  log_every_steps=1)
  cd.eval.update(every_steps=1000, num_batches=1)
  cd.checkpoint.update(every_steps=2)
  workdir = str(tmp_path / "mup")
  train_and_evaluate(cd, workdir)
  exported = tmp_path / "export"
  config = convert.to_hf(workdir, str(exported))
  assert "parametrization" not in json.dumps(config)
  model = transformers.LlamaForCausalLM.from_pretrained(str(exported)).eval()
  ids, mask = test_llama.batch(model.config.vocab_size)
  ids[:, 0] = config["bos_token_id"]  # where Hugging Face reads the start token our run reads
  got, want = test_llama.log_probs(transformer.restore(workdir), model, ids, mask)
  assert np.abs(got - want).max() <= 1e-4
  assert np.abs(np.exp(got) - np.exp(want)).max() <= 1e-4
