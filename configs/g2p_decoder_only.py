r"""G2P on CMUdict as a decoder-only prefix-LM: the ablation partner of configs/g2p.py.

Each example is one row `spelling + EOS + phones + EOS`; the spelling is a bidirectional prefix
(`model.prefix_lm`) that carries no loss. Letter and phone ids share one embedding table without
colliding (the data layer's `OffsetTokenizer` places the phones after the letters). Everything
but the architecture is g2p.py's variant of the same name; the depth and FFN width (`LAYERS`)
give the weight matrices the parameter count of the encoder-decoder's (an encoder layer has
4d^2 + 2df weights, a decoder layer with cross-attention 8d^2 + 2df, a decoder-only layer
4d^2 + 2df); tests/test_configs.py checks the totals, embeddings included, to within 1%.

  python train.py --config=configs/g2p_decoder_only.py:tiny --workdir=runs/g2p_do_tiny

Results against the encoder-decoder: docs/g2p.md#decoder-only-prefix-lm-partners.
"""

from configs import g2p

LAYERS = {"tiny": (4, 480), "fast": (6, 640), "best": (6, 640), "small": (7, 1024),
          "base": (14, 2048), "ablate": (4, 320)}


def get_config(arg: str = "base"):
  """g2p.py's variant `arg` as a parameter-matched decoder-only prefix-LM."""
  variant = arg or "base"
  c = g2p.get_config(variant)
  layers, mlp_dim = LAYERS[variant]
  c.model.update(arch="decoder_only", prefix_lm=True, num_encoder_layers=0,
                 num_decoder_layers=layers, mlp_dim=mlp_dim)
  # One row holds source + EOS + target + EOS.
  c.model.max_len = max(c.model.max_len, c.data.max_source_len + c.data.max_target_len)
  return c
