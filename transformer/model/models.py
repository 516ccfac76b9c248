"""The three architectures (encoder-decoder, decoder-only, encoder-only) over the stacks of
stacks.py, the model builder (which injects the backend's kernels, model.kernels), and the
batch-level entry points: a pipeline batch in, logits out."""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import ConfigError, ModelConfig
from transformer.model import heads, kernels
from transformer.model.kernels import PLAIN, Kernels
from transformer.model.layers import Embed
from transformer.model.stacks import Decoder, default_segment_ids, Encoder

Array = jax.Array

def shift_right(targets: Array, segment_ids: Array | None = None) -> Array:
  """Decoder inputs [b, t]: targets shifted right by one, 0 (start token) at every segment start."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segment_ids is not None:
    previous = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segment_ids == previous, shifted, 0)
  return shifted


def decoder_prefix(prefix_mask: Array, segment_ids: Array) -> Array:
  """The decoder inputs [b, t] (bool) in the prefix-LM's bidirectional prefix (start token, prompt,
  separator, as decoding prefills it): input i is if target i-1 or i is in prefix_mask [b, t]."""
  prefix_mask = prefix_mask.astype(jnp.int32)
  return (prefix_mask + shift_right(prefix_mask, segment_ids)) > 0


class EncoderDecoder(nn.Module):
  """The encoder-decoder Transformer (targets shifted inside); hidden_only as Decoder's."""
  config: ModelConfig
  hidden_only: bool = False
  kernels: Kernels = PLAIN

  def setup(self):
    cfg = self.config
    if cfg.share_src_tgt_embeddings:  # one table, large enough for either vocabulary
      self.token_embed = Embed(cfg, max(cfg.vocab_size, cfg.source_vocab_size))
      source_embed = target_embed = self.token_embed
    else:
      self.source_embed = Embed(cfg, cfg.source_vocab_size)
      self.target_embed = Embed(cfg, cfg.vocab_size)
      source_embed, target_embed = self.source_embed, self.target_embed
    self.encoder = Encoder(cfg, source_embed, kernels=self.kernels)
    self.decoder = Decoder(cfg, target_embed, cross_attention=True, hidden_only=self.hidden_only,
                           kernels=self.kernels)

  def encode(self, inputs: Array, inputs_positions: Array | None = None,
             inputs_segment_ids: Array | None = None, deterministic: bool = True) -> Array:
    """inputs [b, s] -> encoded [b, s, d]."""
    return self.encoder(inputs, positions=inputs_positions, segment_ids=inputs_segment_ids,
                        deterministic=deterministic)

  def decode(self, encoded: Array | None, decoder_input_tokens: Array,
             encoder_segment_ids: Array | None = None, decoder_positions: Array | None = None,
             decoder_segment_ids: Array | None = None, deterministic: bool = True,
             decode: bool = False) -> Array:
    """Decoder logits [b, t, vocab]; in decode mode encoded=None reuses the cached keys/values."""
    return self.decoder(decoder_input_tokens, positions=decoder_positions,
                        segment_ids=decoder_segment_ids, encoded=encoded,
                        encoder_segment_ids=encoder_segment_ids, deterministic=deterministic,
                        decode=decode)

  def __call__(self, inputs: Array, targets: Array, inputs_positions: Array | None = None,
               inputs_segment_ids: Array | None = None, targets_positions: Array | None = None,
               targets_segment_ids: Array | None = None, deterministic: bool = True) -> Array:
    """Teacher-forced logits [b, t, vocab] float32 for inputs [b, s] and targets [b, t]."""
    inputs_segment_ids = default_segment_ids(inputs, inputs_segment_ids)
    targets_segment_ids = default_segment_ids(targets, targets_segment_ids)
    encoded = self.encode(inputs, inputs_positions=inputs_positions,
                          inputs_segment_ids=inputs_segment_ids, deterministic=deterministic)
    return self.decode(encoded, shift_right(targets, targets_segment_ids),
                       encoder_segment_ids=inputs_segment_ids,
                       decoder_positions=targets_positions,
                       decoder_segment_ids=targets_segment_ids, deterministic=deterministic)


