"""Transformer blocks and stacks, the three architectures, and the batch-level entry points.
One post- or pre-LN `Block` serves every stack, bidirectional or causal by its masks."""

import dataclasses
import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import choices
from transformer.config import ConfigError, ModelConfig
from transformer.model import (attention as attn, heads, kernels, kv_cache, moe, parametrization,
                               positional)
from transformer.model.layers import Dropout, Embed, FeedForward, make_norm

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


def _residual(cfg: ModelConfig, x: Array, sublayer, norm: nn.Module, deterministic: bool) -> Array:
  """Post-LN Norm(x + Dropout(f(x))) or pre-LN x + Dropout(f(Norm(x)))."""
  drop = Dropout(cfg.dropout_rate, cfg.dropout_bits)
  if cfg.norm_position == "pre":
    return x + drop(sublayer(norm(x)), deterministic=deterministic)
  return norm(x + drop(sublayer(x), deterministic=deterministic))


@flax.struct.dataclass
class BlockInputs:
  """What every Block of a stack reads besides x (None: not used), a pytree that nn.scan
  broadcasts to every layer: encoded [b, s, d] (cross-attention's source), self_mask
  [b, 1, t, L] and cross_mask [b, 1, t, s], bias [b, n, t, L] (a 'bias' positional encoding's),
  positions [b, t] (a rotary encoding's), step (a decode call's cache slots)."""
  encoded: Array | None = None
  self_mask: Array | None = None
  cross_mask: Array | None = None
  bias: Array | None = None
  positions: Array | None = None
  step: kv_cache.DecodeStep | None = None


class Block(nn.Module):
  """Self-attention, cross-attention (if `cross_attention`), feed-forward: x [b, t, d] -> same."""
  config: ModelConfig
  cross_attention: bool = False
  deterministic: bool = True
  causal_kernel: bool = False  # self_mask omits the causal part: the kernel's own flag adds it

  @nn.compact
  def __call__(self, x: Array, inputs: BlockInputs) -> Array:
    """x [b, t, d] through the block's sublayers, reading `inputs` by name."""
    cfg, det = self.config, self.deterministic
    self_attention = attn.MultiHeadAttention(cfg, name="self_attention")
    x = _residual(cfg, x, lambda y: self_attention(
        y, mask=inputs.self_mask, bias=inputs.bias, positions=inputs.positions,
        deterministic=det, decode=inputs.step, causal=self.causal_kernel),
                  make_norm(cfg, "attention_norm"), det)
    if self.cross_attention:
      cross = attn.MultiHeadAttention(cfg, cross=True, name="cross_attention")
      x = _residual(cfg, x, lambda y: cross(
          y, inputs.encoded, mask=inputs.cross_mask, deterministic=det, decode=inputs.step),
                    make_norm(cfg, "cross_attention_norm"), det)
    ffn = (moe.MoEFeedForward if choices.FFNS[cfg.ffn].mixture else FeedForward)(cfg, name="ffn")
    x = _residual(cfg, x, lambda y: ffn(y, deterministic=det), make_norm(cfg, "ffn_norm"), det)
    return x


class ScanBlock(Block):
  """A Block as nn.scan's body: (carry, per-layer output) = (x, None); the same parameters."""

  def __call__(self, x: Array, inputs: BlockInputs) -> tuple[Array, None]:
    return super().__call__(x, inputs), None


