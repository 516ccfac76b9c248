"""Output heads on top of a stack: vocabulary logits (`VocabHead`, the one output layer of
decoders and masked-LM heads), classification pooled per segment of packed rows, tagging."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import excluded_ids, ModelConfig
from transformer.model import parametrization
from transformer.model.kernels import PLAIN, Kernels
from transformer.model.layers import dense, dense_ffn, Embed, make_norm

Array = jax.Array
# exp underflows to exactly 0, and it stays finite, so 0 * log p never makes NaNs.
EXCLUDED_LOGIT = -1e30


def output_dense(cfg: ModelConfig, features: int, axes: tuple[str, str], name: str,
                 bias: bool = False) -> nn.Dense:
  """A Dense computed in float32 whatever cfg.dtype (as Embed.attend), bias-free by default;
  a readout: µP scales its init std by sqrt(m) (`readout`, its 1/m multiplier)."""
  return dense(features, axes, dataclasses.replace(cfg, use_bias=bias, dtype="float32"), name,
               init_scale=parametrization.readout_init_scale(cfg))


def readout(cfg: ModelConfig, x: Array) -> Array:
  """x [..., d] scaled by the readout multiplier (µP's 1/m; standard: x itself) before a
  readout's kernel, as µP's output layers take it."""
  multiplier = parametrization.readout_multiplier(cfg)
  return x if multiplier == 1.0 else x * jnp.asarray(multiplier, x.dtype)


def pool(x: Array, segment_ids: Array, target_segment_ids: Array, pooling: str) -> Array:
  """x [b, s, d] -> [b, t, d]: the first token (a ViT's class token) or token mean of each slot's
  segment (0: zeros)."""
  member = ((segment_ids[:, None, :] == target_segment_ids[:, :, None])
            & (target_segment_ids[:, :, None] != 0))  # [b, t, s]
  if pooling in ("first", "class_token"):
    first = jnp.argmax(member, axis=-1)  # [b, t]
    weights = jax.nn.one_hot(first, x.shape[1]) * member.any(-1, keepdims=True)
  else:
    weights = member / jnp.maximum(member.sum(-1, keepdims=True), 1)
  return jnp.einsum("bts,bsd->btd", weights.astype(x.dtype), x)


class LogitsBias(nn.Module):
  """A learned float32 bias [vocab] added to logits (model.logits_bias; BERT's MLM head)."""
  vocab_size: int

  @nn.compact
  def __call__(self, logits: Array) -> Array:
    init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",))
    return logits + self.param("bias", init, (self.vocab_size,), jnp.float32)


# The submodules of VocabHead (their parameter subtrees), beside the stack's own in its scope.
VOCAB_HEAD_PARAMS = ("transform", "transform_norm", "logits_dense", "logits_bias")


class VocabHead(nn.Module):
  """Hidden states [b, t, d] -> float32 logits [b, t, vocab], against `embed` if tied; the
  model.excluded_ids get EXCLUDED_LOGIT, so every consumer gives them probability exactly 0.

  A decoder stack shares its scope with the head (nn.share_scope): the head's parameters sit
  beside the stack's own. Alone, an unbound `embed` becomes its child 'embed'."""
  config: ModelConfig
  embed: Embed
  kernels: Kernels = PLAIN  # the transform's norm's

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    if cfg.head_transform:
      x = dense(cfg.d_model, ("embed", "mlp"), cfg, "transform")(x)
      x = make_norm(cfg, "transform_norm", kernels=self.kernels)(dense_ffn(cfg).activation(x))
    if cfg.tie_embeddings:
      logits = self.embed.attend(readout(cfg, x))[..., :cfg.vocab_size]
    else:
      logits = output_dense(cfg, cfg.vocab_size, ("embed", "vocab"), "logits_dense")(
          readout(cfg, x))
    if cfg.logits_bias:
      logits = LogitsBias(cfg.vocab_size, name="logits_bias")(logits)
    excluded = excluded_ids(cfg)
    if excluded:
      if excluded[-1] >= cfg.vocab_size:
        raise ValueError(f"model.excluded_ids={cfg.excluded_ids!r} names id {excluded[-1]}, "
                         f"outside model.vocab_size={cfg.vocab_size}")
      keep = ~np.isin(np.arange(cfg.vocab_size), list(excluded))
      logits = jnp.where(keep, logits, EXCLUDED_LOGIT)
    return logits


class OutputHead(nn.Module):
  """Hidden states [b, s, d] -> float32 logits, by `kind`: 'lm' (vocabulary, tied or not),
  'classify' ([b, t, num_classes], pooled per target slot) or 'tag' ([b, s, num_classes])."""
  config: ModelConfig
  embed: Embed
  kind: str
  kernels: Kernels = PLAIN  # the vocabulary head's

  @nn.compact
  def __call__(self, x: Array, segment_ids: Array | None = None,
               target_segment_ids: Array | None = None) -> Array:
    cfg = self.config
    if self.kind == "lm":
      head = VocabHead(cfg, self.embed, kernels=self.kernels, name="vocab")
      nn.share_scope(self, head)  # its parameters sit beside this head's own
      return head(x)
    if cfg.num_classes <= 0:
      raise ValueError(f"model.num_classes={cfg.num_classes} must be set (> 0) for "
                       f"model.head={cfg.head!r}")
    if self.kind == "classify":
      if target_segment_ids is None:  # one example per row: slot 0 is segment 1
        target_segment_ids = jnp.ones((x.shape[0], 1), jnp.int32)
      x = pool(x, segment_ids, target_segment_ids, cfg.pooling)
    return output_dense(cfg, cfg.num_classes, ("embed", "classes"), "classifier",
                        bias=cfg.head_bias)(readout(cfg, x))