class DecoderOnly(nn.Module):
  """A causal LM; a prefix-LM given a prefix mask. hidden_only as Decoder's."""
  config: ModelConfig
  hidden_only: bool = False
  kernels: Kernels = PLAIN

  def setup(self):
    self.token_embed = Embed(self.config, self.config.vocab_size)
    self.decoder = Decoder(self.config, self.token_embed, hidden_only=self.hidden_only,
                           kernels=self.kernels)

  def decode(self, decoder_input_tokens: Array, decoder_positions: Array | None = None,
             decoder_segment_ids: Array | None = None, decoder_prefix_mask: Array | None = None,
             deterministic: bool = True, decode: bool = False) -> Array:
    """Logits [b, t, vocab] float32 for already-shifted decoder inputs."""
    prefix = decoder_prefix_mask if self.config.prefix_lm else None
    return self.decoder(decoder_input_tokens, positions=decoder_positions,
                        segment_ids=decoder_segment_ids, prefix=prefix, deterministic=deterministic,
                        decode=decode)

  def __call__(self, targets: Array, targets_positions: Array | None = None,
               targets_segment_ids: Array | None = None, prefix_mask: Array | None = None,
               deterministic: bool = True) -> Array:
    """Teacher-forced logits [b, t, vocab] float32; prefix_mask: see `decoder_prefix`. With
    model.causal_kernel, unsegmented rows without a prefix get no padding mask."""
    plain_causal = self.config.causal_kernel and prefix_mask is None
    if targets_segment_ids is None and not plain_causal:
      targets_segment_ids = default_segment_ids(targets)
    prefix = None if prefix_mask is None else decoder_prefix(prefix_mask, targets_segment_ids)
    return self.decode(shift_right(targets, targets_segment_ids),
                       decoder_positions=targets_positions,
                       decoder_segment_ids=targets_segment_ids, decoder_prefix_mask=prefix,
                       deterministic=deterministic)


class EncoderOnly(nn.Module):
  """BERT-style: the Encoder stack with a head (model.head, heads.OutputHead)."""
  config: ModelConfig
  kernels: Kernels = PLAIN

  def setup(self):
    self.token_embed = Embed(self.config, self.config.vocab_size)
    self.encoder = Encoder(self.config, self.token_embed, kernels=self.kernels)
    kind = "lm" if self.config.head == "mlm" else self.config.head
    self.head = heads.OutputHead(self.config, self.token_embed, kind, kernels=self.kernels)

  def __call__(self, inputs: Array | None, inputs_positions: Array | None = None,
               inputs_segment_ids: Array | None = None, targets_segment_ids: Array | None = None,
               deterministic: bool = True, images: Array | None = None) -> Array:
    """Head logits for inputs [b, s]; targets_segment_ids [b, t]: each classification slot's.
    With model.image_size, images [b, H, W, C] (ViT) -> class logits [b, 1, num_classes]."""
    if self.config.image_size:
      if images is None:
        raise ValueError(f"model.image_size={self.config.image_size}: this model reads images "
                         "[b, H, W, C] (a batch's 'images'), not tokens")
      encoded = self.encoder(None, deterministic=deterministic, images=images)
      return self.head(encoded, jnp.ones(encoded.shape[:2], jnp.int32), targets_segment_ids)
    inputs_segment_ids = default_segment_ids(inputs, inputs_segment_ids)
    encoded = self.encoder(inputs, positions=inputs_positions, segment_ids=inputs_segment_ids,
                           deterministic=deterministic)
    return self.head(encoded, inputs_segment_ids, targets_segment_ids)


def build_model(model_config: ModelConfig) -> EncoderDecoder | DecoderOnly | EncoderOnly:
  """The model named by `model_config.arch`, with model.kernels' speed paths injected into its
  layers; vocabulary sizes must be filled in (not 0)."""
  cfg = model_config
  sizes = ("vocab_size", "source_vocab_size") if cfg.arch == "encoder_decoder" else ("vocab_size",)
  for key in sizes:
    if getattr(cfg, key) <= 0:
      raise ConfigError(f"model.{key}={getattr(cfg, key)} must be set (> 0) before build_model")
  archs = dict(encoder_decoder=EncoderDecoder, decoder_only=DecoderOnly, encoder_only=EncoderOnly)
  return archs[cfg.arch](cfg, kernels=kernels.select(cfg.kernels))


# The batch-level entry points: a pipeline batch in, logits out, for every architecture.

