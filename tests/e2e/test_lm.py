"""The language-model path end to end: train a tiny char LM on a local text file, evaluate, restore.

One run (configs/lm.py:char shrunk to d_model 32, 2 layers, 40 steps) on a few KB of deterministic
text through the real `text_files` builder, then `evaluation.evaluate_split` on its `validation` split
(the last 10% of the text) and `transformer.restore(...)`. The references are independent of the
code under test: a NumPy log-softmax over full forward passes for the loss, and greedy decoding
by one full (uncached) forward pass per generated token for the continuations.
"""

import dataclasses
import functools
import json
import math
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer
from configs import lm
from transformer.data import inputs
from transformer.infer import decoding, evaluation, predict

MAX_LEN = ROW = 64  # model.max_len = data.max_target_len (LM rows of 64 characters), as lm.py
GREEDY_LEN = 24  # tokens decoded greedily for the reference comparison


def corpus(num_chars: int = 4000) -> str:
  """Deterministic sentence-like text with some variety (seeded choices from a few words)."""
  rnd = random.Random(0)
  subjects, verbs, objects = (["the cat", "a dog", "my friend", "the old man", "she"],
                              ["sees", "likes", "finds", "eats", "wants"],
                              ["the mat.", "a red ball.", "some fish.", "the moon.", "it."])
  out = []
  while sum(map(len, out)) < num_chars:
    out.append(f"{rnd.choice(subjects)} {rnd.choice(verbs)} {rnd.choice(objects)}"
               + ("\n" if rnd.random() < 0.2 else " "))
  return "".join(out)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  """(workdir, corpus text, training's returned metrics) of one tiny trained char LM."""
  tmp = tmp_path_factory.mktemp("lm_e2e")
  text = corpus()
  (tmp / "corpus.txt").write_text(text, encoding="utf-8")
  cd = lm.get_config("char")
  cd.model.update(d_model=32, num_heads=2, mlp_dim=64, num_decoder_layers=2, dropout_rate=0.0,
                  max_len=MAX_LEN)
  cd.data.update(dataset="text_files", text_file=str(tmp / "corpus.txt"), data_dir=str(tmp / "tfds"),
                 max_target_len=ROW, max_source_len=ROW, batch_size=8)
  cd.train.update(num_steps=40, learning_rate=3e-3, warmup_steps=5, log_every_steps=10)
  cd.eval.update(every_steps=40, num_batches=0)
  cd.checkpoint.update(every_steps=40)
  workdir = str(tmp / "run")
  final = transformer.train_and_evaluate(cd, workdir)
  return workdir, text, final


@pytest.fixture(scope="module")
def evaluated(lm_run):
  """evaluate(workdir, 'validation') with the run's own decode settings (sampling)."""
  workdir, _, _ = lm_run
  results = evaluation.evaluate_split(workdir, split="validation", verbose=False)
  with open(os.path.join(workdir, "metrics.validation.json")) as f:
    written = json.load(f)
  with open(os.path.join(workdir, "predictions.validation.jsonl"), encoding="utf-8") as f:
    predictions = [json.loads(line) for line in f]
  return results, written, predictions


@pytest.fixture(scope="module")
def restored(lm_run):
  """transformer.restore(workdir): the Run, with its model, params and tokenizer."""
  return transformer.restore(lm_run[0])


def full_forward(run, rows, prefix_mask=None):
  """Teacher-forced logits [b, MAX_LEN, vocab] of token rows right-padded with 0 to MAX_LEN (one
  compiled program: padding is segment 0, after every real token, so causally invisible)."""
  targets = np.zeros((len(rows), MAX_LEN), np.int32)
  for i, row in enumerate(rows):
    targets[i, :len(row)] = row
  if prefix_mask is not None:
    prefix_mask = jnp.asarray(prefix_mask, jnp.int32)
  return np.array(_forward(run.model)(run.params, jnp.asarray(targets), prefix_mask))


@functools.lru_cache
def _forward(model):
  return jax.jit(lambda p, t, m: model.apply({"params": p}, t, prefix_mask=m, deterministic=True))


def greedy_by_full_forward(run, prompt, steps):
  """Causal reference: each next token is the argmax (pad excluded) of a full, uncached forward
  pass over [start] + prompt + generated so far, with no prefix mask; stops after EOS."""
  eos_id = run.target_tokenizer.eos_id
  seq = list(prompt)
  for _ in range(steps):
    # Position len(seq) predicts the next token; the dummy last token (1) is not seen by it.
    logits = full_forward(run, [seq + [1]])[0, len(seq)]
    logits[0] = -np.inf
    seq.append(int(np.argmax(logits)))
    if seq[-1] == eos_id:
      break
  return seq[len(prompt):]


def test_training_ran_and_lowered_the_loss(lm_run):
  """The run reached train.num_steps, logged a finite training loss below the uniform-guess loss
  ln(vocab) and evaluated the validation split."""
  workdir, _, final = lm_run
  with open(os.path.join(workdir, "config.json")) as f:
    vocab = json.load(f)["model"]["vocab_size"]
  assert final["step"] == 40
  assert math.isfinite(final["train/loss"]) and final["train/loss"] < math.log(vocab)
  assert "eval/loss" in final


