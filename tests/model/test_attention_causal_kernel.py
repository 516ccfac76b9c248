"""model.causal_kernel: decoder self-attention through the kernel's own causal flag
(jax.nn.dot_product_attention is_causal=True, implementation 'xla' on the CPU) gives the outputs of
the dense causal mask, and a decoder-only model's loss and gradients are those of the masked path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config import model_config
from transformer.model import attention
from transformer.model.losses import cross_entropy
from transformer.model.models import build_model

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def xla_kernel(monkeypatch):
  """The fused path asks jax for implementation='xla' (what a GPU's cuDNN call is checked against)."""
  monkeypatch.setattr(attention, "_fused_implementation", lambda dtype: "xla")


def qkv(b=2, t=6, n=4, kv=2, h=8):
  q, k, v = (jnp.asarray(RNG.normal(size=(b, t, heads, h)), jnp.float32)
             for heads in (n, kv, kv))
  return q, k, v


def test_causal_flag_equals_the_dense_causal_mask():
  """No mask: the flag alone is the lower triangle; with a segment mask (packing, a padded tail
  whose rows are fully masked: zeros) the flag adds the triangle to it; einsum and fused agree."""
  q, k, v = qkv()
  dense = attention.dot_product_attention(q, k, v, mask=attention.causal_mask(6))
  for impl in ("fused", "einsum"):
    np.testing.assert_allclose(attention.dot_product_attention(q, k, v, impl=impl, causal=True),
                               dense, atol=1e-6, rtol=1e-6)
  seg = jnp.asarray([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
  segments = attention.segment_mask(seg, seg)
  dense = attention.dot_product_attention(
      q, k, v, mask=attention.combine_masks(segments, attention.causal_mask(6)))
  assert np.all(np.asarray(dense)[1, 4:] == 0)  # padding rows: zeros
  for impl in ("fused", "einsum"):
    got = attention.dot_product_attention(q, k, v, mask=segments, impl=impl, causal=True)
    np.testing.assert_allclose(got, dense, atol=1e-6, rtol=1e-6)
  with pytest.raises(ValueError, match="as many queries as keys"):
    attention.dot_product_attention(q[:, :3], k, v, causal=True)


def lm_config(**overrides):
  return model_config(arch="decoder_only", vocab_size=13, d_model=32, num_heads=4, num_kv_heads=2,
                      mlp_dim=64, num_encoder_layers=0, num_decoder_layers=1, max_len=64,
                      norm_position="pre", **overrides)


def loss_and_grads(cfg, params, batches):
  """[((loss, logits), grads)] of each batch, in one compiled call."""
  model = build_model(cfg)

  def loss(p, batch):
    logits = model.apply({"params": p}, batch["targets"],
                         targets_segment_ids=batch.get("targets_segment_ids"),
                         targets_positions=batch.get("targets_positions"))
    return cross_entropy(logits, batch["targets"], batch["weights"])[0], logits

  grad = jax.value_and_grad(loss, has_aux=True)
  return jax.jit(lambda p: [grad(p, b) for b in batches])(params)


def test_decoder_only_loss_and_gradients_equal_the_masked_path():
  """Unpacked rows with a padded tail (no segment ids: no dense mask at all) and packed rows
  (segment ids: the segment mask plus the flag): same loss, gradients and weighted logits."""
  targets = RNG.integers(1, 13, (4, 8)).astype(np.int32)
  targets[0, 5:] = 0
  targets[2, 3:] = 0
  unpacked = dict(targets=jnp.asarray(targets), weights=jnp.asarray(targets != 0, jnp.float32))
  seg = np.asarray([[1, 1, 1, 2, 2, 2, 2, 0]] * 4, np.int32)
  pos = np.asarray([[0, 1, 2, 0, 1, 2, 3, 0]] * 4, np.int32)
  packed = dict(targets=jnp.asarray(np.where(seg > 0, targets + (targets == 0), 0)),
                targets_segment_ids=jnp.asarray(seg), targets_positions=jnp.asarray(pos),
                weights=jnp.asarray(seg > 0, jnp.float32))
  plain = lm_config(attention_impl="fused")
  flagged = lm_config(attention_impl="fused", causal_kernel=True)
  params = jax.jit(build_model(plain).init)(jax.random.key(0), unpacked["targets"])["params"]
  batches = (unpacked, packed)
  want_all, got_all = (loss_and_grads(c, params, batches) for c in (plain, flagged))
  for batch, ((want, want_logits), want_grads), ((got, got_logits), got_grads) in zip(
      batches, want_all, got_all):
    np.testing.assert_allclose(got, want, rtol=1e-6)
    keep = np.asarray(batch["weights"]) > 0
    np.testing.assert_allclose(np.asarray(got_logits)[keep], np.asarray(want_logits)[keep],
                               atol=1e-5, rtol=1e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-5),
                 got_grads, want_grads)
