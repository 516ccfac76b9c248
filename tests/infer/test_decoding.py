"""Tests of transformer/infer/decoding.py: the search loops on toy distributions, then generate() on models."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decoding_fixtures import _decode_cfg, _full_forward_log_probs, _length, _tiny_model
from transformer.infer import decoding
from transformer.infer.decoding import Search

# ----------------------------------------------------------------------------- toy step functions


def _prefix_index(hist, n, vocab):
  """A unique integer per token prefix hist[:, :n] (all shorter prefixes come first); NumPy or jnp."""
  xp = jnp if isinstance(hist, jax.Array) else np
  weights = vocab ** xp.arange(hist.shape[1])
  number = xp.sum(xp.where(xp.arange(hist.shape[1]) < n, hist * weights, 0), axis=1)
  return (vocab ** n - 1) // (vocab - 1) + number


def _sample(step_fn, first_logits, cache, rng=None, **kwargs):
  """decoding.sample_search, jit-compiled as generate() does (eager loops are slow)."""
  run = jax.jit(lambda f, c, r: decoding.sample_search(step_fn, f, c, rng=r, **kwargs))
  return run(first_logits, cache, jax.random.key(0) if rng is None else rng)


def _beam(step_fn, first_logits, cache, **kwargs):
  """decoding.beam_search, jit-compiled."""
  return jax.jit(lambda f, c: decoding.beam_search(step_fn, f, c, **kwargs))(first_logits, cache)


def _toy(batch, vocab, max_len, seed=0):
  """A prefix-dependent random distribution: (table [b, prefixes, v], first_logits, cache, step_fn)."""
  num_prefixes = (vocab ** (max_len + 1) - 1) // (vocab - 1)
  table = jax.random.normal(jax.random.key(seed), (batch, num_prefixes, vocab)) * 2.0

  def step_fn(tokens, cache, j):
    hist, row = cache
    hist = hist.at[:, j].set(tokens)
    logits = table[row, _prefix_index(hist, j + 1, vocab)]
    return logits, (hist, row)

  cache = (jnp.zeros((batch, max_len), jnp.int32), jnp.arange(batch))
  return np.asarray(table), table[:, 0], cache, step_fn


def _enumerate(table_row, vocab, eos, max_len, alpha):
  """Every complete hypothesis (ends in EOS, or reaches max_len; never pad 0) with its GNMT score,
  best first."""
  log_probs = table_row - np.log(np.sum(np.exp(table_row), axis=-1, keepdims=True))
  results = []
  for n in range(1, max_len + 1):
    for seq in itertools.product(range(1, vocab), repeat=n):
      if eos in seq[:-1] or (n < max_len and seq[-1] != eos):
        continue
      logp = 0.0
      for t in range(n):
        hist = np.array([seq + (0,) * (max_len - n)])
        index = int(_prefix_index(hist, t, vocab)[0])
        logp += log_probs[index, seq[t]]
      results.append((logp / ((5.0 + n) / 6.0) ** alpha, seq))
  return sorted(results, key=lambda r: -r[0])


# ----------------------------------------------------------------------------- beam search


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_search_finds_best_enumerated_candidate(alpha):
  """With a beam as wide as the candidates of any step, beam search is exact: its k results are
  the k best of all enumerated hypotheses under the length-penalised score, in order (this also
  proves the early stop never cuts off a better hypothesis, even when alpha favours long ones)."""
  vocab, eos, max_len, batch = 4, 3, 4, 3  # tokens 1, 2 and EOS 3 (0 is padding)
  k = (vocab - 2) ** (max_len - 1) * (vocab - 1)  # live prefixes x their continuations
  table, first_logits, cache, step_fn = _toy(batch, vocab, max_len, seed=1)
  seqs, scores = _beam(step_fn, first_logits, cache, beam_size=k, alpha=alpha,
                       eos_id=eos, max_len=max_len, return_all_beams=True)
  for r in range(batch):
    expected = _enumerate(table[r], vocab, eos, max_len, alpha)[:k]
    for j, (score, seq) in enumerate(expected):
      assert tuple(np.asarray(seqs[r, j, :len(seq)])) == seq
      assert np.all(np.asarray(seqs[r, j, len(seq):]) == 0)
      np.testing.assert_allclose(scores[r, j], score, rtol=1e-5)


def test_small_beam_returns_a_consistent_hypothesis():
  """With beam 2 the returned score is exactly the recomputed length-penalised score of the returned
  sequence, and no enumerated hypothesis scores above the best possible (sanity of the bookkeeping)."""
  vocab, eos, max_len, batch, alpha = 4, 3, 4, 4, 0.6
  table, first_logits, cache, step_fn = _toy(batch, vocab, max_len, seed=2)
  seqs, scores = _beam(step_fn, first_logits, cache, beam_size=2, alpha=alpha,
                       eos_id=eos, max_len=max_len)
  for r in range(batch):
    by_seq = {seq: score for score, seq in _enumerate(table[r], vocab, eos, max_len, alpha)}
    row = tuple(int(t) for t in seqs[r])
    seq = row[:row.index(eos) + 1] if eos in row else row
    np.testing.assert_allclose(scores[r], by_seq[seq], rtol=1e-5)
    assert scores[r] <= max(by_seq.values()) + 1e-6


@pytest.mark.parametrize("vocab", [40, 5003, 8192])
def test_top_k_log_probs_equals_top_k_of_log_softmax(vocab):
  """top_k_log_probs (for a large vocabulary: block maxima, then top-k over the k best blocks)
  returns exactly the ids of lax.top_k(log_softmax), ties between rounded logits resolved to the
  lowest id alike, and its log-probs; with 5003 the partial last block holds the row's best ids."""
  rng = np.random.default_rng(vocab)
  logits = np.round(rng.normal(size=(6, vocab)) * 2) / 2
  logits[0, -2:] = 9.0  # the best two of row 0 in the last, partial block (a tie)
  want_values, want_ids = jax.lax.top_k(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)), 9)
  values, ids = jax.jit(decoding.top_k_log_probs, static_argnums=1)(logits, 9)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_allclose(values, want_values, atol=1e-5)