def test_bits_per_char_is_teacher_forced_loss_over_ln2(lm_run, evaluated, restored):
  """evaluation.py: bits_per_char = loss / ln 2, where loss = sum of -log p(token) over all
  non-padding target tokens of the split / their count (nats per token; the tokens are the
  characters plus one EOS at the end of the text). Both numbers are checked against a NumPy
  log-softmax over full forward passes of every validation row."""
  _, text, _ = lm_run
  results, written, _ = evaluated
  run = restored
  tok = run.target_tokenizer
  assert results["split"] == "validation" and results["step"] == 40
  valid = text[int(len(text) * 0.9):]
  stream = tok.encode(valid) + [tok.eos_id]
  assert results["coverage"] == {"scored_tokens": len(stream), "split_tokens": len(stream)}
  rows = [stream[start:start + ROW] for start in range(0, len(stream), ROW)]
  logits = full_forward(run, rows).astype(np.float64)
  top = logits.max(-1, keepdims=True)
  log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  nll = -sum(log_probs[i, np.arange(len(row)), row].sum() for i, row in enumerate(rows))
  count = len(stream)
  assert results["loss"] == pytest.approx(nll / count, rel=1e-5)
  assert written["bits_per_char"] == pytest.approx(written["loss"] / math.log(2), rel=1e-12)
  assert written["bits_per_char"] == pytest.approx(nll / count / math.log(2), rel=1e-5)


def test_continuations_start_from_real_prompts_and_are_causal(lm_run, evaluated, restored):
  """predictions.validation.jsonl: each record's source is the first 16 characters of a
  validation row and its reference the characters that follow; the sampled hypotheses are
  reproduced exactly by `generate(..., prefix_lm=False)` with evaluation's key. Greedy `generate`
  with prefix_lm=False equals the full-forward causal reference, while the same model given the
  prompt as a prefix (configs/lm.py leaves model.prefix_lm=True) has different logits, so a
  prefix-LM decode would have been caught."""
  _, text, _ = lm_run
  _, _, predictions = evaluated
  run = restored
  tok, cfg = run.target_tokenizer, run.config
  assert cfg.model.prefix_lm  # what makes the causal/prefix distinction matter here
  valid = text[int(len(text) * 0.9):]
  n = evaluation.LM_PROMPT_LEN
  assert len(predictions) == evaluation.NUM_LM_SAMPLES
  prompts = []
  for i, p in enumerate(predictions):
    row = valid[i * ROW:(i + 1) * ROW]
    assert p["source"] == row[:n]
    assert row[n:].startswith(p["references"][0]) and p["hypothesis"]
    prompts.append(tok.encode(p["source"]))
  # The sampled continuations, regenerated with evaluation's settings and key.
  decode_cfg = dataclasses.replace(cfg.eval.decode, max_decode_len=MAX_LEN - n)
  tokens, _ = decoding.generate(run.model, run.params, {"prompt": jnp.asarray(prompts, jnp.int32)},
                                decode_cfg, eos_id=tok.eos_id, max_decode_len=MAX_LEN - n,
                                rng=jax.random.fold_in(jax.random.key(cfg.seed), 0),
                                prefix_lm=False)
  assert [tok.decode(t) for t in np.asarray(tokens)] == [p["hypothesis"] for p in predictions]
  # Greedy: cached decoding vs one full forward pass per token.
  greedy = dataclasses.replace(cfg.eval.decode, method="greedy")
  prompt = prompts[0]
  tokens, _ = decoding.generate(run.model, run.params, {"prompt": jnp.asarray([prompt], jnp.int32)},
                                greedy, eos_id=tok.eos_id, max_decode_len=GREEDY_LEN,
                                prefix_lm=False)
  got = [int(t) for t in np.asarray(tokens)[0] if t]
  want = greedy_by_full_forward(run, prompt, GREEDY_LEN)
  assert got == want
  causal = full_forward(run, [prompt + [1]])
  as_prefix = np.zeros((1, MAX_LEN), np.int32)
  as_prefix[0, :len(prompt)] = 1
  prefix = full_forward(run, [prompt + [1]], prefix_mask=as_prefix)
  assert not np.allclose(causal[0, len(prompt)], prefix[0, len(prompt)], atol=1e-4)


def test_restore_generate_matches_the_causal_reference(lm_run, evaluated, restored):
  """transformer.restore(workdir).generate on LM text prompts, with no max_decode_len given
  (data.max_target_len = model.max_len, as in configs/lm.py, so the default continuation is
  what fits after the prompt: 64 - 16 = 48 tokens): with the run's own settings and seed it
  reproduces evaluation's sampled continuations; greedy, it equals the full-forward causal
  reference for a batch of three prompts."""
  _, _, predictions = evaluated
  run = restored
  tok = run.target_tokenizer
  sources = [p["source"] for p in predictions]
  assert run.generate_text(sources, seed=run.config.seed) == [p["hypothesis"] for p in predictions]
  got = run.generate_text(sources[:3], method="greedy")
  for source, text in zip(sources, got):
    want = greedy_by_full_forward(run, tok.encode(source), MAX_LEN - evaluation.LM_PROMPT_LEN)
    assert text == tok.decode(want)


def test_predict_cli_continues_lm_prompts(lm_run, capsys):
  """`python -m transformer.infer.predict` on the LM run, without --max_decode_len, continues a prompt
  (exit 0, one 'prompt<TAB>continuation' line, as restore().generate); a prompt that fills the
  whole context is a one-line error naming model.max_len - 1."""
  workdir, text, _ = lm_run
  prompt = text[:12].strip()  # predict strips its inputs
  assert predict.main([f"--workdir={workdir}", "--method=greedy", prompt]) == 0
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 1 and out[0].startswith(prompt + "\t") and len(out[0]) > len(prompt) + 1
  assert predict.main([f"--workdir={workdir}", "a" * MAX_LEN]) == 1
  assert capsys.readouterr().err.strip() == (
      f"error: input 1 {inputs.shown('a' * MAX_LEN)} is too long: {MAX_LEN} tokens, the model "
      f"takes at most {MAX_LEN - 1} (model.max_len - 1)")
