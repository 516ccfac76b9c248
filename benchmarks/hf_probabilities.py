r"""Converted models score like the original: next-token (T5: decoder, BERT: masked-token)
log-probabilities of `--from_hf` workdirs against Hugging Face's own, per family.

  python benchmarks/hf_probabilities.py --out=docs/results/hf_probabilities

For GPT-2, T5, BERT, Llama 2, Llama 3 (Llama 3.1's RoPE scaling, a tied head), Mistral (a
sliding window of 4, shorter than every input), Qwen2 (q/k/v biases) and Mixtral (4 experts,
top-2), a tiny model is built offline from transformers' config class (every weight perturbed, as
tests/convert/*.py do; no checkpoint is downloaded) with a tokenizer trained here, once as it is
("random") and once after TRAIN_STEPS Adam steps in torch on a small corpus ("trained":
non-degenerate, non-symmetric weights), saved, converted with `convert.from_hf`, and restored with
`transformer.restore`. Our log-probabilities are the log-softmax over our whole vocabulary of the
logits the notebook API gives (`Run.logits`; BERT's masked-LM logits of `Run.mask_fillers`' rows),
read at each Hugging Face id's place (`our_ids`); Hugging Face's are the log-softmax of its forward
pass on the same tokens. The metric is the largest absolute difference over every id and every
real position. "before" is the same converted parameters with `model.excluded_ids` cleared and
GPT-2's and the Llama family's end-of-sequence read at its shifted id: the distribution of the
same weights without the vocabulary map. Writes record.json (docs/results/<name>/record.json's
schema) under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np
import torch
import transformers

import commands  # benchmarks/ is the script's directory
import transformer
from transformer import convert
from transformer.convert import bert, gpt2, llama
from transformer.infer.api import Run
from transformer.model import models

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMAS = ("llama2", "llama3", "mistral", "qwen2", "mixtral")  # Llama-shaped decoders
FAMILIES = ("gpt2", "t5", "bert", *LLAMAS)
TRAIN_STEPS = 40
EOT = "<|endoftext|>"
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LLAMA_SPECIALS = ["<unk>", "<s>", "</s>"]  # Llama's ids 0, 1, 2 (bos 1, eos 2)
WINDOW = 4  # Mistral's sliding window: every row of TEXTS is longer
LLAMA_SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                   bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5)
LLAMA_CONFIGS = {  # family -> (config class, model class, its keys over LLAMA_SIZES)
    "llama2": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4,
                                                             num_experts_per_tok=2)),
}
TEXTS = ["the cat sees the moon.", "a dog likes some fish.", "my friend finds a red ball.",
         "she wants the mat.", "the old man eats it."]


def corpus(num_sentences: int = 200) -> list[str]:
  """Deterministic sentence-like lines (seeded choices from a few words)."""
  rnd = random.Random(0)
  subjects, verbs, objects = (["the cat", "a dog", "my friend", "the old man", "she"],
                              ["sees", "likes", "finds", "eats", "wants"],
                              ["the mat.", "a red ball.", "some fish.", "the moon.", "it."])
  return [f"{rnd.choice(subjects)} {rnd.choice(verbs)} {rnd.choice(objects)}"
          for _ in range(num_sentences)]


def tokenizer(family: str, lines: list[str]):
  """A `tokenizers` tokenizer of the family's kind trained on `lines`: BPE with <|endoftext|>
  (GPT-2), unigram with <pad> 0, </s> 1, <unk> 2 (T5), WordPiece with BERT's specials, BPE with
  <unk> 0, <s> 1, </s> 2 (the Llama family)."""
  from tokenizers import Tokenizer, decoders, models as tmodels, normalizers, pre_tokenizers
  from tokenizers import trainers
  if family == "bert":  # the vocabulary written out: WordPiece's trainer breaks ties at random
    words = sorted({w for line in lines for w in line.replace(".", " .").split()})
    chars = sorted({c for w in words for c in w})
    vocab = BERT_SPECIALS + chars + [f"##{c}" for c in chars] + [w for w in words if len(w) > 1]
    tok = Tokenizer(tmodels.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok
  if family == "t5":
    tok = Tokenizer(tmodels.Unigram())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=80, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", show_progress=False)
  elif family in LLAMAS:
    tok = Tokenizer(tmodels.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=LLAMA_SPECIALS,
                                  show_progress=False)
  else:
    tok = Tokenizer(tmodels.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=[EOT], show_progress=False)
  tok.train_from_iterator(lines, trainer)
  return tok


def llama_model(family: str, vocab: int) -> torch.nn.Module:
  """A tiny random Llama-shaped model (`randomize`d)."""
  config_cls, model_cls, extra = LLAMA_CONFIGS[family]
  return randomize(getattr(transformers, model_cls)(getattr(transformers, config_cls)(
      vocab_size=vocab, **(LLAMA_SIZES | extra))))


def randomize(model: torch.nn.Module) -> torch.nn.Module:
  """The model in eval mode with weights far from a fresh one's: matrices ~ N(0, 1/fan_in)
  (Mixtral's router too: routing far from uniform), embeddings ~ N(0, 1), norm scales
  1 + N(0, 0.3^2), biases N(0, 0.3^2)."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1 + 0.3 * torch.randn_like(p))
      elif p.ndim == 1:
        p.normal_(0.0, 0.3)
      elif "embed" in name:
        p.normal_(0.0, 1.0)
      else:  # [out, in], or Mixtral's experts [E, out, in]
        p.normal_(0.0, p.shape[-1] ** -0.5)
  return model.eval()


def hf_model(family: str, tok) -> torch.nn.Module:
  """A tiny random model of `family` for `tok`, dropout off, every weight perturbed (T5: its
  norms and relative-bias tables, and an untied head)."""
  vocab = tok.get_vocab_size()
  if family in LLAMAS:
    return llama_model(family, vocab)
  if family == "gpt2":
    eot = tok.token_to_id(EOT)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=eot,
        eos_token_id=eot, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
  elif family == "t5":
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=16, d_ff=48, num_layers=2, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False))
  else:
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0))
  with torch.no_grad():
    if family == "t5":  # as tests/convert/test_t5.py: T5's own init scales its unscaled attention
      for name, p in model.named_parameters():
        if "layer_norm" in name:
          p.mul_(1 + 0.3 * torch.randn_like(p))
        elif "relative_attention_bias" in name:
          p.normal_(0.0, 1.0)
      # transformers 5 ties every T5's head at init: an untied one of its own
      model.lm_head.weight = torch.nn.Parameter(torch.randn(96, 32) * 32**-0.5)
    else:
      for p in model.parameters():  # LayerNorm scales around 1, every bias non-zero
        p.add_(0.3 * torch.randn_like(p))
  return model.eval()


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
  width = max(map(len, rows))
  ids = torch.full((len(rows), width), pad, dtype=torch.long)
  mask = torch.zeros((len(rows), width), dtype=torch.long)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
  return ids, mask


