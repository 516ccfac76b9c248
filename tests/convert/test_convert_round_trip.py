"""Exports of runs of a converted family round-trip bitwise, also after `--init_from` fine-tuning
and after a resume: export -> convert -> export again gives the same config.json, tensors and
tokenizer.json (so the export's tensors are the run's, bitwise), the export keeps the source's
special-token ids (fine-tuning carries converted_from.json), and Hugging Face's model of the
export scores as the fine-tuned run does, within 1e-4: a decoder's next-token log-probabilities
(our start token included), T5's teacher-forced and BERT's masked-LM log-probabilities, ViT's
class probabilities (ours over its labels: a fresh head gives our 4 reserved ids some mass, which
the export, having no place for them, leaves out). A decoder with tied embeddings (GPT-2, the
Qwen2 here) has one BOS row for our start token and BOS's own next-token score: its start token
reads that row (model.start_embedding_id), so its export scores as the run too.

Offline: each family's tiny random model as its own tests build it, converted, fine-tuned for two
steps by train.py's train_and_evaluate (a decoder on test_llama's corpus with lm.py:nanogpt_cpu,
T5 on a TSV task with g2p.py:tiny, BERT's masked LM with mlm.py:text, a one-channel ViT on the
digits with vit.py:tiny), then resumed for two more. The Llama test is the fast one; the other
families' are `-m slow` (`pytest -m slow tests/convert/test_convert_round_trip.py`).
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
from transformer.data.tokenizers import NUM_SPECIAL  # noqa: E402
from transformer.train.loop import train_and_evaluate  # noqa: E402
from configs import g2p, lm, mlm, vit  # noqa: E402
import test_bert  # noqa: E402
import test_gpt2  # noqa: E402
import test_llama  # noqa: E402
import test_mixtral  # noqa: E402
import test_t5  # noqa: E402
import test_vit  # noqa: E402

DECODERS = {"llama": (test_llama.hf_model, "llama2", transformers.LlamaForCausalLM),
            "mistral": (test_llama.hf_model, "mistral", transformers.MistralForCausalLM),
            "qwen2": (test_llama.hf_model, "qwen2", transformers.Qwen2ForCausalLM),
            "mixtral": (test_mixtral.hf_model, "mixtral", transformers.MixtralForCausalLM),
            "gpt2": (None, "", transformers.GPT2LMHeadModel)}


def save(family: str, directory) -> None:
  """Saves `family`'s tiny random Hugging Face model and tokenizer.json in `directory`."""
  torch.manual_seed(0)
  if family == "bert":
    test_bert.save_tiny_bert(str(directory))
    return
  if family == "vit":  # vit.py's images: 8x8, one channel, ten digits
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, id2label={i: str(i) for i in range(10)},
        label2id={str(i): i for i in range(10)}))
    model.save_pretrained(directory)
    return
  if family == "t5":
    test_t5.hf_model("flan").save_pretrained(directory)
    tok = test_t5.tiny_tokenizer()
  elif family == "gpt2":
    tok = test_gpt2.tiny_tokenizer(test_gpt2.corpus())
    eot = tok.token_to_id(test_gpt2.EOT)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=eot, eos_token_id=eot)).save_pretrained(directory)
  else:
    build, variant, _ = DECODERS[family]
    tok = test_llama.tokenizer()
    build(variant, tok.get_vocab_size()).save_pretrained(directory)
  tok.save(str(directory / "tokenizer.json"))


