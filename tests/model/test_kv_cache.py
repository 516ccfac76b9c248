"""Tests for transformer/model/kv_cache.py against independent NumPy references.

A toy decoder (one attention layer whose queries, keys and values are the inputs themselves, no
projections) writes through kv_cache exactly as the model does, so the cache's bookkeeping, the
self-attention writes, the shared beam rows and the beam reorders are checked alone: against
attention over explicit per-beam histories kept in NumPy lists and copied on every reorder.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import attention, kv_cache

RNG = np.random.default_rng(0)
H, L = 4, 8  # head size, cache length (max_len)


def naive_attend(q, k, v, mask, bias):
  """jnp softmax attention for one head: q [b, t, 1, h], k/v [b, s, 1, h], mask [b, 1, t, s]."""
  logits = jnp.einsum("bth,bsh->bts", q[:, :, 0], k[:, :, 0]) / np.sqrt(q.shape[-1])
  logits = jnp.where(mask[:, 0], logits, -1e30)
  return jnp.einsum("bts,bsh->bth", jax.nn.softmax(logits, -1), v[:, :, 0])[:, :, None], None


class ToyAttention(nn.Module):
  @nn.compact
  def __call__(self, q, k, v, mask, step):
    cache = kv_cache.SelfAttentionCache(name="cache")
    nn.share_scope(self, cache)
    return cache(q, k, v, mask, None, step, naive_attend)[0]


class ToyDecoder(nn.Module):
  """Stack bookkeeping (kv_cache.StackCache) + one causal self-attention layer over the cache."""
  @nn.compact
  def __call__(self, q, k, v):
    b, t = q.shape[:2]
    stack_cache = kv_cache.StackCache(name="stack_cache")
    nn.share_scope(self, stack_cache)
    positions = stack_cache.next_positions(t)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    slots = stack_cache(positions, jnp.ones((b, t), jnp.int32), jnp.zeros((b, t), bool))
    mask = attention.causal_mask_from_positions(slots.q_idx, slots.k_idx)
    return ToyAttention(name="self_attention")(q, k, v, mask, slots.step)


def reference(q, history_k, history_v):
  """Attention of q [h] over one row's history (lists of [h] keys and values), in NumPy."""
  keys, values = np.stack(history_k), np.stack(history_v)
  logits = keys @ q / np.sqrt(len(q))
  weights = np.exp(logits - logits.max())
  return (weights / weights.sum()) @ values


def step(cache, q, k, v):
  out, state = ToyDecoder().apply({"cache": cache}, q, k, v, mutable=["cache"])
  return np.asarray(out), state["cache"]


def qkv(rows, t):
  return [jnp.asarray(RNG.normal(size=(rows, t, 1, H)), jnp.float32) for _ in range(3)]


def test_cached_steps_equal_attention_over_the_whole_history():
  """A prefill of 3 tokens then single-token steps through the cache give, for every query,
  attention over its row's keys/values so far (the causal full forward pass)."""
  b = 2
  cache = ToyDecoder().init(jax.random.key(0), *qkv(b, L))["cache"]
  assert cache["self_attention"]["cached_key"].shape == (b, 1, L, H)  # [b, k, L, h]
  hist_k, hist_v = [[] for _ in range(b)], [[] for _ in range(b)]
  for t in (3, 1, 1, 2):
    q, k, v = qkv(b, t)
    out, cache = step(cache, q, k, v)
    for row in range(b):
      before = len(hist_k[row])
      hist_k[row] += list(np.asarray(k[row, :, 0]))
      hist_v[row] += list(np.asarray(v[row, :, 0]))
      for j in range(t):  # query j sees the keys up to and including its own
        want = reference(np.asarray(q[row, j, 0]), hist_k[row][:before + j + 1],
                         hist_v[row][:before + j + 1])
        np.testing.assert_allclose(out[row, j, 0], want, rtol=1e-5, atol=1e-5)


def test_shared_beam_rows_equal_naive_per_beam_copies():
  """tile_beams then steps with reorder_beams (beams sharing their source's keys/values rows) equal
  attention over per-beam histories that NumPy copies on every reorder (the flax layout)."""
  c, r = 2, 3
  cache = ToyDecoder().init(jax.random.key(0), *qkv(c, L))["cache"]
  q, k, v = qkv(c, 2)
  _, cache = step(cache, q, k, v)  # prefill: 2 tokens per source row
  hist_k = [[np.asarray(k[row, j, 0]) for j in range(2)] for row in range(c)]
  hist_v = [[np.asarray(v[row, j, 0]) for j in range(2)] for row in range(c)]
  cache = kv_cache.tile_beams(cache, r, scan_layers=False)
  assert cache["self_attention"]["cached_key"].shape == (c, 1, r * L, H)  # shared, not copied
  hist_k = [list(hist_k[i // r]) for i in range(c * r)]  # the naive copy per beam
  hist_v = [list(hist_v[i // r]) for i in range(c * r)]
  for _ in range(4):
    q, k, v = qkv(c * r, 1)
    out, cache = step(cache, q, k, v)
    for row in range(c * r):
      hist_k[row].append(np.asarray(k[row, 0, 0]))
      hist_v[row].append(np.asarray(v[row, 0, 0]))
      want = reference(np.asarray(q[row, 0, 0]), hist_k[row], hist_v[row])
      np.testing.assert_allclose(out[row, 0, 0], want, rtol=1e-5, atol=1e-5)
    perm = (np.arange(c)[:, None] * r + RNG.integers(0, r, size=(c, r))).reshape(-1)
    cache = kv_cache.reorder_beams(cache, jnp.asarray(perm), scan_layers=False)
    hist_k = [list(hist_k[p]) for p in perm]
    hist_v = [list(hist_v[p]) for p in perm]


def test_reorder_gathers_every_leaf_on_its_batch_axis():
  """reorder equals np.take on axis 0, or on axis 1 for the leaves of scanned layers."""
  b = 4
  cache = {"cache_index": np.arange(b),
           "layers": {"self_attention": {"cached_key": RNG.normal(size=(3, b, 2, 5, H))},
                      "cached_rows": RNG.integers(0, 9, size=(3, b, 5))}}
  idx = np.array([2, 2, 0, 3])
  got = kv_cache.reorder(jax.tree.map(jnp.asarray, cache), jnp.asarray(idx), scan_layers=True)
  np.testing.assert_array_equal(got["cache_index"], np.take(cache["cache_index"], idx, 0))
  for name in ("self_attention", "cached_rows"):
    leaf = cache["layers"][name]
    leaf = leaf["cached_key"] if name == "self_attention" else leaf
    got_leaf = got["layers"][name]
    got_leaf = got_leaf["cached_key"] if name == "self_attention" else got_leaf
    np.testing.assert_allclose(got_leaf, np.take(leaf, idx, 1))


def test_split_cross_and_join_round_trip():
  """split_cross takes out exactly the cross-attention leaves; join puts them back."""
  cache = {"decoder": {"cache_index": jnp.zeros(2),
                       "layers_0": {"self_attention": {"cached_key": jnp.ones((2, 1, 3, H))},
                                    "cross_attention": {"cached_key": jnp.ones((2, 1, 5, H))}}}}
  rest, cross = kv_cache.split_cross(cache)
  assert list(cross) == [("decoder", "layers_0", "cross_attention", "cached_key")]
  assert "cross_attention" not in rest["decoder"]["layers_0"]
  assert jax.tree.structure(kv_cache.join(rest, cross)) == jax.tree.structure(cache)