def batch_segment_ids(batch: dict[str, Any], feature: str) -> Array:
  """The batch's `<feature>_segment_ids`, or default_segment_ids of the feature's tokens."""
  return default_segment_ids(batch[feature], batch.get(f"{feature}_segment_ids"))


def _call_kwargs(arch: str, batch: dict[str, Any]) -> dict[str, Any]:
  """The keyword arguments of the model's __call__ for a batch (features absent -> None)."""
  inputs = ("inputs", "inputs_positions", "inputs_segment_ids")
  targets = ("targets", "targets_positions", "targets_segment_ids")
  names = {"encoder_decoder": inputs + targets, "decoder_only": targets + ("prefix_mask",),
           "encoder_only": inputs + ("targets_segment_ids",)}[arch]
  if "images" in batch:  # a ViT's batch: images [b, H, W, C] instead of input tokens
    return {"inputs": None, "images": batch["images"]}
  return {n: batch[n] if n in ("inputs", "targets") else batch.get(n) for n in names}


def batch_logits(model: nn.Module, params: Any, batch: dict[str, Any], *,
                 deterministic: bool = True, rngs: dict[str, Array] | None = None,
                 mutable: Any = False) -> Any:
  """Teacher-forced logits [b, t, vocab] float32 of a batch; with `mutable` (collections, e.g.
  ['moe']), (logits, the collections' sown values) as flax's apply gives them."""
  return model.apply({"params": params}, **_call_kwargs(model.config.arch, batch),
                     deterministic=deterministic, rngs=rngs, mutable=mutable)


def batch_intermediates(model: nn.Module, params: Any, batch: dict[str, Any]) -> Any:
  """The 'intermediates' collection of a batch's deterministic teacher-forced pass: every
  attention layer's sown `attention_weights` [b, n, t, s], by module path."""
  _, state = model.apply({"params": params}, **_call_kwargs(model.config.arch, batch),
                         deterministic=True, mutable=["intermediates"])
  return state["intermediates"]


def batch_hidden(model: nn.Module, params: Any, batch: dict[str, Any], *,
                 deterministic: bool = True, rngs: dict[str, Array] | None = None,
                 mutable: Any = False) -> Any:
  """The decoder's final hidden states [b, t, d] of a batch (before vocab_projection); `mutable`
  as batch_logits'."""
  if model.config.arch == "encoder_only":
    raise ConfigError("hidden states before the output layer: encoder_decoder or decoder_only only")
  return batch_logits(model.clone(hidden_only=True), params, batch, deterministic=deterministic,
                      rngs=rngs, mutable=mutable)


def vocab_projection(model: nn.Module, params: Any):
  """hidden [b, t, d] -> float32 logits [b, t, vocab]: the decoder's output layer."""
  embed = params["token_embed"] if "token_embed" in params else params["target_embed"]
  head = {k: v for k, v in params["decoder"].items() if k in heads.VOCAB_HEAD_PARAMS}
  variables = {"params": {**head, "embed": embed}}
  head = heads.VocabHead(model.config, Embed(model.config, model.config.vocab_size),
                         kernels=model.kernels)
  return lambda x: head.apply(variables, x)


def batch_init(model: nn.Module, rngs: dict[str, Array], batch: dict[str, Any]) -> Any:
  """model.init's variables from a batch (only its shapes matter)."""
  return model.init(rngs, **_call_kwargs(model.config.arch, batch), deterministic=True)


def example_batch(model_config: ModelConfig, length: int = 8) -> dict[str, np.ndarray]:
  """A one-row batch with the features the architecture reads (for init and shapes)."""
  ones = np.ones((1, length), np.int32)
  if model_config.image_size:
    size, channels = model_config.image_size, model_config.image_channels
    return dict(images=np.zeros((1, size, size, channels), np.float32), targets=ones[:, :1])
  has_inputs = model_config.arch != "decoder_only"
  return dict(inputs=ones, targets=ones) if has_inputs else dict(targets=ones)


def parameter_count(model_config: ModelConfig) -> int:
  """The number of parameters `model_config` builds (shapes only); unset vocabularies count 1."""
  cfg = dataclasses.replace(model_config, vocab_size=model_config.vocab_size or 1,
                            source_vocab_size=model_config.source_vocab_size or 1)
  shapes = jax.eval_shape(lambda: batch_init(build_model(cfg), {"params": jax.random.key(0)},
                                             example_batch(cfg, 1)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))