def task_config(family: str, root):
  """The config fine-tuning `family`'s conversion: its kind of task, small, on files in root."""
  if family == "t5":
    lines = [f"{s}\t{s.upper()}" for s in test_t5.TEXT]
    for split in ("train", "dev"):
      (root / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    cd = g2p.get_config("tiny")
    cd.data.update(dataset="tsv_pairs", train_file=str(root / "train.tsv"),
                   dev_file=str(root / "dev.tsv"))
    cd.eval.update(num_decode_examples=0)
    return cd
  if family == "vit":
    cd = vit.get_config("tiny")
    cd.checkpoint.update(keep_best_by="")
    return cd
  corpus = root / "corpus.txt"
  if family == "bert":
    corpus.write_text("\n".join(test_bert.SENTENCES) + "\n")
    cd = mlm.get_config("text")
  else:
    corpus.write_text("\n".join(test_llama.bench.corpus()) + "\n")
    cd = lm.get_config("nanogpt_cpu")
    cd.data.update(dataset="text_files")
  cd.data.update(text_file=str(corpus), max_target_len=32, max_source_len=32)
  return cd


def fine_tune(family: str, init_from: str, workdir: str, root, steps: int) -> None:
  """`family`'s task_config fine-tuned from `init_from` in `workdir` until `steps` (resuming
  what `workdir` holds), a checkpoint every 2 steps."""
  cd = task_config(family, root)
  cd.update_from_flattened_dict({
      "data.data_dir": str(root / "tfds"), "data.batch_size": 4, "train.num_steps": steps,
      "train.warmup_steps": 0, "train.schedule": "constant", "train.learning_rate": 3e-3,
      "train.log_every_steps": 1, "eval.every_steps": 1000, "eval.num_batches": 1,
      "checkpoint.every_steps": 2})
  train_and_evaluate(cd, workdir, init_from=init_from)


def _files(directory) -> dict:
  """config.json, tokenizer.json and every tensor of an export."""
  out = {"config": json.loads((directory / "config.json").read_text()),
         "state": safetensors_numpy.load_file(str(directory / "model.safetensors"))}
  if (directory / "tokenizer.json").exists():  # a ViT has labels, no tokenizer
    out["tokenizer"] = (directory / "tokenizer.json").read_bytes()
  return out


def assert_round_trips(workdir: str, root) -> tuple[str, str]:
  """Exports `workdir`, converts the export and exports that: both equal bitwise; returns (the
  first export, the workdir converted from it)."""
  first, back, second = root / "first", root / "back", root / "second"
  convert.to_hf(workdir, str(first))
  convert.from_hf(str(first), str(back))
  convert.to_hf(str(back), str(second))
  a, b = _files(first), _files(second)
  assert a["config"] == b["config"] and a.get("tokenizer") == b.get("tokenizer")
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
      directory = root / family
      save(family, directory)
      convert.from_hf(str(directory), str(root / f"{family}_ours"))
      cache[family] = str(directory), str(root / f"{family}_ours")
    return cache[family]

  return get


def log_softmax(x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x - x.max(-1, keepdims=True) - np.log(
      np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))


def scores(family: str, run, exported: str, hf: dict) -> tuple[np.ndarray, np.ndarray]:
  """(ours, Hugging Face's) scores of `run` and of the export's Hugging Face model: log-
  probabilities at the real positions of a batch (class probabilities of images for ViT)."""
  if family in DECODERS:
    model = DECODERS[family][2].from_pretrained(exported).eval()
    rows, mask = test_llama.batch(model.config.vocab_size)
    rows[:, 0] = hf["bos_token_id"]
    return test_llama.log_probs(run, model, rows, mask)
  if family == "t5":
    model = transformers.T5ForConditionalGeneration.from_pretrained(exported).eval()
    (inputs, inputs_mask), (targets, _) = test_t5.batch()
    real = targets != 0
    return (log_softmax(test_t5.our_logits(run, inputs, targets))[real],
            log_softmax(test_t5.hf_logits(model, inputs, inputs_mask, targets))[real])
  if family == "bert":
    model = transformers.BertForMaskedLM.from_pretrained(exported).eval()
    ids, mask = test_bert.hf_batch(test_bert.tiny_tokenizer(), test_bert.TEXTS)
    real = mask.astype(bool)
    return (log_softmax(test_bert.our_logits(run.config, run.params, ids, mask))[real],
            log_softmax(test_bert.hf_logits(model, ids, mask))[real])
  model = transformers.ViTForImageClassification.from_pretrained(exported).eval()
  pixels = np.random.default_rng(3).random((6, 8, 8, 1)).astype(np.float32)
  logits = run._image_logits(pixels)[:, NUM_SPECIAL:]  # pylint: disable=protected-access
  return np.exp(log_softmax(logits)), test_vit.hf_probs(model, pixels)


def check_fine_tuned_round_trip(family: str, source, tmp_path) -> None:
  """Fine-tunes the conversion 2 steps, exports and round-trips it; resumes 2 more, again; Hugging
  Face's model of each export scores as the fine-tuned run."""
  directory, ours = source(family)
  hf = json.loads(open(os.path.join(directory, "config.json")).read())
  ids = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
  tuned = str(tmp_path / "tuned")
  for steps in (2, 4):  # the fine-tuned run, then that run resumed
    fine_tune(family, ours, tuned, tmp_path, steps)
    run = transformer.restore(tuned)
    assert run.step == steps
    first, _ = assert_round_trips(tuned, tmp_path / f"at_{steps}")
    exported = json.loads(open(os.path.join(first, "config.json")).read())
    assert {k: exported.get(k) for k in ids} == {k: hf.get(k) for k in ids}
    got, want = scores(family, run, first, hf)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4, family


def test_llama_fine_tuned_and_resumed_round_trips_with_its_bos(source, tmp_path):
  """A converted Llama fine-tuned with --init_from, then resumed: each export keeps Llama's BOS
  id (it used to write the EOS id there, and the model converted back read our start token as
  </s>, nats away), round-trips bitwise and converts back to Hugging Face's scores."""
  check_fine_tuned_round_trip("llama", source, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "t5", "bert", "mistral", "qwen2", "mixtral", "vit"])
def test_every_family_fine_tuned_and_resumed_round_trips(family, source, tmp_path):
  """As the Llama test, for GPT-2, T5 (a seq2seq task), BERT (its masked LM), Mistral (a sliding
  window), Qwen2 (q/k/v biases), Mixtral (experts) and ViT (the digits: `--init_from` a converted
  ViT used to stop on the image model's missing tokenizer)."""
  check_fine_tuned_round_trip(family, source, tmp_path)
