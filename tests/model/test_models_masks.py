"""Model tests: what each position may see (causality, padding and batch independence, packed
segments, the prefix-LM's bidirectional prefix), for every architecture and positional encoding."""

import dataclasses

import numpy as np
import pytest

from model_fixtures import ARCHS, B, POSITIONALS, SV, TOL, V, _cfg, _forward, _init, _perturb, _tile


@pytest.mark.parametrize("pos", POSITIONALS)
@pytest.mark.parametrize("arch", ARCHS)
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


@pytest.mark.parametrize("pos", POSITIONALS)
@pytest.mark.parametrize("arch", ARCHS)
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


@pytest.mark.parametrize("pos", POSITIONALS)
@pytest.mark.parametrize("arch", ARCHS)
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


@pytest.mark.parametrize("pos", POSITIONALS)
def test_prefix_lm(pos):
  """With prefix_mask over the first P target tokens (source + separator), the decoder inputs
  0..P attend bidirectionally: changing the last prefix token changes the logits at every prefix
  input. Target positions stay causal: changing targets j >= P leaves the logits at <= j
  unchanged. Control: the same params with prefix_lm=False are causal everywhere."""
  cfg = _cfg(arch="decoder_only", positional=pos)
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
