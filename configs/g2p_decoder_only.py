r"""G2P on CMUdict as a decoder-only prefix-LM: the ablation partner of configs/g2p.py.

Each example is one row `spelling + EOS + phones + EOS`; the spelling is a bidirectional prefix
(`model.prefix_lm`) that carries no loss. Everything but the architecture is taken from g2p.py's
variant of the same name (data, tokenizers, optimizer, steps, evaluation), and the depth is chosen
so that the weight matrices have the same number of parameters as the encoder-decoder's: an
encoder layer has 4d^2 + 2df, a decoder layer with cross-attention 8d^2 + 2df, a decoder-only
layer 4d^2 + 2df, so
  tiny   2+2 layers (d 96, f 384)  -> 4 layers with f 480 (516,096 block weights each),
  fast   3+3 layers (d 128, f 512) -> 6 layers with f 640 (1,376,256 each),
  ablate 2+2 layers (d 64, f 256)  -> 4 layers with f 320 (229,376 each),
  small  3+3 layers (d 256, f 1024) -> 7 layers (5,505,024 each),
  base   6+6 layers (d 512, f 2048) -> 14 layers (44,040,192 each).
tests/test_configs.py checks the totals, embeddings included, to within 1%.

  python train.py --config=configs/g2p_decoder_only.py:tiny --workdir=runs/g2p_do_tiny

Measured (tiny, the command above, at commit cb7fe2b in a fresh clone with a freshly prepared data
directory, by `python benchmarks/reproduce.py --results=docs/results/reproduce.json`; nothing else
running): 389 s wall clock (2.6 steps/s: one 62-token row through 4 layers costs about twice the
encoder-decoder's FLOPs at the same parameter count); on the whole dev split (6,186 words, greedy)
dev loss 0.351 (token accuracy 91.5%), WER 40.5%, PER 10.3% (g2p.py:tiny in the same run: 39.4% /
9.9%, in 200 s).
fast with dropout 0.1 (g2p.py:fast's recipe then; session 11, fresh clone of commit 0adc363, a
data directory it prepared itself, nothing else running), by `python benchmarks/g2p_flagship.py
--config=configs/g2p_decoder_only.py:fast --seeds=0 --out=runs/flagship/do_fast --data_dir=DATA_DIR
--config.model.dropout_rate=0.1` (the flag was the default then): test WER 25.8%, PER 6.1% (all
12,523 test words, greedy, the step-6000 checkpoint chosen on dev; dev WER 26.8%) in 93.6 min at
1.12 steps/s, one seed: per step better than g2p.py:fast's three seeds with dropout 0.1 (27.3%
mean), per minute 2.1x slower (README, "G2P in an hour"). best, small and base were not run here.
Source (char) and target (phone) ids share one embedding table: the data layer places the target's
ids after the source's (`OffsetTokenizer`), so no letter and phone share a row.
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
