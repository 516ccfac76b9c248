r"""Encoder-decoder grapheme-to-phoneme conversion on CMUdict (`cmudict_g2p`, prepared offline).

Letters in, ARPAbet phones (stress removed) out, packed rows; the paper's post-LN Transformer
(Adam 0.9/0.98/1e-9, label smoothing 0.1) at G2P sizes. Variants (the argument after the colon):
  tiny    the quickstart: 2+2 layers, warmup + cosine decay, minutes on a CPU.
  fast    the one-hour CPU budget: 3+3 layers, warmup + cosine, no dropout, best dev checkpoint.
  best    :fast's recipe with dropout 0.1 for three times the steps: the 150-minute budget.
  ablate  2+2 layers, dropout 0.1, the paper's rsqrt schedule: the baseline of the ablations.
  small   3+3 layers at twice :fast's width, rsqrt, beam 4: for one accelerator.
  base    the paper's base sizes (6+6 layers, d_model 512), beam 4: for one accelerator.

  python train.py --config=configs/g2p.py:tiny --workdir=runs/g2p_tiny
  python eval.py --workdir=runs/g2p_tiny --split=test --step=best

Results of every variant (WER, PER, seeds, wall clock, hardware): docs/g2p.md#recipes.
"""

from configs import base

VARIANTS = ("tiny", "fast", "best", "small", "base", "ablate")


def get_config(arg: str = "base"):
  """The G2P config; `arg` picks the variant (tiny | fast | best | small | base | ablate)."""
  variant = arg or "base"
  if variant not in VARIANTS:
    raise ValueError(f"configs/g2p.py: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
  c = base.get_config()
  c.data.dataset = "cmudict_g2p"
  c.data.tokenizer = "symbol"  # target: space-separated ARPAbet phones
  c.data.source_tokenizer = "char"
  c.data.max_source_len = 32
  c.data.max_target_len = 30  # the longest pronunciation is 28 phones + EOS; 32/30 packs 92.7%
  c.data.batching = "pack"
  c.model.max_len = 64
  # Letters and phones are both numbered from 4: one shared table would make letter i and phone i
  # the same vector. Separate tables (sharing measured: configs/sweeps/share_embeddings.py).
  c.model.share_src_tgt_embeddings = False
  c.train.label_smoothing = 0.1
  c.eval.decode.method = "beam"
  c.eval.decode.beam_size = 4
  c.eval.metrics = "wer,per"
  c.checkpoint.keep_best_by = "eval/wer"

  m, t = c.model, c.train
  if variant == "tiny":
    # Chosen on the dev split (docs/g2p.md#choosing-tiny): wider than deep, no dropout for a
    # 2-epoch run, a short warmup and a cosine decay to zero at a constant-scale learning rate.
    m.update(d_model=96, num_heads=4, mlp_dim=384, num_encoder_layers=2, num_decoder_layers=2,
             dropout_rate=0.0)
    c.data.batch_size = 64
    t.update(num_steps=1000, schedule="warmup_cosine", learning_rate=5e-3, warmup_steps=100,
             log_every_steps=50)
    c.eval.update(every_steps=1000, num_batches=0, num_decode_examples=0)  # the whole dev split
    c.eval.decode.update(method="greedy", beam_size=1)
    c.checkpoint.update(every_steps=200, keep=2)
  elif variant == "ablate":
    # The baseline of the G2P ablations (positional encodings, embedding sharing: docs/sweeps.md),
    # which run it for 3000 steps.
    m.update(d_model=64, num_heads=4, mlp_dim=256, num_encoder_layers=2, num_decoder_layers=2,
             dropout_rate=0.1)
    c.data.batch_size = 64
    t.update(num_steps=600, learning_rate=2.0, warmup_steps=200, log_every_steps=50)
    c.eval.update(every_steps=600, num_batches=0, num_decode_examples=0)  # the whole dev split
    c.eval.decode.update(method="greedy", beam_size=1)
    c.checkpoint.update(every_steps=200, keep=2)
  elif variant in ("fast", "best"):
    # The 60-minute budget on 2 CPU cores: ~25 epochs of 128 packed rows; no dropout (better
    # than 0.1 on three seeds at this length: docs/g2p.md#dropout); greedy decoding of the whole dev
    # split every 1000 steps, the best of which eval.py --step=best tests.
    m.update(d_model=128, num_heads=4, mlp_dim=512, num_encoder_layers=3, num_decoder_layers=3,
             dropout_rate=0.0)
    c.data.batch_size = 128
    t.update(num_steps=6000, schedule="warmup_cosine", learning_rate=3e-3, warmup_steps=300,
             log_every_steps=100)
    c.eval.update(every_steps=1000, num_batches=0, num_decode_examples=0)
    c.eval.decode.update(method="greedy", beam_size=1)
    c.checkpoint.update(every_steps=1000, keep=2)
    if variant == "best":
      # The 150-minute budget: :fast's recipe for 3x the steps (~75 epochs), dev every 2000, and
      # dropout 0.1: without it the dev loss rises after ~33 epochs (docs/g2p.md#best-18000-steps).
      m.update(dropout_rate=0.1)
      t.update(num_steps=18_000)
      c.eval.update(every_steps=2000)
      c.checkpoint.update(every_steps=2000)
  elif variant == "small":
    m.update(d_model=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3, num_decoder_layers=3,
             dropout_rate=0.1)
    c.data.batch_size = 128
    t.update(num_steps=20_000, learning_rate=1.0, warmup_steps=4000, log_every_steps=100)
    c.eval.update(every_steps=2000, num_batches=0, num_decode_examples=1000)
    c.checkpoint.update(every_steps=1000, keep=3)
  else:
    m.update(d_model=512, num_heads=8, mlp_dim=2048, num_encoder_layers=6, num_decoder_layers=6,
             dropout_rate=0.1)
    c.data.batch_size = 256
    t.update(num_steps=50_000, learning_rate=1.0, warmup_steps=4000, log_every_steps=100)
    c.eval.update(every_steps=5000, num_batches=0, num_decode_examples=0)
    c.checkpoint.update(every_steps=2500, keep=3)
  return c
