r"""Masked-LM pretraining (BERT's objective) of an encoder-only model, offline.

BERT's recipe at CPU size: 15% of each example's ordinary tokens selected, 80% of those replaced
by [MASK], 10% by a random token, 10% kept; the loss counts only the selected positions; masking
is drawn afresh per example and epoch from (data.shuffle_seed, epoch, example index), so a resumed
run masks exactly as an uninterrupted one. Examples are BOS + ids + EOS (BOS is the [CLS] of
first-token pooling); rows are packed.

  python train.py --config=configs/mlm.py:cmudict --workdir=runs/mlm_cmudict
  python train.py --config=configs/mlm.py:text --workdir=runs/mlm_text \
      --config.data.text_file=tinyshakespeare.txt
  python eval.py --workdir=runs/mlm_cmudict --split=test   # masked-token accuracy, perplexity

Variants:
  cmudict  the words of cmudict_g2p/stress's train split (106,217 words, letters), 2 layers,
           d_model 64, pre-LN, 1000 steps of 32 packed rows of 32 letters (about one pass over the
           words; sized for a shared 2-core CPU). The checkpoint that configs/classify.py
           fine-tunes (`--init_from`).
  text     a text file (data.text_file) cut into rows of 128 characters, whole-word masking;
           same model. Measured on tinyshakespeare.txt (nanoGPT's; first 90% train, last 10%
           validation) with --config.train.num_steps=600 (about 2.4 passes; 463 s wall, same
           machine and sharing as below): `eval.py --split=validation`, masked-character accuracy
           24.6%, perplexity 20.7 over all 16,186 masked characters of the validation text.
Measured (cmudict, the first command above with --config.data.data_dir=/tmp/g2p_data, at commit
eaf4b19 plus uncommitted edits that do not touch training; 2-core CPU VM shared with two other
agents' trainings and tests, load average 8-12): 314 s wall for the 1000 steps; `eval.py
--split=test`: masked-token accuracy 28.0%, perplexity 11.02 over the 14,715 masked letters of
all 12,523 test words (dev at step 1000: 27.5%, 11.12). With --config.train.num_steps=3000:
masked-token accuracy 34.4%, perplexity 8.33 (405 s wall). Seeds 1 and 2 (--config.seed and
--config.data.shuffle_seed, the README's campaign): 29.3% / 10.38 and 27.7% / 11.04 at 1000 steps,
35.0% / 8.06 and 34.3% / 8.32 at 3000. What the checkpoint buys a classifier: the README's "Encoder-only models".
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
