"""Tests for transformer/model/attention.py: masks, dot-product attention, MultiHeadAttention and its cache."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import model_config
from transformer.model import attention, kernels, kv_cache
from transformer.model.kv_cache import DecodeStep
import masks

RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------------------------------
# Independent references written with explicit loops
# ----------------------------------------------------------------------------------------------------
def naive_attention(q, k, v, allowed, bias=None, scale=True):
  """Loops over batch, heads, queries and keys; `allowed[b][i][j]` (python bools) gates each pair;
  scores q.k / sqrt(h), or q.k with scale=False."""
  b_, t_, n_, h_ = q.shape
  s_, kh_ = k.shape[1], k.shape[2]
  g_ = n_ // kh_
  out = np.zeros((b_, t_, n_, v.shape[-1]))
  weights = np.zeros((b_, n_, t_, s_))
  for b in range(b_):
    for n in range(n_):
      kv = n // g_  # query head n reads kv head n // g
      for i in range(t_):
        keys = [j for j in range(s_) if allowed[b][i][j]]
        if not keys:
          continue  # fully masked row: zero output
        scores = {}
        for j in keys:
          scores[j] = sum(q[b, i, n, x] * k[b, j, kv, x] for x in range(h_))
          if scale:
            scores[j] /= math.sqrt(h_)
          if bias is not None:
            scores[j] += bias[b if bias.shape[0] > 1 else 0, n, i, j]
        top = max(scores.values())
        total = sum(math.exp(sc - top) for sc in scores.values())
        for j in keys:
          w = math.exp(scores[j] - top) / total
          weights[b, n, i, j] = w
          out[b, i, n] += w * v[b, j, kv]
  return out, weights


def allowed_pairs(kind, b_, t_, valid=None, segments=None, prefix=None):
  """The attention pattern built by hand, pair by pair, from its definition."""
  allowed = [[[True] * t_ for _ in range(t_)] for _ in range(b_)]
  for b in range(b_):
    for i in range(t_):
      for j in range(t_):
        ok = True
        if kind in ("causal", "segment", "prefix"):
          ok = j <= i
        if kind == "padding":
          ok = bool(valid[b, i] and valid[b, j])
        if kind in ("segment", "prefix"):
          ok = ok or (kind == "prefix" and bool(prefix[b, i] and prefix[b, j]))
          ok = ok and segments[b, i] == segments[b, j] and segments[b, i] != 0
        allowed[b][i][j] = ok
  return allowed


def random_qkv(b, t, s, n, k, h, hv):
  return (RNG.normal(size=(b, t, n, h)).astype(np.float32),
          RNG.normal(size=(b, s, k, h)).astype(np.float32),
          RNG.normal(size=(b, s, k, hv)).astype(np.float32))


# ----------------------------------------------------------------------------------------------------
# Masks and dot_product_attention
# ----------------------------------------------------------------------------------------------------
B, T = 2, 6
VALID = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]], np.int32)
PREFIX = np.array([[1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0]], bool)


def mask_for(kind):
  if kind == "causal":
    return masks.causal_mask(T)
  if kind == "padding":
    return masks.make_attention_mask(jnp.asarray(VALID), jnp.asarray(VALID))
  if kind == "segment":
    return masks.combine_masks(masks.causal_mask(T), None,
                                   attention.segment_mask(jnp.asarray(SEGMENTS), jnp.asarray(SEGMENTS)))
  return masks.prefix_lm_mask(jnp.asarray(PREFIX), jnp.asarray(SEGMENTS))


@pytest.mark.parametrize("kind", ["causal", "padding", "segment", "prefix"])
def test_masks_match_pairwise_definition(kind):
  """Each mask builder equals its definition evaluated pair by pair (causal, padding, packed
  segments, prefix-LM over packed segments), broadcastable to [b, 1, t, t]."""
  want = np.array(allowed_pairs(kind, B, T, VALID, SEGMENTS, PREFIX))
  got = np.broadcast_to(np.asarray(mask_for(kind)), (B, 1, T, T))[:, 0]
  np.testing.assert_array_equal(got, want)


def test_position_masks_for_cache_slots():
  """causal_mask_from_positions and prefix_lm_mask_from_positions on cache slots: a query in slot
  q sees slots <= q (plus all prefix slots of its segment), as in a decode step."""
  q_idx = jnp.array([[3], [3]])
  k_idx = jnp.broadcast_to(jnp.arange(6), (2, 6))
  np.testing.assert_array_equal(attention.causal_mask_from_positions(q_idx, k_idx)[:, 0, 0],
                                np.array([[1, 1, 1, 1, 0, 0]] * 2, bool))
  k_prefix = jnp.array([[1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
  k_seg = jnp.array([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
  m = attention.prefix_lm_mask_from_positions(q_idx, k_idx, jnp.array([[1], [0]]), k_prefix,
                                              jnp.array([[1], [1]]), k_seg)
  np.testing.assert_array_equal(m[:, 0, 0], np.array([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]], bool))
  np.testing.assert_array_equal(masks.valid_from_lengths(jnp.array([2, 0]), 3),
                                np.array([[1, 1, 0], [0, 0, 0]], bool))
  assert masks.combine_masks(None, None) is None


@pytest.mark.parametrize("kind", ["causal", "padding", "segment", "prefix"])
@pytest.mark.parametrize("n,k,h,hv", [(4, 4, 8, 8), (4, 2, 8, 8), (4, 1, 6, 10), (2, 2, 8, 4)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_matches_naive_loops(kind, n, k, h, hv, with_bias):
  """dot_product_attention_weights (einsum) equals explicit loops over batch, heads and positions
  with the mask applied by hand, for MHA, GQA (k=2), MQA (k=1) with d_qk != d_v, and an additive
  bias; its weights equal the reference softmax (zeros on masked pairs). The same holds with keys
  and values in the KV-cache layout [b, k, s, *] (kv_cache.attend_rows)."""
  q, kk, v = random_qkv(B, T, T, n, k, h, hv)
  bias = RNG.normal(size=(1 if kind == "causal" else B, n, T, T)).astype(np.float32) if with_bias \
      else None
  want, want_w = naive_attention(q, kk, v, allowed_pairs(kind, B, T, VALID, SEGMENTS, PREFIX), bias)
  heads_major = lambda a: jnp.asarray(a).transpose(0, 2, 1, 3)
  attend = lambda q, k, v, mask, bias: attention.dot_product_attention_weights(
      q, k, v, mask=mask, bias=bias)
  for layout, keys, values in (("bskh", jnp.asarray(kk), jnp.asarray(v)),
                               ("bksh", heads_major(kk), heads_major(v))):
    run = attend if layout == "bskh" else functools.partial(kv_cache.attend_rows, attend)
    out, w = run(jnp.asarray(q), keys, values, mask_for(kind),
                 None if bias is None else jnp.asarray(bias))
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(w, want_w, atol=1e-6)


@pytest.mark.parametrize("n,k,h,hv", [(4, 4, 8, 8), (4, 2, 8, 8), (4, 1, 6, 10), (2, 2, 8, 4)])
@pytest.mark.parametrize("kind", ["padding", "prefix"])
def test_fused_equals_einsum(n, k, h, hv, kind):
  """impl='fused' (jax.nn.dot_product_attention, zero-padded for d_qk != d_v) gives the same
  outputs as the einsum path, with GQA/MQA, a bias, and fully masked (padding) rows zeroed alike
  (also from the KV-cache layout [b, k, s, *])."""
  q, kk, v = map(jnp.asarray, random_qkv(B, T, T, n, k, h, hv))
  bias = jnp.asarray(RNG.normal(size=(B, n, T, T)).astype(np.float32))
  args = dict(mask=mask_for(kind), bias=bias)
  fused = attention.dot_product_attention(q, kk, v, impl="fused", **args)
  einsum = attention.dot_product_attention(q, kk, v, impl="einsum", **args)
  assert fused.shape == (B, T, n, hv)
  np.testing.assert_allclose(fused, einsum, atol=1e-5, rtol=1e-5)
  fused_attend = lambda q, k, v, mask, bias: (attention.dot_product_attention(
      q, k, v, mask=mask, bias=bias, impl="fused"), None)
  fused_cache_layout, _ = kv_cache.attend_rows(
      fused_attend, q, kk.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), args["mask"], bias)
  np.testing.assert_allclose(fused_cache_layout, einsum, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["einsum", "fused"])
def test_unscaled_logits_match_naive_loops(impl):
  """scale_logits=False (model.scale_attention_logits=False, T5) is softmax(q.k + bias) with no
  1/sqrt(h), on both paths, against the loops with the division left out (h = 8, so a scaled
  result would differ by far more than the tolerance)."""
  q, kk, v = random_qkv(B, T, T, 4, 2, 8, 8)
  bias = RNG.normal(size=(B, 4, T, T)).astype(np.float32)
  want, _ = naive_attention(q, kk, v, allowed_pairs("padding", B, T, VALID), bias, scale=False)
  got = attention.dot_product_attention(jnp.asarray(q), jnp.asarray(kk), jnp.asarray(v),
                                        mask=mask_for("padding"), bias=jnp.asarray(bias),
                                        impl=impl, scale_logits=False)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_fully_masked_row_is_finite_with_finite_gradients():
  """A query row with every key masked gives a zero output and zero weights (not NaN), in both
  implementations, and gradients through it stay finite."""
  q, kk, v = map(jnp.asarray, random_qkv(1, 3, 4, 2, 2, 4, 4))
  mask = jnp.ones((1, 1, 3, 4), bool).at[0, 0, 1].set(False)
  for impl in ("einsum", "fused"):
    out = attention.dot_product_attention(q, kk, v, mask=mask, impl=impl)
    assert np.all(np.isfinite(out)) and np.all(out[0, 1] == 0), impl
  grad = jax.grad(lambda q: attention.dot_product_attention(q, kk, v, mask=mask).sum())(q)
  assert np.all(np.isfinite(grad))


def test_attention_dropout_keeps_expectation_and_needs_rng():
  """Attention dropout zeroes about `rate` of the weights and rescales the rest (weights sum to 1
  in expectation), is off when deterministic, and without an rng fails with a clear error."""
  q, kk, v = map(jnp.asarray, random_qkv(2, 16, 64, 2, 2, 4, 4))
  _, w = attention.dot_product_attention_weights(q, kk, v, dropout_rate=0.5, deterministic=False,
                                                 dropout_rng=jax.random.PRNGKey(1))
  assert 0.4 < float(jnp.mean(w == 0)) < 0.6
  np.testing.assert_allclose(float(jnp.mean(jnp.sum(w, -1))), 1.0, atol=0.05)
  _, w = attention.dot_product_attention_weights(q, kk, v, dropout_rate=0.5)
  np.testing.assert_allclose(jnp.sum(w, -1), 1.0, atol=1e-5)
  for attend in (attention.dot_product_attention, attention.dot_product_attention_weights):
    with pytest.raises(ValueError, match="dropout_rng"):
      attend(q, kk, v, dropout_rate=0.5, deterministic=False)


def test_bad_shapes_are_clear_errors():
  """Shape mistakes raise one-line ValueErrors naming the problem, not deep JAX tracebacks."""
  q, kk, v = map(jnp.asarray, random_qkv(1, 3, 4, 3, 2, 4, 4))
  with pytest.raises(ValueError, match="num_kv_heads=2 must divide num_heads=3"):
    attention.dot_product_attention(q, kk, v)
  q, kk, v = map(jnp.asarray, random_qkv(1, 3, 4, 4, 2, 4, 4))
  with pytest.raises(ValueError, match="mask must be"):
    attention.dot_product_attention(q, kk, v, mask=jnp.ones((1, 3, 3, 4), bool))
  with pytest.raises(ValueError, match="impl"):
    attention.dot_product_attention(q, kk, v, impl="flash")


# ----------------------------------------------------------------------------------------------------
# MultiHeadAttention
# ----------------------------------------------------------------------------------------------------
D, L = 32, 8


def tiny_config(**overrides):
  base = dict(d_model=D, num_heads=4, num_kv_heads=2, head_dim=8, v_head_dim=8, positional="rope",
              attention_dropout_rate=0.0)
  base.update(overrides)
  return model_config(**base)


def unboxed(tree):
  return jax.tree.map(lambda a: a.unbox() if hasattr(a, "unbox") else a, tree,
                      is_leaf=lambda a: hasattr(a, "unbox"))


@pytest.mark.parametrize("overrides", [dict(), dict(num_kv_heads=4),
                                       dict(num_kv_heads=1, v_head_dim=6, positional="none"),
                                       dict(num_kv_heads=4, head_dim=16, v_head_dim=0,
                                            scale_attention_logits=False),
                                       dict(use_bias=False, qkv_bias=True),
                                       dict(num_kv_heads=4, use_bias=False, qkv_bias=True)])
def test_mha_equals_manual_projections(overrides):
  """MultiHeadAttention (fused qkv, fused kv, or separate k/v params) equals projecting by hand with
  its own kernels, RoPE on q and k at the given positions, and the naive loop attention; also with
  a head_dim independent of d_model / num_heads (16 here, not 8) and model.scale_attention_logits
  off (T5: the loops leave out the 1/sqrt(head_dim)), and with model.qkv_bias without use_bias
  (Qwen2: biases on the query/key/value projections, none on the output)."""
  cfg = tiny_config(**overrides)
  mha = attention.MultiHeadAttention(cfg)
  x = jnp.asarray(RNG.normal(size=(2, 5, D)), jnp.float32)
  positions = jnp.array([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])  # packed row, and an offset row
  variables = mha.init(jax.random.PRNGKey(0), x, positions=positions)
  p = unboxed(variables["params"])
  # Give the zero-initialised biases values so that they are tested too.
  p = jax.tree.map(lambda a: a + 0.1 * jnp.asarray(RNG.normal(size=a.shape), a.dtype), p)
  biased = cfg.use_bias or cfg.qkv_bias
  assert all(("bias" in p[name]) == (biased if name != "out" else cfg.use_bias) for name in p)
  proj = lambda name: (jnp.einsum("btd,d...->bt...", x, p[name]["kernel"]) + p[name]["bias"])
  if "qkv" in p:
    q, k, v = [proj("qkv")[:, :, i] for i in range(3)]
  else:
    q = proj("query")
    k, v = (proj("kv")[:, :, 0], proj("kv")[:, :, 1]) if "kv" in p else (proj("key"), proj("value"))
  if cfg.positional == "rope":
    from transformer.model.positional import apply_rope
    q, k = apply_rope(q, positions), apply_rope(k, positions)
  allowed = [[[True] * 5 for _ in range(5)] for _ in range(2)]
  heads, _ = naive_attention(*(np.asarray(a, np.float64) for a in (q, k, v)), allowed,
                             scale=cfg.scale_attention_logits)
  want = np.einsum("btnh,nhd->btd", heads, p["out"]["kernel"]) + p["out"].get("bias", 0.0)
  got = mha.apply({"params": p}, x, positions=positions)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("overrides", [dict(), dict(num_kv_heads=1, v_head_dim=6)])
def test_mha_fused_equals_einsum_and_sows_weights(overrides):
  """With the same parameters, attention_impl='fused' gives the einsum outputs; asking for
  'intermediates' sows [b, n, t, s] weights (rows sum to 1 where unmasked) without changing them."""
  x = jnp.asarray(RNG.normal(size=(2, 5, D)), jnp.float32)
  mask = masks.causal_mask(5)
  einsum = attention.MultiHeadAttention(tiny_config(**overrides))
  fused = attention.MultiHeadAttention(tiny_config(attention_impl="fused", **overrides))
  variables = einsum.init(jax.random.PRNGKey(0), x, mask=mask)
  y_einsum = einsum.apply(variables, x, mask=mask)
  np.testing.assert_allclose(fused.apply(variables, x, mask=mask), y_einsum, atol=1e-5)
  y, state = fused.apply(variables, x, mask=mask, mutable=["intermediates"])
  np.testing.assert_allclose(y, y_einsum, atol=1e-5)
  (w,) = state["intermediates"]["attention_weights"]
  assert w.shape == (2, 4, 5, 5)
  np.testing.assert_allclose(jnp.sum(w, -1), 1.0, atol=1e-5)
  assert np.all(np.asarray(w)[:, :, 0, 1:] == 0)  # causal: the first query sees only itself


def decode_in_chunks(mha, params, x, chunks, positions):
  """Runs decode mode over x in the given chunk sizes; returns the concatenated outputs."""
  b, total = x.shape[:2]
  cache = mha.init(jax.random.PRNGKey(0), x, decode=DecodeStep(), mask=masks.causal_mask(total),
                   positions=positions)["cache"]
  assert cache["cached_key"].shape == (b, mha.config.num_kv_heads, total, mha.config.head_dim)
  assert cache["cached_value"].shape == (b, mha.config.num_kv_heads, total, mha.config.v_head_dim)
  slots = jnp.broadcast_to(jnp.arange(total), (b, total))
  # One jitted step (compiled once per chunk size) is much faster than eager op-by-op dispatch.
  step = jax.jit(lambda v, x, mask, pos, idx: mha.apply(v, x, mask=mask, positions=pos,
                                                        decode=DecodeStep(idx), mutable=["cache"]))
  outs, start = [], 0
  for size in chunks:
    cache_index = jnp.full((b,), start, jnp.int32)
    q_idx = slots[:, start:start + size]
    mask = attention.causal_mask_from_positions(q_idx, slots)  # [b, 1, size, total]
    y, state = step({"params": params, "cache": cache}, x[:, start:start + size], mask,
                    positions[:, start:start + size], cache_index)
    cache = state["cache"]
    outs.append(y)
    start += size
  return jnp.concatenate(outs, axis=1)


@pytest.mark.parametrize("overrides", [dict(), dict(num_kv_heads=1, v_head_dim=6),
                                       dict(num_kv_heads=4, positional="none")])
def test_decode_prefill_then_steps_equals_full_causal_pass(overrides):
  """A prefill of 3 tokens, then single-token steps, then a 2-token chunk through the KV cache
  give the same outputs as one full causal pass (RoPE with offset positions; GQA, MQA, MHA)."""
  mha = attention.MultiHeadAttention(tiny_config(**overrides))
  x = jnp.asarray(RNG.normal(size=(2, L, D)), jnp.float32)
  positions = jnp.broadcast_to(jnp.arange(L) + 2, (2, L))
  params = mha.init(jax.random.PRNGKey(1), x, positions=positions)["params"]
  full = mha.apply({"params": params}, x, mask=masks.causal_mask(L), positions=positions)
  cached = decode_in_chunks(mha, params, x, [3, 1, 1, 1, 2], positions)
  np.testing.assert_allclose(cached, full, atol=1e-5, rtol=1e-5)


def test_decode_needs_cache_index_and_positions():
  """Decode-mode misuse (no cache_index after init; RoPE without positions) is a clear error."""
  mha = attention.MultiHeadAttention(tiny_config())
  x = jnp.ones((1, 4, D))
  pos = jnp.arange(4)[None]
  variables = mha.init(jax.random.PRNGKey(0), x, decode=DecodeStep(), positions=pos)
  with pytest.raises(ValueError, match="cache_index"):
    mha.apply(variables, x[:, :1], positions=pos[:, :1], decode=DecodeStep(), mutable=["cache"])
  with pytest.raises(ValueError, match="positions"):
    mha.apply(variables, x[:, :1], decode=DecodeStep(jnp.zeros(1, jnp.int32)), mutable=["cache"])


def test_cross_attention_cache_is_computed_once_and_reused():
  """Cross-attention in decode mode caches the source keys/values [b, k, s, h] on the call that
  gets `kv`; later calls with kv=None reuse them and equal a plain cross-attention call. RoPE is
  configured but cross-attention gets no positional treatment (positions do not matter)."""
  mha = attention.MultiHeadAttention(tiny_config(v_head_dim=6), cross=True)
  enc = jnp.asarray(RNG.normal(size=(2, 7, D)), jnp.float32)
  x = jnp.asarray(RNG.normal(size=(2, 3, D)), jnp.float32)
  src_mask = masks.make_attention_mask(jnp.ones((2, 1), bool), jnp.arange(7)[None] < jnp.array([[7], [4]]))
  variables = mha.init(jax.random.PRNGKey(0), x[:, :1], enc, decode=DecodeStep())
  params, cache = variables["params"], variables["cache"]
  assert cache["cached_key"].shape == (2, 2, 7, 8) and cache["cached_value"].shape == (2, 2, 7, 6)
  want = mha.apply({"params": params}, x, enc, mask=src_mask, positions=jnp.zeros((2, 3), int))
  y0, state = mha.apply({"params": params, "cache": cache}, x[:, :1], enc, mask=src_mask,
                        decode=DecodeStep(), mutable=["cache"])
  outs = [y0]
  for i in (1, 2):
    y, state = mha.apply({"params": params, "cache": state["cache"]}, x[:, i:i + 1], None,
                         mask=src_mask, decode=DecodeStep(), positions=jnp.full((2, 1), 9),
                         mutable=["cache"])
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="cross-attention needs kv"):
    mha.apply({"params": params}, x, None)


def test_cross_attention_cache_shared_by_groups_of_query_rows():
  """A cross-attention cache of c rows serves b = r*c query rows (beam search: the beams of one
  source), row i*r+j reading cache row i: outputs and sown weights equal a plain cross-attention
  call with the source repeated r times (2 queries per row, per-row source padding, MQA); a row
  count that is not a multiple of the cache's is a clear error."""
  mha = attention.MultiHeadAttention(tiny_config(num_kv_heads=1, v_head_dim=6), cross=True)
  c, r, s = 2, 3, 7
  enc = jnp.asarray(RNG.normal(size=(c, s, D)), jnp.float32)
  x = jnp.asarray(RNG.normal(size=(c * r, 2, D)), jnp.float32)
  src_valid = jnp.repeat(jnp.arange(s)[None] < jnp.array([[7], [4]]), r, axis=0)  # [b, s]
  mask = masks.make_attention_mask(jnp.ones((c * r, 2), bool), src_valid)
  variables = mha.init(jax.random.PRNGKey(0), x[:c], enc, decode=DecodeStep())  # caches c rows
  params, cache = variables["params"], variables["cache"]
  assert cache["cached_key"].shape == (c, 1, s, 8)
  want, want_state = mha.apply({"params": params}, x, jnp.repeat(enc, r, axis=0), mask=mask,
                               mutable=["intermediates"])
  got, state = mha.apply({"params": params, "cache": cache}, x, None, mask=mask,
                         decode=DecodeStep(), mutable=["cache", "intermediates"])
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  (w,), (want_w,) = (st["intermediates"]["attention_weights"] for st in (state, want_state))
  assert w.shape == (c * r, 4, 2, s)
  np.testing.assert_allclose(w, want_w, atol=1e-6)
  with pytest.raises(ValueError, match="cannot share"):
    mha.apply({"params": params, "cache": cache}, x[:5], None, decode=DecodeStep(), mutable=["cache"])


