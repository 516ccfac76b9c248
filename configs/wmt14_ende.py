r"""WMT14 English->German with the base Transformer of Vaswani et al. (2017), for TPU/GPU pods.

The paper's recipe: the base model (6+6 layers, d_model 512), dropout and label smoothing 0.1,
Adam(0.9, 0.98, 1e-9) with the rsqrt schedule, a shared BPE vocabulary (SentencePiece, trained
on the training split), tied embeddings, batches of ~25k target tokens, beam 4 with a length
penalty.

  python train.py --config=configs/wmt14_ende.py --workdir=gs://BUCKET/runs/wmt14_base

Needs TFDS `wmt14_translate/de-en` prepared in array_record form in data.data_dir. Not run by the
project: no result is claimed.
"""

from configs import base


def get_config(arg: str = ""):
  """The base WMT14 en-de config (the argument is unused)."""
  del arg
  c = base.get_config()  # base.py's defaults are the paper's base model and optimizer
  c.data.update(dataset="wmt14_translate/de-en", source_key="en", target_key="de",
                eval_split="validation", tokenizer="sentencepiece", source_tokenizer="",
                spm_model_type="bpe", spm_vocab_size=37000, max_source_len=256,
                max_target_len=256, batching="pack", batch_size=96, too_long="drop")
  c.model.update(max_len=512, dropout_rate=0.1, share_src_tgt_embeddings=True, tie_embeddings=True)
  c.train.update(num_steps=100_000, schedule="rsqrt", learning_rate=1.0, warmup_steps=4000,
                 label_smoothing=0.1, log_every_steps=200)
  c.eval.update(every_steps=5000, num_batches=0, num_decode_examples=1000, metrics="bleu")
  c.eval.decode.update(method="beam", beam_size=4, length_penalty=0.6, max_decode_len=256)
  c.checkpoint.update(every_steps=2500, keep=3, keep_best_by="eval/bleu", best_mode="max")
  return c
