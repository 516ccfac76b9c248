"""Encoder-decoder vs decoder-only prefix-LM at matched size (the same d_model, heads and FFN).

The decoder-only model gets as many layers as make its block parameters closest to the
encoder-decoder's: an encoder layer is attention + FFN, an encoder-decoder decoder layer adds
cross-attention, a decoder-only layer is attention + FFN. At mlp_dim = 4 d_model, 3+3 layers
(36 + 48 d^2) match 7 decoder-only layers (84 d^2). The decoder-only model reads the source as a
prefix with bidirectional attention (`model.prefix_lm`) and is trained on the target tokens only.

  python sweep.py --config=configs/g2p.py:small --sweep=configs/sweeps/arch.py --workdir=runs/sweep_arch
"""

from transformer import choices


def _layer_sizes(m):
  """(attention, feed-forward) weights of one layer of model config `m` (biases ignored)."""
  heads, kv_heads = m.num_heads, m.num_kv_heads or m.num_heads
  head_dim = m.head_dim or m.d_model // m.num_heads
  v_head_dim = m.v_head_dim or head_dim
  attention = m.d_model * (heads * head_dim + kv_heads * (head_dim + v_head_dim) + heads * v_head_dim)
  ffn = (3 if choices.FFNS[m.ffn].gated else 2) * m.d_model * m.mlp_dim
  return attention, ffn


def get_sweep(config):
  """Two runs: the config's encoder-decoder, and a decoder-only prefix-LM of matched size."""
  m = config.model
  attention, ffn = _layer_sizes(m)
  enc_dec = m.num_encoder_layers * (attention + ffn) + m.num_decoder_layers * (2 * attention + ffn)
  layers = max(1, round(enc_dec / (attention + ffn)))
  return [{"model.arch": "encoder_decoder"},
          {"model.arch": "decoder_only", "model.prefix_lm": True, "model.num_decoder_layers": layers}]
