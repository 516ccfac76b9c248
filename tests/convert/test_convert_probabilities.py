"""Converted models score like the original (transformer/convert, model.excluded_ids): the
distribution a user consumes through the notebook API, not only the logits, is Hugging Face's.

Offline: tiny GPT-2, T5 and BERT models are built by benchmarks/hf_probabilities.py (transformers'
config classes, every weight perturbed, a tokenizer trained here), as they are ("random") and
after a few Adam steps in torch ("trained"), saved and converted with `convert.from_hf`. The
reference is always Hugging Face's own forward pass or generate.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from bench_loader import load_benchmark  # noqa: E402

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import excluded_ids  # noqa: E402
from transformer.convert import bert, gpt2  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
from transformer.infer import evaluation
from transformer.model.heads import EXCLUDED_LOGIT  # noqa: E402

bench = load_benchmark("hf_probabilities")
MODELS = {"gpt2": transformers.GPT2LMHeadModel, "t5": transformers.T5ForConditionalGeneration,
          "bert": transformers.BertForMaskedLM}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(family, weights) -> (HF directory, HF model, its tokenizer, our workdir, restored Run),
  each built and converted once for the module."""
  root = tmp_path_factory.mktemp("hf_probabilities")
  cache = {}

  def get(family: str, weights: str):
    if (family, weights) not in cache:
      directory = str(root / f"{family}_{weights}")
      model, tok = bench.build(family, weights == "trained", directory)
      workdir = directory + "_ours"
      convert.from_hf(directory, workdir)
      cache[family, weights] = directory, model, tok, workdir, transformer.restore(workdir)
    return cache[family, weights]

  return get


def hf_places(family: str, model) -> np.ndarray:
  """Our id of each Hugging Face id of `model`."""
  hf = model.config.to_dict()
  if family == "gpt2":
    return gpt2.our_ids(hf)
  return bert.our_ids(hf["vocab_size"]) if family == "bert" else np.arange(hf["vocab_size"])


@pytest.mark.parametrize("weights", ["random", "trained"])
@pytest.mark.parametrize("family", ["gpt2", "t5", "bert"])
def test_log_probabilities_equal_hugging_face(converted, family, weights):
  """The log-softmax over our whole vocabulary of the logits `Run.logits` gives (GPT-2: next
  tokens of text after <|endoftext|>; T5: the decoder's; BERT: the masked LM's on [CLS] text with
  a [MASK] [SEP]) equals Hugging Face's at every real position, id for id, to 1e-4, as
  log-probabilities and as probabilities; the ids of ours that are no Hugging Face id's place
  (model.excluded_ids) get probability exactly 0."""
  _, model, tok, _, run = converted(family, weights)
  got, want = bench.log_probs(family, run, model, tok)
  assert got.shape == want.shape and got.shape[0] >= 20
  assert np.abs(got - want).max() <= 1e-4
  assert np.abs(np.exp(got) - np.exp(want)).max() <= 1e-4
  places = hf_places(family, model)
  others = np.setdiff1d(np.arange(run.config.model.vocab_size), places)
  assert list(others) == list(excluded_ids(run.config.model))
  logits = run.logits(bench.TEXTS, bench.TEXTS) if family != "bert" else None
  if logits is not None:
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    assert (probs[..., others] == 0).all() and (logits[..., others] == EXCLUDED_LOGIT).all()


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_scores_and_perplexity_equal_hugging_face(converted, family):
  """`Run.score` (log p(target + EOS | source), summed) of the trained converted model equals
  Hugging Face's summed log-probability of the same tokens (GPT-2: after <|endoftext|>, ending with
  <|endoftext|>; T5: labels ending with </s>) to 1e-4 per token, and so does the perplexity."""
  _, model, tok, _, run = converted(family, "trained")
  texts = bench.TEXTS
  if family == "gpt2":
    ours = run.score([""] * len(texts), texts)
    eot = model.config.eos_token_id
    rows = [[eot] + tok.encode(t, add_special_tokens=False).ids + [eot] for t in texts]
  else:
    ours = run.score(texts, texts)
    rows = [tok.encode(t, add_special_tokens=False).ids + [1] for t in texts]
  want, lengths = [], []
  for row in rows:
    x = torch.tensor([row])
    with torch.no_grad():
      if family == "gpt2":
        logits = model(input_ids=x).logits.numpy()[0, :-1]
        targets = row[1:]
      else:
        logits = model(input_ids=x, labels=x).logits.numpy()[0]
        targets = row
    log_p = bench.log_softmax(logits)
    want.append(log_p[np.arange(len(targets)), targets].sum())
    lengths.append(len(targets))
  want, lengths = np.array(want), np.array(lengths)
  assert np.abs(ours - want).max() <= 1e-4 * lengths.max()
  ppl_ours, ppl_hf = np.exp(-ours.sum() / lengths.sum()), np.exp(-want.sum() / lengths.sum())
  assert abs(ppl_ours / ppl_hf - 1) <= 1e-4