def train(family: str, model: torch.nn.Module, tok, lines: list[str], steps: int = TRAIN_STEPS,
          seed: int = 0) -> torch.nn.Module:
  """`steps` Adam steps (lr 3e-3, batches of 16 lines) of the family's own objective: causal LM
  on <|endoftext|> line <|endoftext|> (GPT-2) or <s> line </s> (the Llama family), copying a line
  (T5), masked LM with 15% [MASK] (BERT)."""
  gen = torch.Generator().manual_seed(seed)
  optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
  model.train()
  for step in range(steps):
    batch = [lines[(step * 16 + i) % len(lines)] for i in range(16)]
    ids = [tok.encode(t, add_special_tokens=False).ids for t in batch]
    if family in LLAMAS:
      x, mask = _padded([[1] + r + [2] for r in ids], 2)
      loss = model(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)).loss
    elif family == "gpt2":
      eot = tok.token_to_id(EOT)
      x, mask = _padded([[eot] + r + [eot] for r in ids], eot)
      loss = model(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)).loss
    elif family == "t5":
      x, mask = _padded([r + [1] for r in ids], 0)
      loss = model(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)).loss
    else:
      cls, sep, mask_id = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
      x, mask = _padded([[cls] + r + [sep] for r in ids], 0)
      chosen = (torch.rand(x.shape, generator=gen) < 0.15) & (mask == 1)
      chosen[:, 1] |= ~chosen.any(dim=1)  # at least one per row
      labels = x.masked_fill(~chosen, -100)
      loss = model(input_ids=x.masked_fill(chosen, mask_id), attention_mask=mask,
                   labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  return model.eval()


def build(family: str, trained: bool, directory: str, seed: int = 0) -> tuple[Any, Any]:
  """(model, tokenizer) of `family`, saved in `directory` with its tokenizer.json (built on one
  torch thread: for models this small more threads only add synchronisation)."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    torch.manual_seed(seed)
    lines = corpus()
    tok = tokenizer(family, lines)
    model = hf_model(family, tok)
    if trained:
      model = train(family, model, tok, lines, seed=seed)
  finally:
    torch.set_num_threads(threads)
  model.save_pretrained(directory)
  tok.save(os.path.join(directory, "tokenizer.json"))
  return model, tok


def without_exclusions(run: Run) -> Run:
  """`run` with model.excluded_ids cleared: the same parameters, every id in the softmax."""
  cfg = dataclasses.replace(run.config, model=dataclasses.replace(run.config.model,
                                                                  excluded_ids=""))
  return Run(cfg, models.build_model(cfg.model), run.params, run.task, run.step, run.workdir)


def log_softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def log_probs(family: str, run: Run, model: Any, tok: Any, before: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
  """(ours, Hugging Face's) log-probabilities [positions, HF vocabulary] at every real position
  of TEXTS: GPT-2 next tokens of <|endoftext|> text <|endoftext|>, the Llama family's of <s> text
  (our start token in <s>'s place), T5 decoder tokens of text -> text, BERT masked-LM outputs of
  [CLS] text-with-one-[MASK] [SEP]. `before`: our columns as the plain id shift reads them (the
  end-of-sequence id at its shifted id)."""
  hf = model.config.to_dict()
  if family in LLAMAS:
    ours = llama.our_ids(hf) if not before else np.arange(hf["vocab_size"]) + llama.ID_OFFSET
    logits = run.logits([""] * len(TEXTS), TEXTS)
    rows = [[1] + [i - llama.ID_OFFSET for i in run.target_tokenizer.encode(t)] for t in TEXTS]
    assert min(map(len, rows)) > WINDOW, "Mistral's rows must be longer than its window"
    ids, mask = _padded(rows, 2)
    with torch.no_grad():
      want = model(input_ids=ids, attention_mask=mask).logits.numpy()
    real = mask.numpy().astype(bool)
  elif family == "gpt2":
    ours = gpt2.our_ids(hf) if not before else np.arange(hf["vocab_size"]) + gpt2.ID_OFFSET
    logits = run.logits([""] * len(TEXTS), TEXTS)
    eot = hf["eos_token_id"]
    rows = [[eot] + [i - gpt2.ID_OFFSET for i in run.target_tokenizer.encode(t)] for t in TEXTS]
    ids, mask = _padded(rows, eot)
    with torch.no_grad():
      want = model(input_ids=ids, attention_mask=mask).logits.numpy()
    real = mask.numpy().astype(bool)  # position j predicts the token after row[:j + 1]
  elif family == "t5":
    ours = np.arange(hf["vocab_size"])
    logits = run.logits(TEXTS, TEXTS)
    rows = [run.encode_source(t) for t in TEXTS]  # the text's ids and </s>, both sides
    ids, mask = _padded(rows, 0)
    with torch.no_grad():
      want = model(input_ids=ids, attention_mask=mask,
                   labels=ids.masked_fill(mask == 0, -100)).logits.numpy()
    real = mask.numpy().astype(bool)
  else:
    vocab = hf["vocab_size"]
    ours = bert.our_ids(vocab)
    marked = [" ".join(w if i != 1 else "_" for i, w in enumerate(t.split())) for t in TEXTS]
    rows, mask_id, logits = run._mask_rows(marked, "_")  # pylint: disable=protected-access
    specials = {bert.BOS_ID: "[CLS]", bert.EOS_ID: "[SEP]", mask_id: "[MASK]"}
    hf_rows = [[tok.token_to_id(specials[i]) if i in specials else i - bert.ID_OFFSET
                for i in r] for r in rows]
    ids, mask = _padded(hf_rows, 0)
    with torch.no_grad():
      want = model(input_ids=ids, attention_mask=mask).logits.numpy()
    real = mask.numpy().astype(bool)
  got = log_softmax(np.asarray(logits)[:, :real.shape[1]])[..., ours]
  return got[real], log_softmax(want)[real]


def measure(family: str, trained: bool, root: str) -> dict[str, float]:
  """{'before': ..., 'after': ...}: max |log p_ours - log p_HF| of one converted model."""
  directory = os.path.join(root, f"{family}_{'trained' if trained else 'random'}")
  model, tok = build(family, trained, directory)
  workdir = directory + "_ours"
  convert.from_hf(directory, workdir)
  run = transformer.restore(workdir)
  out = {}
  for name, r, before in (("before", without_exclusions(run), True), ("after", run, False)):
    got, want = log_probs(family, r, model, tok, before)
    out[name] = float(np.abs(got - want).max())
  return out




def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(REPO, "docs", "results", "hf_probabilities"))
  args = parser.parse_args(argv)
  start = time.time()
  metrics = {}
  with tempfile.TemporaryDirectory() as root:
    for family in FAMILIES:
      for trained in (False, True):
        weights = "trained" if trained else "random"
        result = measure(family, trained, root)
        print(f"{family:5s} {weights:8s} max |dlog p| before {result['before']:.3g} "
              f"after {result['after']:.3g}", flush=True)
        for name, value in result.items():
          metrics[f"{family}_{weights}_max_abs_logprob_diff_{name}"] = value
  for family in FAMILIES:  # the headline: the worse of random and trained weights
    metrics[f"{family}_max_abs_logprob_diff"] = max(
        metrics[f"{family}_{w}_max_abs_logprob_diff_after"] for w in ("random", "trained"))
  record = {
      "name": "hf_probabilities",
      "title": "Converted GPT-2, T5, BERT, Llama 2, Llama 3, Mistral, Qwen2 and Mixtral: max |log "
               "p ours - log p Hugging Face| over the whole vocabulary, before and after "
               "model.excluded_ids",
      "task": "Hugging Face conversion (tiny random models built offline from transformers' "
              "config classes; no real checkpoint)", "config": None,
      "overrides": [], "command": "python benchmarks/hf_probabilities.py",
      "commit": commands.git_commit(), "hardware": "2-core x86_64 CPU",
      "versions": {"jax": jax.__version__, "torch": torch.__version__,
                   "transformers": transformers.__version__,
                   "python": platform.python_version()},
      "wall_clock_s": round(time.time() - start, 1), "rates": {}, "metrics": metrics, "seeds": [0],
      "report": "docs/hf_conversion.md#probabilities"}
  print(f"wrote {commands.write_record(args.out, record)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
