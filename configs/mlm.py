r"""Masked-LM pretraining (BERT's objective) of an encoder-only model, offline.

BERT's masking (data.mask_rate of the ordinary tokens selected; of those 80% [MASK], 10% random,
10% kept), the loss on the selected positions only, drawn afresh per example and epoch from
(data.shuffle_seed, epoch, example index), so a resumed run masks as an uninterrupted one.
Examples are BOS + ids + EOS (BOS is the [CLS] of first-token pooling); rows are packed.
  cmudict  the words of cmudict_g2p/stress's train split, letters: the checkpoint that
           configs/classify.py fine-tunes (`--init_from`).
  text     a text file (data.text_file) in rows of characters, whole-word masking.

  python train.py --config=configs/mlm.py:cmudict --workdir=runs/mlm_cmudict
  python eval.py --workdir=runs/mlm_cmudict --split=test   # masked-token accuracy, perplexity

Results (masked-token accuracy, perplexity, what the checkpoint buys a classifier):
docs/encoder_only.md.
"""

from configs import base

VARIANTS = ("cmudict", "text")


def encoder(c) -> None:
  """The encoder-only model shared by configs/mlm.py and configs/classify.py (same shapes, so a
  pretrained encoder loads into the classifier)."""
  c.model.update(arch="encoder_only", d_model=64, num_heads=4, mlp_dim=256, num_encoder_layers=2,
                 norm_position="pre", positional="sinusoidal", dropout_rate=0.1, max_len=128,
                 tie_embeddings=True)
  c.train.update(optimizer="adamw", schedule="warmup_cosine", learning_rate=1e-3,
                 warmup_steps=100, weight_decay=0.01, label_smoothing=0.0, grad_clip=1.0,
                 log_every_steps=100)
  c.data.update(dataset="cmudict_g2p/stress", source_tokenizer="char", tokenizer="symbol",
                max_source_len=32, batching="pack", batch_size=32)


def get_config(arg: str = "cmudict"):
  """The masked-LM config; `arg` picks the variant (cmudict | text)."""
  variant = arg or "cmudict"
  if variant not in VARIANTS:
    raise ValueError(f"configs/mlm.py: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
  c = base.get_config()
  encoder(c)
  c.model.head = "mlm"
  c.data.update(objective="mlm", mask_rate=0.15, max_target_len=32)
  c.train.num_steps = 1000
  c.eval.update(every_steps=500, num_batches=0)
  c.checkpoint.update(every_steps=500, keep=1, keep_best_by="eval/loss")
  if variant == "text":
    c.data.update(dataset="text_files", tokenizer="char", source_tokenizer="",
                  max_source_len=128, max_target_len=128, whole_word_masking=True)
    c.eval.num_batches = 20
  return c