def _hf_sequence_log_prob(family: str, model, prompt: list[int], tokens: list[int]) -> float:
  """Hugging Face's log p(tokens | prompt) (GPT-2: prompt after <|endoftext|>; T5: the encoder
  reads prompt)."""
  with torch.no_grad():
    if family == "gpt2":
      eot = model.config.eos_token_id
      row = [eot] + prompt + tokens
      logits = model(input_ids=torch.tensor([row])).logits.numpy()[0, len(prompt):-1]
    else:
      logits = model(input_ids=torch.tensor([prompt]),
                     labels=torch.tensor([tokens])).logits.numpy()[0]
  return float(bench.log_softmax(logits)[np.arange(len(tokens)), tokens].sum())


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_greedy_and_sampled_generations_match_hugging_face(converted, family):
  """Greedy decoding of the trained converted model emits Hugging Face's generate(do_sample=
  False) tokens (each at its place in ours; T5's pad suppressed on both sides, as our decoding
  never emits it). Sampling (temperature 1, seed 0, 16 draws of one prompt) draws only Hugging
  Face ids, and the score our sampler gives each draw (the sum of the log-probabilities it sampled
  from) equals Hugging Face's log-probability of that draw, stop token included, to 1e-4 per
  token: the sampled distribution is the original's."""
  _, model, tok, _, run = converted(family, "trained")
  places = hf_places(family, model)
  back = {int(o): h for h, o in enumerate(places)}
  eos_hf = model.config.eos_token_id
  prompts = ["the cat", "my friend finds", "she"]
  hf_prompts = [tok.encode(p, add_special_tokens=False).ids + ([] if family == "gpt2" else [1])
                for p in prompts]
  ours_prompts = [[int(places[i]) for i in p] for p in hf_prompts]
  steps = 10
  greedy = dataclasses.replace(run.config.eval.decode, method="greedy", max_decode_len=steps)
  prefix_lm = False if family == "gpt2" else None  # a language model: causal over its prompt
  ours, _ = evaluation.decode_batches(run.config, run.model, run.params, ours_prompts, greedy,
                                      eos_id=tokenizers.EOS_ID, batch_size=4, prefix_lm=prefix_lm)
  for p, got in zip(hf_prompts, ours):
    with torch.no_grad():
      if family == "gpt2":
        out = model.generate(input_ids=torch.tensor([[eos_hf] + p]), do_sample=False,
                             max_new_tokens=steps, eos_token_id=eos_hf,
                             pad_token_id=eos_hf).numpy()[0, len(p) + 1:]
      else:
        out = model.generate(input_ids=torch.tensor([p]), do_sample=False, num_beams=1,
                             max_new_tokens=steps, suppress_tokens=[0], eos_token_id=1,
                             decoder_start_token_id=0, pad_token_id=0).numpy()[0, 1:]
    hf = list(out)
    hf = hf[:hf.index(eos_hf)] if eos_hf in hf else hf
    assert [back[t] for t in got] == hf
  sample = dataclasses.replace(run.config.eval.decode, method="sample", temperature=1.0, top_k=0,
                               top_p=1.0, max_decode_len=steps)
  draws, scores = evaluation.decode_batches(
      run.config, run.model, run.params, [ours_prompts[0]] * 16, sample, eos_id=tokenizers.EOS_ID,
      batch_size=16, rng=jax.random.key(0), prefix_lm=prefix_lm)
  assert len({tuple(d) for d in draws}) > 1  # draws, not one sequence
  for draw, score in zip(draws, scores):
    assert all(t in back for t in draw), draw  # every sampled id is a Hugging Face id
    tokens = [back[t] for t in draw] + ([eos_hf] if len(draw) < steps else [])
    want = _hf_sequence_log_prob(family, model, hf_prompts[0], tokens)
    assert abs(score - want) <= 1e-4 * len(tokens), (draw, score, want)


