"""Tests for transformer.models: properties every correct Transformer must have.

Tiny models (d_model 32, 4 heads sharing 2 kv heads (GQA), 2 layers, vocab 13) run eagerly, and
every test uses the same few array shapes (batch 8, lengths 8, 4 and 1) so that XLA compiles each
operation once for the whole file. Positional tables (relative, learned) are re-initialised large
so that a wrong position would visibly change the numbers.
"""

import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import ConfigError, model_config
from transformer.kv_cache import reorder as reorder_cache
from transformer.kv_cache import reorder_beams as reorder_beam_cache
from transformer.kv_cache import tile_beams as tile_beam_cache
from transformer.models import build_model, shift_right
from transformer.positional import ENCODINGS

V, SV = 13, 11  # target and source vocabulary sizes
ARCHS = ['encoder_decoder', 'decoder_only']
POSITIONALS = list(ENCODINGS)  # every encoding of the table
TOL = dict(rtol=2e-5, atol=2e-5)
B = 8  # batch size of every call


def _cfg(**overrides):
  base = dict(vocab_size=V, source_vocab_size=SV, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64,
              num_encoder_layers=2, num_decoder_layers=2, max_len=64)
  base.update(overrides)
  return model_config(**base)


@functools.cache
def _init(cfg):
  """(model, unboxed params) for a config; position tables scaled up to stddev ~1. A scanned
  config gets the unrolled config's params, stacked (see test_scan_and_remat_...)."""
  model = build_model(cfg)
  if cfg.scan_layers:
    return model, _stack_layers(_init(dataclasses.replace(cfg, scan_layers=False))[1])
  x = jnp.ones((B, 4), jnp.int32)
  args = (x, x) if cfg.arch == 'encoder_decoder' else (x,)
  params = nn.meta.unbox(model.init(jax.random.key(0), *args)['params'])
  def scale(path, leaf):
    names = {getattr(k, 'key', None) for k in path}
    return leaf * 50.0 if names & {'relative_bias', 'position_embed'} else leaf
  return model, jax.tree_util.tree_map_with_path(scale, params)




def _forward(cfg, params, inputs, targets, **kw):
  model = build_model(cfg)
  if cfg.arch == 'encoder_decoder':
    return model.apply({'params': params}, jnp.asarray(inputs), jnp.asarray(targets), **kw)
  kw = {k: v for k, v in kw.items() if not k.startswith('inputs_')}
  return model.apply({'params': params}, jnp.asarray(targets), **kw)


def _tile(row):
  return np.tile(np.asarray(row)[None], (B, 1))


def _perturb(tokens, rng, vocab):
  """Changes every token to a different nonzero token."""
  return 1 + (tokens - 1 + rng.integers(1, vocab - 1, size=tokens.shape)) % (vocab - 1)


@pytest.mark.parametrize('pos', POSITIONALS)
@pytest.mark.parametrize('arch', ARCHS)
def test_causality(arch, pos):
  """Changing the targets at positions >= i never changes the logits at positions <= i (the
  prediction of target i never sees it), and does change the logits at i + 1 (non-vacuous)."""
  cfg = _cfg(arch=arch, positional=pos)
  _, params = _init(cfg)
  rng = np.random.default_rng(0)
  t = 8
  base = rng.integers(1, V, size=t)
  rows = [base] + [np.concatenate([base[:i], _perturb(base[i:], rng, V)]) for i in range(t - 1)]
  inputs = _tile(rng.integers(1, SV, size=8))
  logits = np.asarray(_forward(cfg, params, inputs, np.stack(rows)))
  for i in range(t - 1):
    np.testing.assert_allclose(logits[i + 1, :i + 1], logits[0, :i + 1], **TOL)
    assert not np.allclose(logits[i + 1, i + 1], logits[0, i + 1], **TOL)


