"""The decoder-only prefix-LM has one prefix: the prompt (start token + source + EOS separator).

The pipeline's prefix_mask, the model's `decoder_prefix`, `api.score`, scheduled sampling and
decoding's prefill must all mark the same positions, or training and decoding attend differently.
Batches come from the real pipeline (`encode_pairs`, then the training batch assembly, one example
per row and packed rows holding several); models are tiny with random parameters. The reference
is decoding's own path: prefill of the prompt, then one cached step per gold target token.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import g2p_mini
from decoding_fixtures import random_params
from transformer.config import from_configdict, model_config
from transformer.data import load_task, pipeline
from transformer.infer import api, decoding
from transformer.data.tokenizers import (EOS_ID, NUM_SPECIAL, CharTokenizer, OffsetTokenizer,
                                         SymbolTokenizer)
from transformer.model.models import batch_logits, build_model
from transformer.train.start import fill_vocab_sizes
from transformer.train.scheduled_sampling import two_pass_logits

SOURCE = CharTokenizer(list("abcdefgh"))
PHONES = ["AA", "B", "CH", "D", "EH", "F"]
TARGET = OffsetTokenizer(SymbolTokenizer(PHONES), SOURCE.vocab_size - NUM_SPECIAL)
WORDS = ["a", "bad", "cafe", "head", "beef", "fade", "dab", "ace", "hedge", "gag"]
PAIRS = [(w, " ".join(PHONES[ord(c) * 7 % 6] for c in w[:len(w) // 2 + 1])) for w in WORDS]
ROW_LEN = 24
ATOL = 1e-5


def _encoded():
  """Each pair's prompt (source + EOS) and target (+ EOS) ids, straight from the tokenizers."""
  prompts = [SOURCE.encode(s) + [EOS_ID] for s, _ in PAIRS]
  return prompts, [TARGET.encode(t) + [EOS_ID] for _, t in PAIRS]


def _pipeline_batches() -> dict[str, dict[str, np.ndarray]]:
  """Training batches of PAIRS from the pipeline: one example per row, and packed rows."""
  examples, counts = pipeline.encode_pairs(PAIRS, SOURCE, TARGET, 10, 10, "drop",
                                           decoder_only=True)
  assert counts["dropped"] == 0
  batches = {}
  for mode, rows in (("pad", len(PAIRS)), ("pack", 3)):
    ds = pipeline.BatchDataset(examples, rows=rows, row_len={"targets": ROW_LEN}, mode=mode, seed=0)
    batches[mode] = next(iter(ds))
  return batches


def _segments(batch):
  """(row, start column, pair index) of every example in the batch, found by its tokens."""
  prompts, targets = _encoded()
  index = {tuple(p + t): i for i, (p, t) in enumerate(zip(prompts, targets))}
  out = []
  for r, seg in enumerate(batch["targets_segment_ids"]):
    for s in range(1, seg.max() + 1):
      cols = np.flatnonzero(seg == s)
      out.append((r, int(cols[0]), index[tuple(batch["targets"][r, cols].tolist())]))
  return out


@functools.cache
def _model(positional):
  cfg = model_config(arch="decoder_only", prefix_lm=True, vocab_size=TARGET.vocab_size,
                     d_model=16, num_heads=2, mlp_dim=32, num_decoder_layers=2, dropout_rate=0.0,
                     max_len=64, positional=positional)
  model = build_model(cfg)
  return model, random_params(model, (np.ones((2, 8), np.int32),))


def _teacher_forced_log_probs(model, params, batch):
  """Log-probs [b, t, v] of the training forward (model.__call__ with the batch's features)."""
  logits = jax.jit(functools.partial(batch_logits, model))(params, batch)
  return np.asarray(jax.nn.log_softmax(logits))


def _cached_log_probs(model, params, prompts, targets):
  """[n, T, v]: [i, j] = log p(. | prompt i, targets[i][:j]) from decoding's prefill of the prompts
  and one cached step per gold target token."""
  t = max(map(len, targets))
  prompt = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
  gold = np.zeros((len(targets), t), np.int32)
  for i, (p, g) in enumerate(zip(prompts, targets)):
    prompt[i, :len(p)], gold[i, :len(g)] = p, g
  logits, cache, step = decoding.prefill(model, params, {"prompt": jnp.asarray(prompt)}, t,
                                         prefix_lm=True)
  step = jax.jit(step)
  out = [logits]
  for j in range(t - 1):
    logits, cache = step(jnp.asarray(gold[:, j]), cache, jnp.int32(j))
    out.append(logits)
  return np.asarray(jax.nn.log_softmax(jnp.stack(out, axis=1)))