def _perturbed(params, seed: int = 7):
  """New random arrays of the same shapes (norm scales around 1): weights none of which are the
  original's, as after training."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: np.float32(1 + 0.3 * rng.normal(size=np.shape(x)))
      if "norm" in jax.tree_util.keystr(path)
      else np.float32(rng.normal(size=np.shape(x)) * (np.std(x) or 0.1)), params)


@pytest.mark.parametrize("family", ["gpt2", "t5", "bert"])
def test_round_trips_are_bitwise_and_keep_probabilities(converted, family, tmp_path):
  """HF -> ours -> HF gives the trained model's state dict back bitwise. ours -> HF -> ours, for a
  converted workdir whose weights are all new (every row differs, the excluded ids' too, as after
  fine-tuning): every parameter Hugging Face holds comes back bitwise (vocabulary rows at their
  places; GPT-2's <|endoftext|> from our EOS row), the model config (excluded ids included) is the
  same, and the model read back scores like the exported Hugging Face model to 1e-4. (Rows of
  ours that have no Hugging Face place, e.g. the start token's, come back as conversion writes
  them: copies of <|endoftext|>'s, BERT's specials'.)"""
  directory, model, tok, workdir, run = converted(family, "trained")
  convert.to_hf(workdir, str(tmp_path / "back"))
  back = MODELS[family].from_pretrained(str(tmp_path / "back"))
  original, again = model.state_dict(), back.state_dict()
  for key, value in original.items():
    if family == "bert" and key.split(".")[-2] in ("position_embeddings", "token_type_embeddings"):
      continue  # type 0 folded into the positions (tests/convert/test_bert.py checks their sum)
    assert torch.equal(value, again[key]), key

  params = _perturbed(run.params)
  ours = str(tmp_path / "ours")
  with open(os.path.join(workdir, convert.CONVERTED_FROM)) as f:
    source = json.load(f)
  target = tokenizers.load(os.path.join(workdir, "tokenizers", "target"))
  convert.write_workdir(run.config, params, target, ours, source)
  exported = str(tmp_path / "exported")
  convert.to_hf(ours, exported)
  hf_model = MODELS[family].from_pretrained(exported).eval()
  convert.from_hf(exported, str(tmp_path / "again"))
  again_run = transformer.restore(str(tmp_path / "again"))
  assert again_run.config.model == run.config.model
  places = hf_places(family, hf_model)
  vocab = run.config.model.vocab_size
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(again_run.params)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape[0] == vocab:  # an embedding table or a logits bias: the rows at their places
      a, b = a[places], b[places]
    elif a.ndim == 2 and a.shape[1] == vocab:  # an untied head [d, vocab]
      a, b = a[:, places], b[:, places]
    assert np.array_equal(a, b), jax.tree_util.keystr(path)  # (BERT's positions + zero type row)
  got, want = bench.log_probs(family, again_run, hf_model, tok)
  assert np.abs(got - want).max() <= 1e-4