@pytest.mark.parametrize('pos', POSITIONALS)
@pytest.mark.parametrize('arch', ARCHS)
def test_padding_and_batch_independence(arch, pos):
  """A short example zero-padded to length 8 in a batch with a different full-length example
  gives the logits of each example computed in a batch of its own without padding: padding and
  the other examples change nothing."""
  cfg = _cfg(arch=arch, positional=pos)
  _, params = _init(cfg)
  rng = np.random.default_rng(1)
  short = (rng.integers(1, SV, size=4), rng.integers(1, V, size=4))
  full = (rng.integers(1, SV, size=8), rng.integers(1, V, size=8))
  pad = lambda x: np.pad(x, (0, 8 - len(x)))
  inputs = np.stack([pad(short[0]), full[0]] * (B // 2))
  targets = np.stack([pad(short[1]), full[1]] * (B // 2))
  batch = np.asarray(_forward(cfg, params, inputs, targets))
  alone_short = np.asarray(_forward(cfg, params, _tile(short[0]), _tile(short[1])))
  alone_full = np.asarray(_forward(cfg, params, _tile(full[0]), _tile(full[1])))
  np.testing.assert_allclose(batch[0, :4], alone_short[0], **TOL)
  np.testing.assert_allclose(batch[1], alone_full[0], **TOL)


def _pack(seqs, length):
  """Packs 1-D sequences into one row: tokens, segment ids 1, 2, ... and restarting positions."""
  tokens, seg, pos = (np.zeros(length, np.int32) for _ in range(3))
  start = 0
  for k, s in enumerate(seqs):
    tokens[start:start + len(s)] = s
    seg[start:start + len(s)] = k + 1
    pos[start:start + len(s)] = np.arange(len(s))
    start += len(s)
  return _tile(tokens), _tile(seg), _tile(pos)


@pytest.mark.parametrize('pos', POSITIONALS)
@pytest.mark.parametrize('arch', ARCHS)
def test_packing(arch, pos):
  """A packed row holding two sequences (segment ids 1, 2, positions restarting at 0) gives each
  sequence's logits computed alone."""
  cfg = _cfg(arch=arch, positional=pos)
  _, params = _init(cfg)
  rng = np.random.default_rng(2)
  srcs = [rng.integers(1, SV, size=4), rng.integers(1, SV, size=4)]
  tgts = [rng.integers(1, V, size=4), rng.integers(1, V, size=4)]
  inputs, iseg, ipos = _pack(srcs, 8)
  targets, tseg, tpos = _pack(tgts, 8)
  packed = _forward(cfg, params, inputs, targets, inputs_segment_ids=iseg, inputs_positions=ipos,
                    targets_segment_ids=tseg, targets_positions=tpos)
  alone = [_forward(cfg, params, _tile(s), _tile(t))[0] for s, t in zip(srcs, tgts)]
  np.testing.assert_allclose(packed[0, :4], alone[0], **TOL)
  np.testing.assert_allclose(packed[0, 4:], alone[1], **TOL)


@pytest.mark.parametrize('pos', POSITIONALS)
def test_prefix_lm(pos):
  """With prefix_mask over the first P target tokens (source + separator), the decoder inputs
  0..P attend bidirectionally: changing the last prefix token changes the logits at every prefix
  input. Target positions stay causal: changing targets j >= P leaves the logits at <= j
  unchanged. Control: the same params with prefix_lm=False are causal everywhere."""
  cfg = _cfg(arch='decoder_only', positional=pos)
  _, params = _init(cfg)
  rng = np.random.default_rng(3)
  t, p = 8, 3
  base = rng.integers(1, V, size=t)
  rows = [base, np.concatenate([base[:p - 1], _perturb(base[p - 1:p], rng, V), base[p:]])]
  rows += [np.concatenate([base[:j], _perturb(base[j:], rng, V)]) for j in range(p, t)]
  rows += [base] * (B - len(rows))
  prefix_mask = _tile((np.arange(t) < p).astype(np.int32))
  logits = np.asarray(_forward(cfg, params, None, np.stack(rows), prefix_mask=prefix_mask))
  for j in range(p + 1):  # every prefix input sees the last prefix token (input p)
    assert not np.allclose(logits[1, j], logits[0, j], **TOL)
  for r, j in enumerate(range(p, t)):
    np.testing.assert_allclose(logits[2 + r, :j + 1], logits[0, :j + 1], **TOL)
  causal = dataclasses.replace(cfg, prefix_lm=False)
  logits = np.asarray(_forward(causal, params, None, np.stack(rows), prefix_mask=prefix_mask))
  np.testing.assert_allclose(logits[1, :p], logits[0, :p], **TOL)


@functools.cache
def _decode_fn(cfg):
  """apply(method='decode'); decode=True returns (logits, {'cache'}); jitted under scan_layers
  (an eager nn.scan would recompile on every call)."""
  model = build_model(cfg)
  def run(variables, encoded, tokens, enc_seg, decode=False, **kw):
    args = (encoded, tokens) if cfg.arch == 'encoder_decoder' else (tokens,)
    if cfg.arch == 'encoder_decoder':
      kw['encoder_segment_ids'] = enc_seg
    if decode:
      return model.apply(variables, *args, method='decode', decode=True, mutable=['cache'], **kw)
    return model.apply(variables, *args, method='decode', **kw)
  return jax.jit(run, static_argnames='decode') if cfg.scan_layers else run


def _encode(cfg, params, inputs):
  if cfg.arch != 'encoder_decoder':
    return None
  return build_model(cfg).apply({'params': params}, jnp.asarray(inputs), method='encode')


def _init_cache(cfg, encoded, enc_seg):
  dummy = jnp.zeros((B, 8), jnp.int32)
  if cfg.arch == 'encoder_decoder':
    return build_model(cfg).init(jax.random.key(1), encoded, dummy, encoder_segment_ids=enc_seg,
                                 decode=True, method='decode')['cache']
  return build_model(cfg).init(jax.random.key(1), dummy, decode=True, method='decode')['cache']


def _cached(cfg, tokens, positions, seg, prefix, prompt_len=4):
  """Prefill of prompt_len tokens + single-token cached steps; returns (cached, full) logits."""
  _, params = _init(cfg)
  run = _decode_fn(cfg)
  inputs = _tile(np.pad(np.random.default_rng(4).integers(1, SV, size=6), (0, 2)))  # padded
  enc_seg = jnp.asarray(inputs != 0, jnp.int32)
  encoded = _encode(cfg, params, inputs)
  kw = dict(decoder_positions=jnp.asarray(positions), decoder_segment_ids=jnp.asarray(seg))
  if prefix is not None:
    kw['decoder_prefix_mask'] = jnp.asarray(prefix)
  full = run({'params': params}, encoded, jnp.asarray(tokens), enc_seg, **kw)
  cache = _init_cache(cfg, encoded, enc_seg)
  outs = []
  for lo, hi in [(0, prompt_len)] + [(i, i + 1) for i in range(prompt_len, tokens.shape[1])]:
    step_kw = {k: v[:, lo:hi] for k, v in kw.items()}
    if prefix is not None and lo >= prompt_len:
      step_kw['decoder_prefix_mask'] = jnp.zeros((B, 1), jnp.int32)
    logits, state = run({'params': params, 'cache': cache}, encoded if lo == 0 else None,
                        jnp.asarray(tokens[:, lo:hi]), enc_seg, decode=True, **step_kw)
    cache = state['cache']
    outs.append(logits)
  return np.concatenate(outs, axis=1), np.asarray(full)


CACHE_CASES = ([(arch, pos, False) for arch in ARCHS for pos in POSITIONALS]
               + [('encoder_decoder', 'rope', True), ('decoder_only', 'relative', True)])


@pytest.mark.parametrize('arch,pos,scan', CACHE_CASES)
def test_cached_decoding_matches_full_forward(arch, pos, scan):
  """Prefill of 4 tokens then 4 single-token cached steps (GQA: 4 heads, 2 kv heads) give the
  logits of one full forward pass; the enc-dec reuses its cached cross-attention keys/values
  after the prefill (encoded=None), over a padded source."""
  cfg = _cfg(arch=arch, positional=pos, scan_layers=scan)
  rng = np.random.default_rng(5)
  tokens = np.concatenate([np.zeros((B, 1), int), rng.integers(1, V, size=(B, 7))], axis=1)
  cached, full = _cached(cfg, tokens, _tile(np.arange(8)), np.ones((B, 8), int), None)
  np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('prefix_lm', [False, True])
@pytest.mark.parametrize('pos', POSITIONALS)
def test_cached_decoding_left_padded_prompts(pos, prefix_lm):
  """A batch mixing 4-token prompts and 2-token prompts left-padded to 4 (bidirectional prefix-LM
  prompts when prefix_lm), decoded with the cache, gives each row's full forward pass alone."""
  cfg = _cfg(arch='decoder_only', positional=pos)
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
      kw['decoder_prefix_mask'] = jnp.asarray(_tile(np.arange(8) < n), jnp.int32)
    alone = np.asarray(run({'params': params}, None, jnp.asarray(_tile(row)), None, **kw)[0])
    keep = 8 if r == 0 else 6
    np.testing.assert_allclose(cached[r, 8 - keep:], alone[:keep], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('scan', [False, True])
def test_reorder_cache(scan):
  """After reorder_cache(cache, perm) a cached step gives, in row i, row perm[i]'s logits."""
  cfg = _cfg(arch='encoder_decoder', positional='rope', scan_layers=scan)  # as in CACHE_CASES
  _, params = _init(cfg)
  run = _decode_fn(cfg)
  rng = np.random.default_rng(7)
  inputs = rng.integers(1, SV, size=(B, 8))
  enc_seg = jnp.ones((B, 8), jnp.int32)
  encoded = _encode(cfg, params, inputs)
  cache = _init_cache(cfg, encoded, enc_seg)
  prompt = np.concatenate([np.zeros((B, 1), int), rng.integers(1, V, size=(B, 3))], axis=1)
  _, state = run({'params': params, 'cache': cache}, encoded, jnp.asarray(prompt), enc_seg,
                 decode=True, decoder_positions=jnp.asarray(_tile(np.arange(4))))
  step = dict(decode=True, decoder_positions=jnp.full((B, 1), 4))
  token = jnp.full((B, 1), 7)
  want, _ = run({'params': params, 'cache': state['cache']}, None, token, enc_seg, **step)
  perm = np.array([3, 3, 0, 1, 7, 6, 5, 4])
  reordered = reorder_cache(state['cache'], jnp.asarray(perm), scan)
  got, _ = run({'params': params, 'cache': reordered}, None, token, enc_seg, **step)
  np.testing.assert_allclose(got, np.asarray(want)[perm], **TOL)
  assert not np.allclose(want[0], want[3], **TOL)


@pytest.mark.parametrize('arch,pos,scan', [('decoder_only', 'alibi', False),
                                           ('encoder_decoder', 'rope', True)])
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
  args = (encoded, dummy) if arch == 'encoder_decoder' else (dummy,)
  kw = {'encoder_segment_ids': enc_seg} if arch == 'encoder_decoder' else {}
  cache = model.init(jax.random.key(1), *args, decode=True, method='decode', **kw)['cache']
  prompt = np.concatenate([np.zeros((c, 1), int), rng.integers(1, V, size=(c, 2))], axis=1)
  _, state = run({'params': params, 'cache': cache}, encoded, jnp.asarray(prompt), enc_seg,
                 decode=True, decoder_positions=jnp.broadcast_to(jnp.arange(3), (c, 3)))
  shared = tile_beam_cache(state['cache'], k, scan)
  copies = reorder_cache(state['cache'], jnp.repeat(jnp.arange(c), k), scan)
  kv = jax.tree_util.tree_leaves_with_path(shared)
  assert any('self_attention' in jax.tree_util.keystr(p) and x.shape[int(scan)] == c
             for p, x in kv)  # the shared layout is exercised
  enc_seg = jnp.repeat(enc_seg, k, axis=0)
  for step in range(4):
    token = jnp.asarray(rng.integers(1, V, size=(c * k, 1)))
    pos = dict(decode=True, decoder_positions=jnp.full((c * k, 1), 3 + step))
    got, state_s = run({'params': params, 'cache': shared}, None, token, enc_seg, **pos)
    want, state_c = run({'params': params, 'cache': copies}, None, token, enc_seg, **pos)
    np.testing.assert_allclose(got, want, **TOL)
    perm = jnp.asarray((np.arange(c)[:, None] * k + rng.integers(0, k, size=(c, k))).reshape(-1))
    shared = reorder_beam_cache(state_s['cache'], perm, scan)
    copies = reorder_cache(state_c['cache'], perm, scan)


def _stack_layers(tree):
  """Unrolled params (layers_0, layers_1, ...) -> the scanned layout ('layers', stacked on axis 0)."""
  if not isinstance(tree, dict):
    return tree
  names = sorted((k for k in tree if re.fullmatch(r'layers_\d+', k)), key=lambda k: int(k[7:]))
  out = {k: _stack_layers(v) for k, v in tree.items() if k not in names}
  if names:
    out['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs), *[tree[k] for k in names])
  return out


def _unstack_layers(tree):
  """The inverse of _stack_layers."""
  if not isinstance(tree, dict):
    return tree
  out = {k: _unstack_layers(v) for k, v in tree.items() if k != 'layers'}
  if 'layers' in tree:
    n = jax.tree.leaves(tree['layers'])[0].shape[0]
    out.update({f'layers_{i}': jax.tree.map(lambda x, i=i: x[i], tree['layers'])
                for i in range(n)})
  return out


@pytest.mark.parametrize('arch', ARCHS)
def test_scan_and_remat_do_not_change_numbers(arch):
  """scan_layers on/off and remat none/full/dots/dots_no_batch give the same loss and the same
  gradients from the same parameters (converted between unrolled and stacked layouts); the
  scanned model's own init has exactly the stacked layout."""
  base = _cfg(arch=arch, positional='relative')
  _, params = _init(base)
  rng = np.random.default_rng(8)
  inputs = np.pad(rng.integers(1, SV, size=(B, 6)), ((0, 0), (0, 2)))
  targets = np.pad(rng.integers(1, V, size=(B, 7)), ((0, 0), (0, 1)))
  w = jnp.asarray(rng.normal(size=(B, 8, V)), jnp.float32)
  def loss(cfg, p):
    return jnp.sum(_forward(cfg, p, inputs, targets) * w)
  ref, ref_grad = jax.value_and_grad(functools.partial(loss, base))(params)
  variants = [(True, 'none'), (False, 'full'), (True, 'dots')]
  if arch == 'decoder_only':  # the same stack code; one more policy, kept short for speed
    variants = [(True, 'dots_no_batch')]
  for scan, remat in variants:
    cfg = dataclasses.replace(base, scan_layers=scan, remat=remat)
    p = _stack_layers(params) if scan else params
    args = (jnp.asarray(targets),)
    if arch == 'encoder_decoder':
      args = (jnp.asarray(inputs),) + args
    own = jax.eval_shape(build_model(cfg).init, jax.random.key(0), *args)['params']
    assert (jax.tree.map(lambda x: x.shape, nn.meta.unbox(own))
            == jax.tree.map(lambda x: x.shape, p))
    value, grad = jax.value_and_grad(functools.partial(loss, cfg))(p)
    np.testing.assert_allclose(value, ref, rtol=1e-5)
    grad = _unstack_layers(grad) if scan else grad
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 grad, ref_grad)


def test_base_transformer_parameter_count():
  """The paper's base model (6+6 layers, d=512, 8 heads, d_ff=2048, one shared 37000-token table
  tied to the output, biases in every projection, LayerNorm scale+bias, sinusoidal positions)
  has exactly V*d + 6*(4(d^2+d) + 2*d*d_ff + d_ff + d + 2*2d)
  + 6*(8(d^2+d) + 2*d*d_ff + d_ff + d + 3*2d) = 63,082,496 parameters (shapes only)."""
  cfg = model_config(vocab_size=37000, source_vocab_size=37000)
  assert (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.d_model, cfg.num_heads,
          cfg.mlp_dim, cfg.tie_embeddings, cfg.share_src_tgt_embeddings) == (6, 6, 512, 8, 2048,
                                                                            True, True)
  v, d, f = 37000, 512, 2048
  enc = 4 * (d * d + d) + 2 * d * f + f + d + 2 * 2 * d
  dec = 8 * (d * d + d) + 2 * d * f + f + d + 3 * 2 * d
  want = v * d + 6 * enc + 6 * dec
  assert want == 63_082_496
  x = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), x, x)['params']
  assert sum(int(np.prod(l.shape)) for l in jax.tree.leaves(shapes)) == want


def test_parameters_carry_logical_axis_names():
  """Every parameter is boxed with one known logical axis name per dimension; under scan_layers
  the layers' parameters lead with 'layers'."""
  allowed = {'vocab', 'embed', 'mlp', 'heads', 'kv_heads', 'head_dim', 'layers', 'relpos_buckets',
             'length', 'norm', None}
  for positional in ('relative', 'learned'):
    cfg = _cfg(positional=positional, scan_layers=True, tie_embeddings=False)
    x = jnp.ones((B, 8), jnp.int32)
    shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), x, x)['params']
    is_box = lambda leaf: isinstance(leaf, nn.LogicallyPartitioned)
    flat = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_box)[0]
    for path, leaf in flat:
      assert is_box(leaf), path
      assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed, (path, leaf.names)
      if any(getattr(k, 'key', None) == 'layers' for k in path):
        assert leaf.names[0] == 'layers', path


