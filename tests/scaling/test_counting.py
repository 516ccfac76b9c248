"""Parameter and FLOP counts (transformer/scaling/counting.py) against hand counts of three
decoder-only shapes and against XLA's cost analysis of the compiled gradient."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm
from transformer.config import from_configdict
from transformer.model import models
from transformer.scaling import counting

VOCAB = 69


def config(d: int, layers: int, heads: int, mlp: int, block: int = 64, batch: int = 2):
  """configs/lm.py:isoflop (pre-LN, learned positions, GELU, tied embeddings, no biases)."""
  c = lm.get_config("isoflop")
  c.model.update(d_model=d, num_decoder_layers=layers, num_heads=heads, mlp_dim=mlp,
                 vocab_size=VOCAB, max_len=block)
  c.data.update(batch_size=batch, max_target_len=block, max_source_len=block)
  return from_configdict(c)


def hand_params(d: int, layers: int, mlp: int, block: int) -> tuple[int, int]:
  """(total, embedding): per layer q, k, v, out (4 d^2), the FFN (2 d mlp) and two LayerNorms
  (scale and bias: 4 d); a final LayerNorm (2 d); token (V d) and position (block d) tables."""
  embedding = VOCAB * d + block * d
  return embedding + layers * (4 * d * d + 2 * d * mlp + 4 * d) + 2 * d, embedding


def hand_flops_per_token(d: int, layers: int, mlp: int, t: int) -> int:
  """3 x forward: per layer q, k, v, out (2 x 4 d^2), scores and weighted values over all t keys
  (2 x 2 t d), the FFN (2 x 2 d mlp); the output head (2 d V)."""
  return 3 * (layers * (8 * d * d + 4 * t * d + 4 * d * mlp) + 2 * d * VOCAB)


@pytest.mark.parametrize("d,layers,heads,mlp", [(32, 1, 4, 128), (48, 3, 6, 192),
                                                (128, 4, 4, 512)])
def test_counts_equal_hand_counts(d, layers, heads, mlp):
  counts = counting.count(config(d, layers, heads, mlp))
  total, embedding = hand_params(d, layers, mlp, 64)
  assert (counts.total, counts.embedding, counts.non_embedding) == (
      total, embedding, total - embedding)
  assert counts.flops_per_token == hand_flops_per_token(d, layers, mlp, 64)


def test_flops_within_two_percent_of_xla_cost_analysis():
  cfg = config(256, 1, 4, 1024, block=32)
  model = models.build_model(cfg.model)
  targets = np.ones((cfg.data.batch_size, cfg.data.max_target_len), np.int32)
  params = model.init(jax.random.key(0), targets, deterministic=True)

  def loss(p):
    logits = model.apply(p, targets, deterministic=True)
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  analysis = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  ours = counting.flops_per_token(cfg) * counting.tokens_per_step(cfg)
  # XLA also counts norms, GELU and softmax (about 1% here): ours is the matmuls only
  assert 0.98 < analysis["flops"] / ours < 1.03


@pytest.mark.parametrize("ffn", ["swiglu", "geglu_tanh"])
def test_a_gated_ffn_counts_three_matrices(ffn):
  """choices.FFNS says these are gated: the FFN's weights and FLOPs are 3/2 of a plain one's."""
  plain = counting.count(config(32, 2, 4, 128))
  cfg = config(32, 2, 4, 128)
  gated = counting.count(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, ffn=ffn)))
  assert gated.non_embedding - plain.non_embedding == 2 * 32 * 128
  assert gated.flops_per_token - plain.flops_per_token == 3 * 2 * 2 * 32 * 128
