"""Model tests: cached decoding equals the full forward pass (prefill, steps, left-padded prompts),
and beam reorders of the cache (copied rows, shared beam rows) act as reordering the rows."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model.kv_cache import reorder as reorder_cache, reorder_beams as reorder_beam_cache
from transformer.model.kv_cache import tile_beams as tile_beam_cache
from transformer.model.models import build_model

from model_fixtures import ARCHS, B, POSITIONALS, SV, TOL, V, _cfg, _init, _tile


@functools.cache
def _decode_fn(cfg):
  """apply(method='decode'); decode=True returns (logits, {'cache'}); jitted under scan_layers
  (an eager nn.scan would recompile on every call)."""
  model = build_model(cfg)
  def run(variables, encoded, tokens, enc_seg, decode=False, **kw):
    args = (encoded, tokens) if cfg.arch == "encoder_decoder" else (tokens,)
    if cfg.arch == "encoder_decoder":
      kw["encoder_segment_ids"] = enc_seg
    if decode:
      return model.apply(variables, *args, method="decode", decode=True, mutable=["cache"], **kw)
    return model.apply(variables, *args, method="decode", **kw)
  return jax.jit(run, static_argnames="decode") if cfg.scan_layers else run


def _encode(cfg, params, inputs):
  if cfg.arch != "encoder_decoder":
    return None
  return build_model(cfg).apply({"params": params}, jnp.asarray(inputs), method="encode")


def _init_cache(cfg, encoded, enc_seg):
  dummy = jnp.zeros((B, 8), jnp.int32)
  if cfg.arch == "encoder_decoder":
    return build_model(cfg).init(jax.random.key(1), encoded, dummy, encoder_segment_ids=enc_seg,
                                 decode=True, method="decode")["cache"]
  return build_model(cfg).init(jax.random.key(1), dummy, decode=True, method="decode")["cache"]


def _cached(cfg, tokens, positions, seg, prefix, prompt_len=4):
  """Prefill of prompt_len tokens + single-token cached steps; returns (cached, full) logits."""
  _, params = _init(cfg)
  run = _decode_fn(cfg)
  inputs = _tile(np.pad(np.random.default_rng(4).integers(1, SV, size=6), (0, 2)))  # padded
  enc_seg = jnp.asarray(inputs != 0, jnp.int32)
  encoded = _encode(cfg, params, inputs)
  kw = dict(decoder_positions=jnp.asarray(positions), decoder_segment_ids=jnp.asarray(seg))
  if prefix is not None:
    kw["decoder_prefix_mask"] = jnp.asarray(prefix)
  full = run({"params": params}, encoded, jnp.asarray(tokens), enc_seg, **kw)
  cache = _init_cache(cfg, encoded, enc_seg)
  outs = []
  for lo, hi in [(0, prompt_len)] + [(i, i + 1) for i in range(prompt_len, tokens.shape[1])]:
    step_kw = {k: v[:, lo:hi] for k, v in kw.items()}
    if prefix is not None and lo >= prompt_len:
      step_kw["decoder_prefix_mask"] = jnp.zeros((B, 1), jnp.int32)
    logits, state = run({"params": params, "cache": cache}, encoded if lo == 0 else None,
                        jnp.asarray(tokens[:, lo:hi]), enc_seg, decode=True, **step_kw)
    cache = state["cache"]
    outs.append(logits)
  return np.concatenate(outs, axis=1), np.asarray(full)


CACHE_CASES = ([(arch, pos, False) for arch in ARCHS for pos in POSITIONALS]
               + [("encoder_decoder", "rope", True), ("decoder_only", "relative", True)])


@pytest.mark.parametrize("arch,pos,scan", CACHE_CASES)
def test_cached_decoding_matches_full_forward(arch, pos, scan):
  """Prefill of 4 tokens then 4 single-token cached steps (GQA: 4 heads, 2 kv heads) give the
  logits of one full forward pass; the enc-dec reuses its cached cross-attention keys/values
  after the prefill (encoded=None), over a padded source."""
  cfg = _cfg(arch=arch, positional=pos, scan_layers=scan)
  rng = np.random.default_rng(5)
  tokens = np.concatenate([np.zeros((B, 1), int), rng.integers(1, V, size=(B, 7))], axis=1)
  cached, full = _cached(cfg, tokens, _tile(np.arange(8)), np.ones((B, 8), int), None)
  np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prefix_lm", [False, True])
@pytest.mark.parametrize("pos", POSITIONALS)
def test_cached_decoding_left_padded_prompts(pos, prefix_lm):
  """A batch mixing 4-token prompts and 2-token prompts left-padded to 4 (bidirectional prefix-LM
  prompts when prefix_lm), decoded with the cache, gives each row's full forward pass alone."""
  cfg = _cfg(arch="decoder_only", positional=pos)
  rng = np.random.default_rng(6)
  long, short = rng.integers(1, V, size=8), rng.integers(1, V, size=6)
  tokens = np.stack([long, np.pad(short, (2, 0))] * (B // 2))
  seg = np.stack([[1] * 8, [0, 0] + [1] * 6] * (B // 2))
  positions = np.stack([np.arange(8), [0, 0, 0, 1, 2, 3, 4, 5]] * (B // 2))
  prefix = None
  if prefix_lm:
    prefix = np.stack([[1] * 4 + [0] * 4, [0, 0, 1, 1] + [0] * 4] * (B // 2))
  cached, _ = _cached(cfg, tokens, positions, seg, prefix)
  _, params = _init(cfg)
  run = _decode_fn(cfg)
  # Alone: the short row gets two extra trailing tokens (same shapes; causality ignores them).
  for r, (row, n) in enumerate([(long, 4), (np.concatenate([short, [3, 4]]), 2)]):
    kw = {}
    if prefix_lm:
      kw["decoder_prefix_mask"] = jnp.asarray(_tile(np.arange(8) < n), jnp.int32)
    alone = np.asarray(run({"params": params}, None, jnp.asarray(_tile(row)), None, **kw)[0])
    keep = 8 if r == 0 else 6
    np.testing.assert_allclose(cached[r, 8 - keep:], alone[:keep], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scan", [False, True])
def test_reorder_cache(scan):
  """After reorder_cache(cache, perm) a cached step gives, in row i, row perm[i]'s logits."""
  cfg = _cfg(arch="encoder_decoder", positional="rope", scan_layers=scan)  # as in CACHE_CASES
  _, params = _init(cfg)
  run = _decode_fn(cfg)
  rng = np.random.default_rng(7)
  inputs = rng.integers(1, SV, size=(B, 8))
  enc_seg = jnp.ones((B, 8), jnp.int32)
  encoded = _encode(cfg, params, inputs)
  cache = _init_cache(cfg, encoded, enc_seg)
  prompt = np.concatenate([np.zeros((B, 1), int), rng.integers(1, V, size=(B, 3))], axis=1)
  _, state = run({"params": params, "cache": cache}, encoded, jnp.asarray(prompt), enc_seg,
                 decode=True, decoder_positions=jnp.asarray(_tile(np.arange(4))))
  step = dict(decode=True, decoder_positions=jnp.full((B, 1), 4))
  token = jnp.full((B, 1), 7)
  want, _ = run({"params": params, "cache": state["cache"]}, None, token, enc_seg, **step)
  perm = np.array([3, 3, 0, 1, 7, 6, 5, 4])
  reordered = reorder_cache(state["cache"], jnp.asarray(perm), scan)
  got, _ = run({"params": params, "cache": reordered}, None, token, enc_seg, **step)
  np.testing.assert_allclose(got, np.asarray(want)[perm], **TOL)
  assert not np.allclose(want[0], want[3], **TOL)


@pytest.mark.parametrize("arch,pos,scan", [("decoder_only", "alibi", False),
                                           ("encoder_decoder", "rope", True)])
def test_shared_beam_cache_equals_reordered_copies(arch, pos, scan):
  """Beams sharing their row's self-attention keys/values (tile_beam_cache; reorder_beam_cache
  moves only the slot bookkeeping) give, step after step, the same logits as physically tiled and
  reordered copies of the cache (reorder_cache), for beam reorders within each row's group."""
  cfg = _cfg(arch=arch, positional=pos, scan_layers=scan)
  model, params = _init(cfg)
  run = _decode_fn(cfg)
  c, k = B // 2, 2
  rng = np.random.default_rng(5)
  enc_seg = jnp.ones((c, 8), jnp.int32)
  encoded = _encode(cfg, params, rng.integers(1, SV, size=(c, 8)))
  dummy = jnp.zeros((c, 8), jnp.int32)
  args = (encoded, dummy) if arch == "encoder_decoder" else (dummy,)
  kw = {"encoder_segment_ids": enc_seg} if arch == "encoder_decoder" else {}
  cache = model.init(jax.random.key(1), *args, decode=True, method="decode", **kw)["cache"]
  prompt = np.concatenate([np.zeros((c, 1), int), rng.integers(1, V, size=(c, 2))], axis=1)
  _, state = run({"params": params, "cache": cache}, encoded, jnp.asarray(prompt), enc_seg,
                 decode=True, decoder_positions=jnp.broadcast_to(jnp.arange(3), (c, 3)))
  shared = tile_beam_cache(state["cache"], k, scan)
  copies = reorder_cache(state["cache"], jnp.repeat(jnp.arange(c), k), scan)
  kv = jax.tree_util.tree_leaves_with_path(shared)
  assert any("self_attention" in jax.tree_util.keystr(p) and x.shape[int(scan)] == c
             for p, x in kv)  # the shared layout is exercised
  enc_seg = jnp.repeat(enc_seg, k, axis=0)
  for step in range(4):
    token = jnp.asarray(rng.integers(1, V, size=(c * k, 1)))
    pos = dict(decode=True, decoder_positions=jnp.full((c * k, 1), 3 + step))
    got, state_s = run({"params": params, "cache": shared}, None, token, enc_seg, **pos)
    want, state_c = run({"params": params, "cache": copies}, None, token, enc_seg, **pos)
    np.testing.assert_allclose(got, want, **TOL)
    perm = jnp.asarray((np.arange(c)[:, None] * k + rng.integers(0, k, size=(c, k))).reshape(-1))
    shared = reorder_beam_cache(state_s["cache"], perm, scan)
    copies = reorder_cache(state_c["cache"], perm, scan)