@pytest.mark.parametrize('share,tie', [(True, True), (True, False), (False, True), (False, False)])
def test_embedding_sharing_and_tying(share, tie):
  """share_src_tgt_embeddings: one table (the larger vocabulary) for both stacks, else a source
  [SV, d] and a target [V, d] table; tie_embeddings: logits from the target table, else a
  separate [d, V] projection. Logits are [b, t, V] float32 either way."""
  cfg = _cfg(share_src_tgt_embeddings=share, tie_embeddings=tie)
  model, x = build_model(cfg), jnp.ones((B, 8), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), x, x)['params'])
  tables = {k: v['embedding'].shape for k, v in params.items() if k.endswith('embed')}
  if share:
    assert tables == {'token_embed': (max(V, SV), 32)}
  else:
    assert tables == {'source_embed': (SV, 32), 'target_embed': (V, 32)}
  assert ('logits_dense' in params['decoder']) == (not tie)
  if not tie:
    assert params['decoder']['logits_dense']['kernel'].shape == (32, V)
  logits = jax.eval_shape(model.apply, {'params': params}, x, x)
  assert logits.shape == (B, 8, V) and logits.dtype == jnp.float32


@pytest.mark.parametrize('arch', ARCHS)
def test_bfloat16_compute_gives_float32_logits_close_to_float32(arch):
  """dtype=bfloat16 (float32 params) returns float32 logits within bfloat16 rounding of the
  float32 model's logits."""
  cfg = _cfg(arch=arch, positional='rope', norm_position='pre', ffn='swiglu', norm='rmsnorm')
  _, params = _init(cfg)
  rng = np.random.default_rng(9)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(1, V, size=(B, 8))
  full = np.asarray(_forward(cfg, params, inputs, targets))
  half = _forward(dataclasses.replace(cfg, dtype='bfloat16'), params, inputs, targets)
  assert half.dtype == jnp.float32
  err = np.abs(np.asarray(half) - full).max() / full.std()
  assert 1e-4 < err < 0.1, err  # really computed in bfloat16, and close