def _run_layers(cfg: ModelConfig, num_layers: int, x: Array, inputs: BlockInputs,
                remat_allowed: bool = True, **fields) -> Array:
  """Applies `num_layers` Blocks (layers_i, or one nn.scan 'layers') to x, then a pre-LN stack's
  final norm; `inputs` go to every layer, `fields` are the block's attributes. Decode: no remat."""
  cls = ScanBlock if cfg.scan_layers else Block
  if cfg.remat != "none" and remat_allowed:
    cls = nn.remat(cls, policy=kernels.REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
  if cfg.scan_layers:
    scanned = nn.scan(
        cls, variable_axes={"params": 0, "cache": 0, "intermediates": 0, moe.COLLECTION: 0},
        split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
        length=num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = scanned(cfg, name="layers", **fields)(x, inputs)
  else:
    for i in range(num_layers):
      x = cls(cfg, name=f"layers_{i}", **fields)(x, inputs)
  return make_norm(cfg, "final_norm")(x) if cfg.norm_position == "pre" else x


def patchify(images: Array, patch_size: int) -> Array:
  """images [b, H, W, C] -> patches [b, (H/p) (W/p), p p C]: row-major over the patch grid,
  each patch flattened (row, column, channel)."""
  b, h, w, c = images.shape
  p = patch_size
  x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // p) * (w // p), p * p * c)


class PatchEmbed(nn.Module):
  """ViT's input: images [b, H, W, C] -> [b, t, d], a linear map of each flattened patch, after
  a learned class token (t = patches + 1) with model.pooling='class_token'."""
  config: ModelConfig

  @nn.compact
  def __call__(self, images: Array) -> Array:
    cfg = self.config
    if images.shape[1:] != (cfg.image_size, cfg.image_size, cfg.image_channels):
      raise ValueError(f"images of shape {images.shape[1:]} (H, W, C), but the model takes "
                       f"{(cfg.image_size, cfg.image_size, cfg.image_channels)} (model.image_size, "
                       f"model.image_channels)")
    patches = patchify(images.astype(jnp.dtype(cfg.dtype)), cfg.patch_size)
    x = nn.Dense(cfg.d_model, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
                 kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                          ("patch", "embed")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
                 name="projection")(patches)
    if cfg.pooling == "class_token":
      token = self.param("class_token", nn.with_logical_partitioning(
          nn.initializers.zeros_init(), ("embed",)), (cfg.d_model,), jnp.dtype(cfg.param_dtype))
      token = jnp.broadcast_to(jnp.asarray(token, x.dtype), (x.shape[0], 1, cfg.d_model))
      x = jnp.concatenate([token, x], axis=1)
    return x


def _embed(stack: "Encoder | Decoder", tokens: Array, positions: Array,
           deterministic: bool) -> Array:
  """Token embeddings + absolute positional encoding, embedding norm (if configured), dropout;
  inside `stack`'s compact method."""
  return _add_positions(stack, stack.embed(tokens), positions, deterministic)  # [b, t, d]


def _add_positions(stack: "Encoder | Decoder", x: Array, positions: Array,
                   deterministic: bool) -> Array:
  """Embeddings x [b, t, d] + absolute positional encoding, embedding norm, dropout."""
  cfg = stack.config
  if positional.encoding(cfg).kind == "absolute":
    absolute = positional.AbsoluteEncoding(cfg, name="absolute_encoding")
    nn.share_scope(stack, absolute)  # a learned table sits in the stack's scope
    x = x + absolute(positions).astype(x.dtype)
  if cfg.embedding_norm:
    x = make_norm(cfg, "embedding_norm")(x)
  return Dropout(cfg.dropout_rate, cfg.dropout_bits)(x, deterministic=deterministic)


def _position_inputs(stack: "Encoder | Decoder", q_pos: Array, k_pos: Array,
                     bidirectional: bool) -> tuple[Array | None, Array | None]:
  """(the stack's positional bias [b, n, t, s], the positions attention rotates by) or Nones;
  inside `stack`'s compact method."""
  kind = positional.encoding(stack.config).kind
  bias = None
  if kind == "bias":
    encoding = positional.BiasEncoding(stack.config, bidirectional, name="bias_encoding")
    nn.share_scope(stack, encoding)  # a learned table sits in the stack's scope
    bias = encoding(q_pos, k_pos)
  return bias, q_pos if kind == "rotary" else None


def _default_positions(tokens: Array) -> Array:
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class Encoder(nn.Module):
  """Embedding + bidirectional Blocks."""
  config: ModelConfig
  embed: Embed

  @nn.compact
  def __call__(self, tokens: Array | None, *, positions: Array | None = None,
               segment_ids: Array | None = None, deterministic: bool = True,
               images: Array | None = None) -> Array:
    """tokens [b, s] -> encoded [b, s, d]; segment ids default to (tokens != 0). Given images
    [b, H, W, C] instead, the patch embeddings (PatchEmbed) are the sequence, all one segment."""
    cfg = self.config
    if images is not None:
      x = PatchEmbed(cfg, name="patch_embed")(images)
      tokens = segment_ids = jnp.ones(x.shape[:2], jnp.int32)
    if positions is None:
      positions = _default_positions(tokens)
    segment_ids = default_segment_ids(tokens, segment_ids)
    if images is None:
      x = _embed(self, tokens, positions, deterministic)
    else:
      x = _add_positions(self, x, positions, deterministic)
    mask = attn.segment_mask(segment_ids, segment_ids)  # same nonzero segment
    if cfg.sliding_window:
      idx = _default_positions(tokens)
      mask = mask & attn.sliding_window_mask(idx, idx, cfg.sliding_window)
    bias, rotary_positions = _position_inputs(self, positions, positions, bidirectional=True)
    inputs = BlockInputs(self_mask=mask, bias=bias, positions=rotary_positions)
    return _run_layers(cfg, cfg.num_encoder_layers, x, inputs, deterministic=deterministic)


class Decoder(nn.Module):
  """Embedding + causal Blocks + float32 logits; `hidden_only` stops before the output layer."""
  config: ModelConfig
  embed: Embed
  cross_attention: bool = False
  hidden_only: bool = False

  @nn.compact
  def __call__(self, tokens: Array, *, positions: Array | None = None,
               segment_ids: Array | None = None, prefix: Array | None = None,
               encoded: Array | None = None, encoder_segment_ids: Array | None = None,
               deterministic: bool = True, decode: bool = False) -> Array:
    """Shifted tokens [b, t] -> logits [b, t, vocab]; segment_ids default to ones, prefix [b, t]
    marks the prefix-LM's bidirectional prefix; decode-mode positions default to the cache slots."""
    cfg = self.config
    # model.causal_kernel: the kernel's causal flag, only the segments stay a dense mask.
    causal_kernel = cfg.causal_kernel and not decode and prefix is None
    unsegmented = segment_ids is None
    if unsegmented:
      segment_ids = jnp.ones(tokens.shape, jnp.int32)
    prefix = jnp.zeros(tokens.shape, bool) if prefix is None else prefix.astype(bool)
    if decode:
      stack_cache = kv_cache.StackCache(cfg.sliding_window, name="stack_cache")
      nn.share_scope(self, stack_cache)  # its bookkeeping sits beside the stack's parameters
      if positions is None:
        positions = stack_cache.next_positions(tokens.shape[1])
    if positions is None:
      positions = _default_positions(tokens)
    if decode:
      step, q_idx, k_idx, k_pos, k_seg, k_prefix = stack_cache(positions, segment_ids, prefix)
    else:
      q_idx = k_idx = _default_positions(tokens)
      step, k_pos, k_seg, k_prefix = None, positions, segment_ids, prefix
    x = _embed(self, tokens, positions, deterministic)
    self_mask = attn.prefix_lm_mask_from_positions(q_idx, k_idx, prefix, k_prefix, segment_ids,
                                                   k_seg)
    if cfg.sliding_window:
      self_mask = self_mask & attn.sliding_window_mask(q_idx, k_idx, cfg.sliding_window)
    if causal_kernel:
      self_mask = None if unsegmented else attn.segment_mask(segment_ids, segment_ids)
    cross_mask = None
    if self.cross_attention and encoder_segment_ids is not None:
      cross_mask = attn.segment_mask(segment_ids, encoder_segment_ids)
    bias, rotary_positions = _position_inputs(self, positions, k_pos, bidirectional=False)
    inputs = BlockInputs(encoded=encoded, self_mask=self_mask, cross_mask=cross_mask, bias=bias,
                         positions=rotary_positions, step=step)
    x = _run_layers(cfg, cfg.num_decoder_layers, x, inputs,
                    remat_allowed=not decode, cross_attention=self.cross_attention,
                    deterministic=deterministic, causal_kernel=causal_kernel)
    if cfg.scale_decoder_output:  # T5 1.0 (tied head): the logits' input times d_model**-0.5
      x = x * jnp.asarray(parametrization.constants_width(cfg)**-0.5, x.dtype)
    if self.hidden_only:
      return x
    head = heads.VocabHead(cfg, self.embed, name="vocab")
    nn.share_scope(self, head)  # its parameters sit beside the stack's own
    return head(x)


class EncoderDecoder(nn.Module):
  """The encoder-decoder Transformer (targets shifted inside); hidden_only as Decoder's."""
  config: ModelConfig
  hidden_only: bool = False

  def setup(self):
    cfg = self.config
    if cfg.share_src_tgt_embeddings:  # one table, large enough for either vocabulary
      self.token_embed = Embed(cfg, max(cfg.vocab_size, cfg.source_vocab_size))
      source_embed = target_embed = self.token_embed
    else:
      self.source_embed = Embed(cfg, cfg.source_vocab_size)
      self.target_embed = Embed(cfg, cfg.vocab_size)
      source_embed, target_embed = self.source_embed, self.target_embed
    self.encoder = Encoder(cfg, source_embed)
    self.decoder = Decoder(cfg, target_embed, cross_attention=True, hidden_only=self.hidden_only)

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

  def setup(self):
    self.token_embed = Embed(self.config, self.config.vocab_size)
    self.decoder = Decoder(self.config, self.token_embed, hidden_only=self.hidden_only)

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

  def setup(self):
    self.token_embed = Embed(self.config, self.config.vocab_size)
    self.encoder = Encoder(self.config, self.token_embed)
    kind = "lm" if self.config.head == "mlm" else self.config.head
    self.head = heads.OutputHead(self.config, self.token_embed, kind)

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
  """The model named by `model_config.arch`; vocabulary sizes must be filled in (not 0)."""
  cfg = model_config
  sizes = ("vocab_size", "source_vocab_size") if cfg.arch == "encoder_decoder" else ("vocab_size",)
  for key in sizes:
    if getattr(cfg, key) <= 0:
      raise ConfigError(f"model.{key}={getattr(cfg, key)} must be set (> 0) before build_model")
  archs = dict(encoder_decoder=EncoderDecoder, decoder_only=DecoderOnly, encoder_only=EncoderOnly)
  return archs[cfg.arch](cfg)


# The batch-level entry points: a pipeline batch in, logits out, for every architecture.


def default_segment_ids(tokens: Array, segment_ids: Array | None = None) -> Array:
  """`segment_ids`, or those of unpacked rows [b, t]: 1 on tokens, 0 on padding (id 0)."""
  return (tokens != 0).astype(jnp.int32) if segment_ids is None else segment_ids


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
  head = heads.VocabHead(model.config, Embed(model.config, model.config.vocab_size))
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