def test_beam_one_equals_greedy_on_toy():
  """Beam size 1 without length penalty follows the argmax path: the same tokens as greedy."""
  vocab, eos, max_len, batch = 4, 3, 5, 6
  _, first_logits, cache, step_fn = _toy(batch, vocab, max_len, seed=3)
  greedy, greedy_scores = _sample(step_fn, first_logits, cache, search=Search("greedy"),
                                  eos_id=eos, max_len=max_len)
  beam, beam_scores = _beam(step_fn, first_logits, cache, beam_size=1, alpha=0.0,
                            eos_id=eos, max_len=max_len)
  np.testing.assert_array_equal(greedy, beam)
  np.testing.assert_allclose(greedy_scores, beam_scores, rtol=1e-5)


def test_greedy_matches_python_argmax_and_stops_at_eos():
  """Greedy equals a plain Python argmax loop over the toy table (pad 0 excluded); tokens after EOS
  are 0."""
  vocab, eos, max_len, batch = 4, 3, 4, 5
  table, first_logits, cache, step_fn = _toy(batch, vocab, max_len, seed=4)
  seqs, scores = _sample(step_fn, first_logits, cache, search=Search("greedy"),
                         eos_id=eos, max_len=max_len)
  for r in range(batch):
    prefix, logp = [], 0.0
    while len(prefix) < max_len and (not prefix or prefix[-1] != eos):
      hist = np.array([prefix + [0] * (max_len - len(prefix))])
      row = table[r, int(_prefix_index(hist, len(prefix), vocab)[0])]
      prefix.append(int(np.argmax(row[1:])) + 1)
      logp += float(row[prefix[-1]] - np.log(np.sum(np.exp(row))))
    expected = prefix + [0] * (max_len - len(prefix))
    assert [int(t) for t in seqs[r]] == expected
    np.testing.assert_allclose(scores[r], logp, rtol=1e-5)


# ----------------------------------------------------------------------------- sampling


def _fixed(logits, batch):
  """A step function whose next-token logits never change."""
  logits = jnp.asarray(logits, jnp.float32)
  step_fn = lambda tokens, cache, j: (jnp.tile(logits, (tokens.shape[0], 1)), cache)
  return jnp.tile(logits, (batch, 1)), step_fn


def test_top_k_one_equals_greedy():
  """Sampling restricted to the top-1 token (at any temperature) is greedy decoding."""
  _, first_logits, cache, step_fn = _toy(6, 4, 5, seed=5)
  greedy, _ = _sample(step_fn, first_logits, cache, search=Search("greedy"),
                      eos_id=3, max_len=5)
  sampled, _ = _sample(step_fn, first_logits, cache,
                       search=Search("sample", temperature=3.0, top_k=1),
                       eos_id=3, max_len=5, rng=jax.random.key(7))
  np.testing.assert_array_equal(greedy, sampled)


