"""Sliding-window attention (model.sliding_window): the mask against loops, the fused kernel's
window, the receptive field of one layer, and a decode cache of `window` ring slots that gives the
full forward pass on sequences longer than the window (prefill, steps, left padding, shared
beams, greedy generation)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import from_configdict
from transformer.infer import decoding
from transformer.model import attention, kv_cache
from transformer.model.models import build_model
from transformer.schema import get_config

from model_fixtures import B, TOL, V, _cfg, _init, _tile
from test_attention import naive_attention
from test_models_cache import _cached, _decode_fn

W = 3  # the window of every model here; their sequences are 8 or more tokens


def allowed_pairs(t: int, window: int) -> list[list[bool]]:
  """Mistral's rule written out (transformers' masking_utils: causal, kv_idx > q_idx - window)."""
  return [[j <= i and j > i - window for j in range(t)] for i in range(t)]


@pytest.mark.parametrize("t,window", [(7, 3), (5, 1), (4, 8)])
def test_sliding_window_mask_equals_the_rule(t, window):
  """The causal mask with sliding_window_mask keeps exactly the pairs i - window < j <= i."""
  idx = jnp.arange(t)[None]
  got = attention.causal_mask(t) & attention.sliding_window_mask(idx, idx, window)
  assert np.asarray(got)[0, 0].tolist() == allowed_pairs(t, window)


@pytest.mark.parametrize("impl", ["einsum", "fused"])
def test_causal_attention_with_a_window_equals_the_loops(impl):
  """dot_product_attention(causal=True, window=W), einsum or the fused kernel's own
  local_window_size, and the fused kernel given the window as a dense mask, equal the loop
  reference over the allowed pairs (GQA: 4 query heads over 2 kv heads)."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 7, n, 8)).astype(np.float32) for n in (4, 2, 2))
  want, _ = naive_attention(q, k, v, [allowed_pairs(7, W)] * 2)
  got = attention.dot_product_attention(q, k, v, causal=True, window=W, impl=impl)
  np.testing.assert_allclose(got, want, atol=1e-5)
  idx = jnp.arange(7)[None]
  mask = attention.causal_mask(7) & attention.sliding_window_mask(idx, idx, W)
  np.testing.assert_allclose(attention.dot_product_attention(q, k, v, mask=mask, impl=impl), want,
                             atol=1e-5)


def test_one_layer_sees_only_its_window():
  """With one layer, the logits at position i are those of the window's W tokens alone (at their
  positions): nothing older reaches them; model.causal_kernel with the fused kernel's window
  gives the same logits."""
  cfg = _cfg(arch="decoder_only", positional="rope", num_decoder_layers=1, sliding_window=W)
  model, params = _init(cfg)
  tokens = np.random.default_rng(1).integers(1, V, size=(B, 10))
  apply = jax.jit(lambda m, x, pos: m.apply({"params": params}, x, decoder_positions=pos,
                                            method="decode"), static_argnums=0)
  full = np.asarray(apply(model, tokens, _tile(np.arange(10))))
  for i in range(10):
    lo = max(0, i - W + 1)
    alone = apply(model, tokens[:, lo:i + 1], _tile(np.arange(lo, i + 1)))
    np.testing.assert_allclose(full[:, i], np.asarray(alone)[:, -1], **TOL)
  fused = build_model(dataclasses.replace(cfg, attention_impl="fused", causal_kernel=True))
  got = fused.apply({"params": params}, jnp.asarray(tokens), method="decode")
  np.testing.assert_allclose(got, full, **TOL)
  assert not np.allclose(full, np.asarray(build_model(dataclasses.replace(
      cfg, sliding_window=0)).apply({"params": params}, tokens, method="decode")), **TOL)


def test_an_encoders_window_reaches_both_sides():
  """Bidirectional attention (an encoder) keeps the keys fewer than W positions away on either
  side: with one layer, changing token j changes position i's output if and only if
  |i - j| < W."""
  cfg = _cfg(arch="encoder_only", num_encoder_layers=1, sliding_window=W, positional="learned")
  model, params = _init(cfg)
  tokens = np.random.default_rng(2).integers(4, V, size=(B, 9))
  base = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))
  for j in range(9):
    changed = tokens.copy()
    changed[:, j] = 4 + (changed[:, j] - 3) % (V - 4)  # another real token
    out = np.asarray(model.apply({"params": params}, jnp.asarray(changed)))
    moved = [not np.allclose(out[:, i], base[:, i], **TOL) for i in range(9)]
    assert moved == [abs(i - j) < W for i in range(9)], j


@pytest.mark.parametrize("pos,scan,prompt_len", [("rope", False, 4), ("rope", True, 2),
                                                 ("alibi", False, 6), ("learned", False, 1)])
def test_cached_decoding_longer_than_the_window(pos, scan, prompt_len):
  """A prefill of 1-6 tokens (more than the window's 3: the ring wraps inside it) then single-token
  steps to 8 tokens give the logits of one full forward pass, and the cache holds W slots."""
  cfg = _cfg(arch="decoder_only", positional=pos, scan_layers=scan, sliding_window=W)
  rng = np.random.default_rng(5)
  tokens = np.concatenate([np.zeros((B, 1), int), rng.integers(1, V, size=(B, 7))], axis=1)
  cached, full = _cached(cfg, tokens, _tile(np.arange(8)), np.ones((B, 8), int), None,
                         prompt_len=prompt_len)
  np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-4)


