"""Exports of runs of a converted family round-trip bitwise, also after `--init_from` fine-tuning
and after a resume: export -> convert -> export again gives the same config.json, tensors and
tokenizer.json, the export keeps the source's special-token ids (fine-tuning carries
converted_from.json), and the model converted back scores like Hugging Face's own model of the
export, our start token included.

Offline: test_llama's (and test_mixtral's, test_gpt2's) tiny random models, fine-tuned for two
steps by train.py's train_and_evaluate on test_llama's corpus, then resumed for two more. The
Llama test is the fast one; the other families' are `-m slow`
(`pytest -m slow tests/convert/test_convert_round_trip.py`).
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.train.loop import train_and_evaluate  # noqa: E402
from configs import lm  # noqa: E402
import test_llama  # noqa: E402
import test_mixtral  # noqa: E402

MODELS = {"llama": (test_llama.hf_model, "llama2", transformers.LlamaForCausalLM),
          "mistral": (test_llama.hf_model, "mistral", transformers.MistralForCausalLM),
          "mixtral": (test_mixtral.hf_model, "mixtral", transformers.MixtralForCausalLM)}


def fine_tune(init_from: str, workdir: str, root, steps: int) -> None:
  """configs/lm.py:nanogpt_cpu fine-tuned from `init_from` in `workdir` until `steps` (resuming
  what `workdir` holds), checkpoints every 2 steps."""
  corpus = root / "corpus.txt"
  corpus.write_text("\n".join(test_llama.bench.corpus()) + "\n")
  cd = lm.get_config("nanogpt_cpu")
  cd.update_from_flattened_dict({
      "data.dataset": "text_files", "data.text_file": str(corpus),
      "data.data_dir": str(root / "tfds"), "data.max_target_len": 32, "data.max_source_len": 32,
      "data.batch_size": 4, "train.num_steps": steps, "train.warmup_steps": 0,
      "train.learning_rate": 3e-3, "train.log_every_steps": 1, "eval.every_steps": 1000,
      "eval.num_batches": 1, "checkpoint.every_steps": 2})
  train_and_evaluate(cd, workdir, init_from=init_from)


def _files(directory) -> dict:
  """config.json, tokenizer.json and every tensor of an export."""
  return {"config": json.loads((directory / "config.json").read_text()),
          "tokenizer": (directory / "tokenizer.json").read_bytes(),
          "state": safetensors_numpy.load_file(str(directory / "model.safetensors"))}


def assert_round_trips(workdir: str, root) -> tuple[str, str]:
  """Exports `workdir`, converts the export and exports that: both equal bitwise; returns (the
  first export, the workdir converted from it)."""
  first, back, second = root / "first", root / "back", root / "second"
  convert.to_hf(workdir, str(first))
  convert.from_hf(str(first), str(back))
  convert.to_hf(str(back), str(second))
  a, b = _files(first), _files(second)
  assert a["config"] == b["config"] and a["tokenizer"] == b["tokenizer"]
  assert sorted(a["state"]) == sorted(b["state"])
  for key, value in a["state"].items():
    assert value.dtype == b["state"][key].dtype and np.array_equal(value, b["state"][key]), key
  return str(first), str(back)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """family -> (its saved Hugging Face directory, our conversion of it), each built once."""
  root, cache = tmp_path_factory.mktemp("sources"), {}

  def get(family: str):
    if family not in cache:
      build, variant, _ = MODELS[family]
      torch.manual_seed(0)
      tok = test_llama.tokenizer()
      directory = root / family
      build(variant, tok.get_vocab_size()).save_pretrained(directory)
      tok.save(str(directory / "tokenizer.json"))
      convert.from_hf(str(directory), str(root / f"{family}_ours"))
      cache[family] = str(directory), str(root / f"{family}_ours")
    return cache[family]

  return get


def check_fine_tuned_round_trip(family: str, source, tmp_path) -> None:
  """Fine-tunes the conversion 2 steps, exports and round-trips it; resumes 2 more, again."""
  directory, ours = source(family)
  hf = json.loads(open(os.path.join(directory, "config.json")).read())
  tuned = str(tmp_path / "tuned")
  for steps in (2, 4):  # the fine-tuned run, then that run resumed
    fine_tune(ours, tuned, tmp_path, steps)
    assert transformer.restore(tuned).step == steps
    first, back = assert_round_trips(tuned, tmp_path / f"at_{steps}")
    exported = json.loads(open(os.path.join(first, "config.json")).read())
    assert (exported["bos_token_id"], exported["eos_token_id"]) == (
        hf["bos_token_id"], hf["eos_token_id"])
    model = MODELS[family][2].from_pretrained(first).eval()
    ids, mask = test_llama.batch(model.config.vocab_size)
    got, want = test_llama.log_probs(transformer.restore(back), model, ids, mask)
    assert np.abs(got - want).max() <= 1e-4


def test_llama_fine_tuned_and_resumed_round_trips_with_its_bos(source, tmp_path):
  """A converted Llama fine-tuned with --init_from, then resumed: each export keeps Llama's BOS
  id (it used to write the EOS id there, and the model converted back read our start token as
  </s>, nats away), round-trips bitwise and converts back to Hugging Face's scores."""
  check_fine_tuned_round_trip("llama", source, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "mixtral"])
def test_other_decoders_fine_tuned_and_resumed_round_trip(family, source, tmp_path):
  """As the Llama test, for Mistral (a sliding window) and Mixtral (experts)."""
  check_fine_tuned_round_trip(family, source, tmp_path)