def test_top_p_samples_only_the_nucleus_with_renormalised_frequencies():
  """With top_p=0.75, 20k samples land only on the smallest top set holding >= 75% of the mass,
  with frequencies within 4 sigma of the renormalised nucleus probabilities (NumPy reference)."""
  probs = np.array([1e-9, 0.4, 0.05, 0.25, 0.2, 0.1])  # sorted: 0.4, 0.25, 0.2 (cum 0.85) | ...
  nucleus = np.array([1, 3, 4])
  first_logits, step_fn = _fixed(np.log(probs), 2000)
  seqs, _ = _sample(step_fn, first_logits, None, search=Search("sample", top_p=0.75),
                    eos_id=-1, max_len=10, rng=jax.random.key(0))
  samples = np.asarray(seqs).ravel()
  assert set(np.unique(samples)) == set(nucleus)
  expected = probs[nucleus] / probs[nucleus].sum()
  freq = np.array([(samples == t).mean() for t in nucleus])
  sigma = np.sqrt(expected * (1 - expected) / samples.size)
  assert np.all(np.abs(freq - expected) < 4 * sigma)


def test_temperature_and_top_k_frequencies():
  """Temperature 2 with top_k=3 samples softmax(logits/2) renormalised over the 3 largest logits."""
  logits = np.array([-50.0, 2.0, -1.0, 0.5, 1.0, -3.0])
  first_logits, step_fn = _fixed(logits, 2000)
  seqs, _ = _sample(step_fn, first_logits, None,
                    search=Search("sample", temperature=2.0, top_k=3),
                    eos_id=-1, max_len=10, rng=jax.random.key(1))
  samples = np.asarray(seqs).ravel()
  top = np.array([1, 4, 3])
  assert set(np.unique(samples)) == set(top)
  expected = np.exp(logits[top] / 2) / np.exp(logits[top] / 2).sum()
  freq = np.array([(samples == t).mean() for t in top])
  assert np.all(np.abs(freq - expected) < 4 * np.sqrt(expected * (1 - expected) / samples.size))


def test_same_seed_same_samples_different_seed_different():
  """Sampling is a pure function of the key: equal keys agree, another key disagrees somewhere."""
  _, first_logits, cache, step_fn = _toy(8, 4, 5, seed=6)
  search = Search("sample", temperature=1.5, top_p=0.9)
  compiled = jax.jit(lambda r: decoding.sample_search(step_fn, first_logits, cache, search=search,
                                                     eos_id=3, max_len=5, rng=r)[0])
  run = lambda seed: compiled(jax.random.key(seed))
  np.testing.assert_array_equal(run(1), run(1))
  assert np.any(np.asarray(run(1)) != np.asarray(run(2)))


def test_pad_is_never_generated():
  """Token 0 (padding/start) is excluded from every method even when it has the largest logit."""
  logits = np.array([5.0, 1.0, 0.5, 0.0])
  first_logits, step_fn = _fixed(logits, 50)
  for search in [Search("greedy"), Search("sample", temperature=2.0)]:
    seqs, _ = _sample(step_fn, first_logits, None, search=search, eos_id=-1, max_len=4)
    assert np.all(np.asarray(seqs) != 0)
  seqs, _ = _beam(step_fn, first_logits, None, beam_size=3, alpha=0.6, eos_id=-1, max_len=4,
                  return_all_beams=True)
  assert np.all(np.asarray(seqs) != 0)


def test_search_settings_errors():
  """Bad decode settings fail with a one-line message naming the config key."""
  class Cfg:
    method, beam_size, length_penalty, temperature, top_k, top_p, max_decode_len = (
        "sample", 4, 0.6, 1.0, 0, 1.0, 10)
  cfg = Cfg()
  cfg.method = "nucleus"
  with pytest.raises(ValueError, match="eval.decode.method='nucleus'"):
    decoding.search_settings(cfg)
  cfg.method, cfg.temperature = "sample", 0.0
  with pytest.raises(ValueError, match="eval.decode.temperature=0.0"):
    decoding.search_settings(cfg)
  cfg.method, cfg.beam_size = "beam", 0
  with pytest.raises(ValueError, match="eval.decode.beam_size=0"):
    decoding.search_settings(cfg)
  cfg.beam_size = 3
  with pytest.raises(ValueError, match="eval.decode.temperature=0.0"):  # as the config: any method
    decoding.search_settings(cfg)
  cfg.temperature = 1.0
  assert decoding.search_settings(cfg) == Search("beam", beam_size=3, length_penalty=0.6)


# ----------------------------------------------------------------------------- generate() on models