def test_cached_decoding_left_padded_prompts_longer_than_the_window():
  """Rows of 8 real tokens and of 6 left-padded by 2 (positions from the first real token): cached
  decoding after a 5-token prefill equals each row's full pass; the window counts slots, padding
  included, as Hugging Face's cache positions do."""
  cfg = _cfg(arch="decoder_only", positional="rope", sliding_window=W)
  rng = np.random.default_rng(6)
  long, short = rng.integers(1, V, size=8), rng.integers(1, V, size=6)
  tokens = np.stack([long, np.pad(short, (2, 0))] * (B // 2))
  seg = np.stack([[1] * 8, [0, 0] + [1] * 6] * (B // 2))
  positions = np.stack([np.arange(8), [0, 0, 0, 1, 2, 3, 4, 5]] * (B // 2))
  cached, full = _cached(cfg, tokens, positions, seg, None, prompt_len=5)
  real = seg.astype(bool)
  np.testing.assert_allclose(cached[real], full[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scan", [False, True])
def test_bounded_cache_has_window_slots(scan):
  """The decode cache of a model with sliding_window=W has W slots per layer and per bookkeeping
  entry, whatever the decoding length (64 here); a window longer than it keeps one slot per
  token."""
  cfg = _cfg(arch="decoder_only", positional="rope", sliding_window=W, scan_layers=scan)
  model = build_model(cfg)
  cache = kv_cache.empty(model, jnp.zeros((2, 64), jnp.int32))
  for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
    name = jax.tree_util.keystr(path)
    if "cached_key" in name or "cached_value" in name:
      assert leaf.shape[-2] == W, name
    elif "cache_index" not in name:
      assert leaf.shape == (2, W), name
  wide = build_model(dataclasses.replace(cfg, sliding_window=100))
  cache = kv_cache.empty(wide, jnp.zeros((2, 64), jnp.int32))
  assert all(leaf.shape[-2] == 64 for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
             if "cached_key" in jax.tree_util.keystr(path))


def test_shared_beam_ring_equals_reordered_copies():
  """Beams sharing their row's ring (tile_beams: W slots per beam region; reorder_beams moves only
  the bookkeeping) give, step after step past the window, the logits of reordered copies."""
  cfg = _cfg(arch="decoder_only", positional="rope", sliding_window=W)
  model, params = _init(cfg)
  run = _decode_fn(cfg)
  c, k = B // 2, 2
  rng = np.random.default_rng(5)
  cache = model.init(jax.random.key(1), jnp.zeros((c, 8), jnp.int32), decode=True,
                     method="decode")["cache"]
  prompt = np.concatenate([np.zeros((c, 1), int), rng.integers(1, V, size=(c, 3))], axis=1)
  _, state = run({"params": params, "cache": cache}, None, jnp.asarray(prompt), None,
                 decode=True, decoder_positions=jnp.broadcast_to(jnp.arange(4), (c, 4)))
  shared = kv_cache.tile_beams(state["cache"], k, False)
  copies = kv_cache.reorder(state["cache"], jnp.repeat(jnp.arange(c), k), False)
  for step in range(5):
    token = jnp.asarray(rng.integers(1, V, size=(c * k, 1)))
    pos = dict(decode=True, decoder_positions=jnp.full((c * k, 1), 4 + step))
    got, state_s = run({"params": params, "cache": shared}, None, token, None, **pos)
    want, state_c = run({"params": params, "cache": copies}, None, token, None, **pos)
    np.testing.assert_allclose(got, want, **TOL)
    perm = jnp.asarray((np.arange(c)[:, None] * k + rng.integers(0, k, size=(c, k))).reshape(-1))
    shared = kv_cache.reorder_beams(state_s["cache"], perm, False)
    copies = kv_cache.reorder(state_c["cache"], perm, False)


def test_greedy_generation_equals_argmax_of_full_passes():
  """decoding.generate (greedy, a ring cache) continues prompts past the window with the tokens a
  loop of uncached full forward passes picks (argmax at the last position)."""
  cfg = _cfg(arch="decoder_only", positional="rope", sliding_window=W)
  model, params = _init(cfg)
  prompts = np.array([[5, 6, 7, 8], [3, 9, 1, 2]])
  cd = get_config()
  cd.eval.decode.update(method="greedy")
  tokens, _ = decoding.generate(model, params, {"prompt": prompts}, from_configdict(cd).eval.decode,
                                eos_id=-1, max_decode_len=6, prefix_lm=False)
  apply = jax.jit(lambda x: model.apply({"params": params}, x, method="decode"))
  for row, prompt in zip(np.asarray(tokens), prompts):
    seq = [0, *prompt]
    for want in row:
      logits = np.asarray(apply(jnp.asarray([seq])))[0, -1]
      assert want == int(np.argmax(logits))
      seq.append(int(want))


@pytest.mark.slow  # default coverage: greedy generation and cached decoding past the window
def test_beam_search_scores_equal_full_passes():
  """Beam search (3 beams sharing each row's ring, no length penalty) past the window returns
  sequences whose scores equal the log-probability a full uncached pass gives them."""
  cfg = _cfg(arch="decoder_only", positional="rope", sliding_window=W)
  model, params = _init(cfg)
  prompts = np.array([[5, 6, 7, 8], [3, 9, 1, 2]])
  cd = get_config()
  cd.eval.decode.update(method="beam", beam_size=3, length_penalty=0.0)
  tokens, scores = decoding.generate(model, params, {"prompt": prompts},
                                     from_configdict(cd).eval.decode, eos_id=-1,
                                     max_decode_len=6, prefix_lm=False)
  for row, prompt, score in zip(np.asarray(tokens), prompts, np.asarray(scores)):
    seq = [0, *prompt, *row]
    logits = model.apply({"params": params}, jnp.asarray([seq]), method="decode")[0]
    log_p = np.asarray(jax.nn.log_softmax(logits, -1))
    want = sum(log_p[i, seq[i + 1]] for i in range(len(prompt), len(seq) - 1))
    np.testing.assert_allclose(score, want, rtol=1e-4, atol=1e-4)