@pytest.mark.parametrize("in_shape,out_shape", [((8,), (3, 2, 4)), ((2, 4), (8,)), ((8,), (5,))])
def test_projection_gradients_equal_the_einsums(in_shape, out_shape):
  """A projection under the CPU kernels folds its in/out axes into one matmul whose kernel
  gradient is hand-written (kernels.matmul): its value and its gradients with respect to the
  input, kernel and bias equal those of the plain einsum over the unfolded axes, differentiated by
  JAX, for the fused qkv [d, 3, n, h], the output [n, h, d] and a plain [d, f] kernel."""
  x = jnp.asarray(RNG.normal(size=(2, 3, *in_shape)), jnp.float32)
  r = jnp.asarray(RNG.normal(size=(2, 3, *out_shape)), jnp.float32)
  axes = tuple(f"a{i}" for i in range(len(in_shape) + len(out_shape)))
  module = attention.projection(in_shape=in_shape, features=out_shape, axes=axes,
                                use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32,
                                kernels=kernels.BACKENDS["cpu"], name=None)
  params = jax.tree.map(lambda a: a + 0.1, module.init(jax.random.key(0), x)["params"])
  params = {k: jnp.asarray(getattr(v, "value", v)) for k, v in params.items()}
  letters = "cdefghij"
  ins, outs = letters[:len(in_shape)], letters[len(in_shape):len(axes)]
  reference = lambda p, x: jnp.einsum(f"bt{ins},{ins}{outs}->bt{outs}", x, p["kernel"]) + p["bias"]
  ours = lambda p, x: module.apply({"params": p}, x)
  np.testing.assert_allclose(ours(params, x), reference(params, x), rtol=1e-5, atol=1e-5)
  grad = lambda f: jax.grad(lambda p, x: jnp.sum(f(p, x) * r), argnums=(0, 1))(params, x)
  for got, want in zip(jax.tree.leaves(grad(ours)), jax.tree.leaves(grad(reference))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_projection_keeps_output_axes_that_a_mesh_splits_unfolded():
  """The CPU projection folds its output axes into one matmul column only when no mesh axis > 1
  splits them: under the project's logical rules a 'tensor' axis of 2 splits 'heads' (the fused
  qkv [d, 3, n, h] then stays unfolded, so XLA need not reshard it), a data-parallel mesh splits
  nothing, and without a mesh nothing is split."""
  import flax.linen as nn
  from transformer.train import parallel
  qkv_out = (None, "heads", "head_dim")
  def unsplit(shape):
    mesh = jax.sharding.AbstractMesh(shape, ("data", "fsdp", "tensor"))
    with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
      return kernels.unsplit(qkv_out), kernels.unsplit(("embed",))
  assert unsplit((1, 1, 2)) == (False, True)
  assert unsplit((2, 1, 1)) == (True, True)
  assert kernels.unsplit(qkv_out)


def test_mha_dropout_uses_dropout_rng():
  """With attention_dropout_rate > 0, deterministic=False draws from the 'dropout' rng (outputs
  change with the key) and deterministic=True is unaffected by it."""
  mha = attention.MultiHeadAttention(tiny_config(attention_dropout_rate=0.5))
  x = jnp.asarray(RNG.normal(size=(1, 6, D)), jnp.float32)
  variables = mha.init(jax.random.PRNGKey(0), x)
  run = lambda seed, det: mha.apply(variables, x, deterministic=det,
                                    rngs={"dropout": jax.random.PRNGKey(seed)})
  assert not np.allclose(run(1, False), run(2, False))
  np.testing.assert_array_equal(run(1, True), run(2, True))


def test_bfloat16_compute_keeps_float32_params_and_finite_output():
  """dtype=bfloat16 computes in bfloat16 (output dtype) while parameters stay float32."""
  mha = attention.MultiHeadAttention(tiny_config(dtype="bfloat16"))
  x = jnp.asarray(RNG.normal(size=(1, 4, D)), jnp.float32)
  variables = mha.init(jax.random.PRNGKey(0), x)
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(unboxed(variables["params"])))
  y = mha.apply(variables, x, mask=masks.causal_mask(4))
  assert y.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(y, np.float32)))