@pytest.mark.parametrize("arch,overrides", [
    ("encoder_decoder", dict(positional="sinusoidal")),
    ("encoder_decoder", dict(positional="relative", norm_position="pre")),
    ("decoder_only", dict(positional="rope", prefix_lm=False)),
    ("decoder_only", dict(positional="relative", prefix_lm=True)),
])
def test_cached_greedy_equals_full_forward_argmax(arch, overrides):
  """Cached greedy decoding (encoder once / one-call left-padded prefill, then one token per step)
  picks at every step the argmax of an uncached full forward pass over the sequence so far, and its
  score is the full pass's summed log-prob up to EOS: cache offsets, positions (sinusoidal,
  relative, RoPE), padding and the prefix-LM mask all agree with the training path."""
  model, params, src = _tiny_model(arch, **overrides)
  batch = {"inputs": src} if arch == "encoder_decoder" else {"prompt": src}
  eos, max_len = 5, 7
  gen, scores = decoding.generate(model, params, batch, _decode_cfg(), eos_id=eos,
                                  max_decode_len=max_len)
  gen = np.asarray(gen)
  log_probs, _ = _full_forward_log_probs(model, params, src, gen,
                                         overrides.get("prefix_lm", False))
  for r in range(len(src)):
    n = _length(gen[r], eos)
    np.testing.assert_array_equal(gen[r, :n], log_probs[r, :n, 1:].argmax(-1) + 1)  # pad excluded
    assert np.all(gen[r, n:] == 0)
    np.testing.assert_allclose(scores[r], log_probs[r, np.arange(n), gen[r, :n]].sum(), rtol=1e-4)


@pytest.mark.parametrize("arch,overrides", [
    ("encoder_decoder", dict(positional="sinusoidal")),  # greedy reuses the compile above
    ("decoder_only", dict(positional="rope", scan_layers=True, prefix_lm=True)),
])
def test_beam_scores_match_full_forward(arch, overrides):
  """Every returned beam's score equals the length-penalised log-prob of its tokens under an
  uncached full forward pass (so the KV cache was reordered with the beams, also under
  scan_layers), beams come best first, and (encoder-decoder) beam 1 without penalty is greedy."""
  model, params, src = _tiny_model(arch, **overrides)
  batch = {"inputs": src} if arch == "encoder_decoder" else {"prompt": src}
  eos, max_len, alpha, k = 5, 7, 0.6, 3
  beams, scores = decoding.generate(model, params, batch, _decode_cfg("beam", k, alpha), eos_id=eos,
                                    max_decode_len=max_len, return_all_beams=True)
  beams, scores = np.asarray(beams), np.asarray(scores)
  assert beams.shape == (len(src), k, max_len)
  assert np.all(np.diff(scores, axis=1) <= 1e-6)
  for j in range(k):
    log_probs, _ = _full_forward_log_probs(model, params, src, beams[:, j], True)
    for r in range(len(src)):
      n = _length(beams[r, j], eos)
      logp = log_probs[r, np.arange(n), beams[r, j, :n]].sum()
      np.testing.assert_allclose(scores[r, j], logp / ((5 + n) / 6) ** alpha, rtol=1e-4)
  if arch == "decoder_only":
    return
  greedy, _ = decoding.generate(model, params, batch, _decode_cfg(), eos_id=eos, max_decode_len=max_len)
  beam1, _ = decoding.generate(model, params, batch, _decode_cfg("beam", 1), eos_id=eos,
                               max_decode_len=max_len)
  np.testing.assert_array_equal(greedy, beam1)


def test_generate_input_errors_and_jit_reuse():
  """Bad batches fail with one-line messages; a second call with the same model, settings and
  shapes reuses the compiled decoder (no retrace)."""
  model, params, src = _tiny_model("decoder_only", positional="learned")
  with pytest.raises(ValueError, match=r"needs batch\['prompt'\]"):
    decoding.generate(model, params, {"inputs": src}, _decode_cfg(), eos_id=2, max_decode_len=4)
  with pytest.raises(ValueError, match="exceeds model.max_len=64"):
    decoding.generate(model, params, {"prompt": src}, _decode_cfg(), eos_id=2, max_decode_len=60)
  first = decoding.generate(model, params, {"prompt": src}, _decode_cfg(), eos_id=2, max_decode_len=4)
  misses = decoding._compiled.cache_info().misses
  fn = decoding._compiled((model,), decoding.Search("greedy"), 2, 4, False, True, True)
  traces = fn._cache_size()
  second = decoding.generate(model, params, {"prompt": src}, _decode_cfg(), eos_id=2, max_decode_len=4)
  assert decoding._compiled.cache_info().misses == misses
  assert fn._cache_size() == traces
  np.testing.assert_array_equal(first[0], second[0])
