"""The transformer stacks: one post- or pre-LN `Block` serves every stack, bidirectional or causal
by its masks; the Encoder (token or patch embeddings) and the Decoder (with its vocabulary head)
run `Block`s over their embeddings. The models (models.py) assemble them."""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import choices
from transformer.config import ModelConfig
from transformer.model import (attention as attn, heads, kv_cache, moe, parametrization,
                               positional)
from transformer.model.kernels import PLAIN, REMAT_POLICIES, Kernels
from transformer.model.layers import Embed, FeedForward, make_dropout, make_norm

Array = jax.Array


def default_segment_ids(tokens: Array, segment_ids: Array | None = None) -> Array:
  """`segment_ids`, or those of unpacked rows [b, t]: 1 on tokens, 0 on padding (id 0)."""
  return (tokens != 0).astype(jnp.int32) if segment_ids is None else segment_ids


def _residual(cfg: ModelConfig, x: Array, sublayer, norm: nn.Module, deterministic: bool) -> Array:
  """Post-LN Norm(x + Dropout(f(x))) or pre-LN x + Dropout(f(Norm(x)))."""
  drop = make_dropout(cfg.dropout_rate, cfg.dropout_bits)
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
  kernels: Kernels = PLAIN

  @nn.compact
  def __call__(self, x: Array, inputs: BlockInputs) -> Array:
    """x [b, t, d] through the block's sublayers, reading `inputs` by name."""
    cfg, det, k = self.config, self.deterministic, self.kernels
    self_attention = attn.MultiHeadAttention(cfg, kernels=k, name="self_attention")
    x = _residual(cfg, x, lambda y: self_attention(
        y, mask=inputs.self_mask, bias=inputs.bias, positions=inputs.positions,
        deterministic=det, decode=inputs.step, causal=self.causal_kernel),
                  make_norm(cfg, "attention_norm", kernels=k), det)
    if self.cross_attention:
      cross = attn.MultiHeadAttention(cfg, cross=True, kernels=k, name="cross_attention")
      x = _residual(cfg, x, lambda y: cross(
          y, inputs.encoded, mask=inputs.cross_mask, deterministic=det, decode=inputs.step),
                    make_norm(cfg, "cross_attention_norm", kernels=k), det)
    ffn_cls = moe.MoEFeedForward if choices.FFNS[cfg.ffn].mixture else FeedForward
    ffn = ffn_cls(cfg, kernels=k, name="ffn")
    x = _residual(cfg, x, lambda y: ffn(y, deterministic=det),
                  make_norm(cfg, "ffn_norm", kernels=k), det)
    return x


class ScanBlock(Block):
  """A Block as nn.scan's body: (carry, per-layer output) = (x, None); the same parameters."""

  def __call__(self, x: Array, inputs: BlockInputs) -> tuple[Array, None]:
    return super().__call__(x, inputs), None


def _run_layers(cfg: ModelConfig, num_layers: int, x: Array, inputs: BlockInputs, *,
                kernels: Kernels, remat_allowed: bool = True, **fields) -> Array:
  """Applies `num_layers` Blocks (layers_i, or one nn.scan 'layers') to x, then a pre-LN stack's
  final norm; `inputs` go to every layer, `kernels` and `fields` are the block's attributes.
  Decode: no remat."""
  cls = ScanBlock if cfg.scan_layers else Block
  if cfg.remat != "none" and remat_allowed:
    cls = nn.remat(cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
  if cfg.scan_layers:
    scanned = nn.scan(
        cls, variable_axes={"params": 0, "cache": 0, "intermediates": 0, moe.COLLECTION: 0},
        split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
        length=num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = scanned(cfg, kernels=kernels, name="layers", **fields)(x, inputs)
  else:
    for i in range(num_layers):
      x = cls(cfg, kernels=kernels, name=f"layers_{i}", **fields)(x, inputs)
  if cfg.norm_position == "pre":
    return make_norm(cfg, "final_norm", kernels=kernels)(x)
  return x


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
    x = make_norm(cfg, "embedding_norm", kernels=stack.kernels)(x)
  return make_dropout(cfg.dropout_rate, cfg.dropout_bits)(x, deterministic=deterministic)


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
  kernels: Kernels = PLAIN

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
    return _run_layers(cfg, cfg.num_encoder_layers, x, inputs, kernels=self.kernels,
                       deterministic=deterministic)


class Decoder(nn.Module):
  """Embedding + causal Blocks + float32 logits; `hidden_only` stops before the output layer."""
  config: ModelConfig
  embed: Embed
  cross_attention: bool = False
  hidden_only: bool = False
  kernels: Kernels = PLAIN

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
    start = cfg.start_embedding_id  # a converted tied decoder's BOS row: its start token's
    x = _embed(self, jnp.where(tokens == 0, start, tokens) if start else tokens, positions,
               deterministic)
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
    x = _run_layers(cfg, cfg.num_decoder_layers, x, inputs, kernels=self.kernels,
                    remat_allowed=not decode, cross_attention=self.cross_attention,
                    deterministic=deterministic, causal_kernel=causal_kernel)
    if cfg.scale_decoder_output:  # T5 1.0 (tied head): the logits' input times d_model**-0.5
      x = x * jnp.asarray(parametrization.constants_width(cfg)**-0.5, x.dtype)
    if self.hidden_only:
      return x
    head = heads.VocabHead(cfg, self.embed, kernels=self.kernels, name="vocab")
    nn.share_scope(self, head)  # its parameters sit beside the stack's own
    return head(x)