def test_dropout_only_in_training():
  """deterministic=True ignores every dropout rate; deterministic=False with dropout changes
  the logits and is reproducible for the same rng."""
  cfg = _cfg(arch='encoder_decoder', positional='sinusoidal')
  _, params = _init(cfg)
  noisy = dataclasses.replace(cfg, dropout_rate=0.3, attention_dropout_rate=0.3,
                              ffn_dropout_rate=0.3)
  rng = np.random.default_rng(10)
  inputs, targets = rng.integers(1, SV, size=(B, 8)), rng.integers(1, V, size=(B, 8))
  clean = _forward(dataclasses.replace(cfg, dropout_rate=0.0), params, inputs, targets)
  np.testing.assert_allclose(_forward(noisy, params, inputs, targets), clean, **TOL)
  train = lambda key: _forward(noisy, params, inputs, targets, deterministic=False,
                               rngs={'dropout': jax.random.key(key)})
  assert not np.allclose(train(0), clean, atol=1e-3)
  np.testing.assert_array_equal(train(0), train(0))
  assert not np.allclose(train(0), train(1), atol=1e-3)


def test_shift_right_is_segment_aware():
  """Targets shift right by one with 0 (the start token) at the start of every packed segment."""
  targets = jnp.asarray([[5, 6, 7, 8, 9, 0]])
  seg = jnp.asarray([[1, 1, 2, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets, seg), [[0, 5, 0, 7, 8, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[0, 5, 6, 7, 8, 9]])


def test_build_model_requires_vocab_sizes():
  """build_model raises ConfigError naming the key when a vocabulary size is still 0."""
  with pytest.raises(ConfigError, match=r'model\.vocab_size=0'):
    build_model(_cfg(vocab_size=0))
  with pytest.raises(ConfigError, match=r'model\.source_vocab_size=0'):
    build_model(_cfg(source_vocab_size=0))
  assert build_model(_cfg(arch='decoder_only', source_vocab_size=0)) is not None