@pytest.mark.parametrize("positional", ["relative", "rope"])
def test_training_forward_equals_cached_decoding_on_pipeline_batches(positional):
  """On the pipeline's batches (one example per row, and packed rows with several examples), the
  training forward's log-probs at EVERY target position equal those of decoding's prefill + cached
  steps on the gold tokens, to 1e-5: training and decoding attend identically. The pipeline marks
  each example's prompt exactly: prefix_mask 1 and weight 0 on it, weight 1 on the target."""
  model, params = _model(positional)
  prompts, targets = _encoded()
  cached = _cached_log_probs(model, params, prompts, targets)
  for mode, batch in _pipeline_batches().items():
    teacher = _teacher_forced_log_probs(model, params, batch)
    segments = _segments(batch)
    if mode == "pack":
      rows = [r for r, _, _ in segments]
      assert max(rows.count(r) for r in rows) >= 2, "packed rows should hold several examples"
    for r, start, i in segments:
      p, t = len(prompts[i]), len(targets[i])
      np.testing.assert_allclose(teacher[r, start + p:start + p + t], cached[i, :t], atol=ATOL,
                                 err_msg=f"{mode} row {r}: {PAIRS[i]}")
      assert batch["prefix_mask"][r, start:start + p + t].tolist() == [1] * p + [0] * t
      assert batch["weights"][r, start:start + p + t].tolist() == [0] * p + [1] * t


def test_scheduled_sampling_never_replaces_a_prompt_input():
  """With teacher forcing 0 every replaceable decoder input is the model's own prediction, yet the
  second pass's logits at every prompt input (start token, source and separator) equal the
  teacher-forced ones: prompt inputs attend only to each other, so one replaced prompt input (the
  separator, say) would change them. Later positions do change: inputs were replaced there."""
  model, params = _model("relative")
  prompts, _ = _encoded()
  batch = _pipeline_batches()["pack"]
  one = np.asarray(batch_logits(model, params, batch))
  two = np.asarray(two_pass_logits(model, "decoder_only", params, batch, jnp.float32(0.0),
                                   jax.random.key(1), deterministic=True))
  for r, start, i in _segments(batch):
    prompt_inputs = slice(start, start + len(prompts[i]) + 1)  # start token + prompt
    np.testing.assert_allclose(two[r, prompt_inputs], one[r, prompt_inputs], atol=ATOL,
                               err_msg=f"row {r}: {PAIRS[i]}")
  assert np.abs(two - one)[batch["weights"] == 1].max() > 1e-3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """An api.Run of a random decoder-only prefix-LM on the mini G2P task (real data layer). Two
  layers: with one, prompt positions attending to the separator or not could not reach the
  targets (their keys and values are the embeddings either way)."""
  directory = str(tmp_path_factory.mktemp("prefix_lm_g2p"))
  cfg = from_configdict(g2p_mini.config(directory, **{
      "model.arch": "decoder_only", "model.num_encoder_layers": 0, "model.num_decoder_layers": 2,
      "model.positional": "relative"}))
  task = load_task(cfg)
  cfg = fill_vocab_sizes(cfg, task)
  model = build_model(cfg.model)
  return api.Run(cfg, model, random_params(model, (np.ones((2, 8), np.int32),)), task, 0, directory)


def test_score_equals_training_forward_and_cached_decoding(run):
  """api.score of (word, pronunciation) pairs equals the weighted sum of the training forward's
  log-probs on the task's own eval batch of the same pairs, and the summed log-probs of decoding's
  prefill + cached steps on the gold pronunciation (to 1e-4 nats)."""
  split = run.config.data.eval_split
  pairs = run.task._records(split)[:8]  # pylint: disable=protected-access  (eval_batches' order)
  sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
  scores = run.score(sources, targets)
  batch = next(iter(run.task.eval_batches(split, batch_size=8)))
  teacher = _teacher_forced_log_probs(run.model, run.params, batch)
  picked = np.take_along_axis(teacher, batch["targets"][..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(scores, (picked * batch["weights"]).sum(axis=1), atol=1e-4)
  gold = [run.target_tokenizer.encode(t) + [EOS_ID] for t in targets]
  cached = _cached_log_probs(run.model, run.params, [run.encode_source(s) for s in sources], gold)
  np.testing.assert_allclose(scores, [cached[i, np.arange(len(g)), g].sum()
                                      for i, g in enumerate(gold)], atol=1e-4)
