r"""Decoder-only language model on LM1B (One Billion Word), for TPU/GPU pods.

Pre-LN layers with RoPE, SwiGLU and RMSNorm, a SentencePiece BPE vocabulary, packed rows, AdamW
with warmup + cosine decay.

  python train.py --config=configs/lm1b.py --workdir=gs://BUCKET/runs/lm1b

Needs TFDS `lm1b` prepared in array_record form in data.data_dir. Not run by the project: no
result is claimed.
"""

from configs import base


def get_config(arg: str = ""):
  """The LM1B config (the argument is unused)."""
  del arg
  c = base.get_config()
  c.data.update(dataset="lm1b", target_key="text", tokenizer="sentencepiece", source_tokenizer="",
                spm_model_type="bpe", spm_vocab_size=32000, max_target_len=128,
                max_source_len=128, batching="pack", batch_size=512, eval_split="test")
  c.model.update(arch="decoder_only", num_encoder_layers=0, num_decoder_layers=8, d_model=512,
                 num_heads=8, mlp_dim=2048, positional="rope", norm="rmsnorm",
                 norm_position="pre", ffn="swiglu", use_bias=False, dropout_rate=0.0,
                 scale_embeddings=False, max_len=128)
  c.train.update(num_steps=100_000, optimizer="adamw", learning_rate=1e-3, b2=0.95, eps=1e-8,
                 weight_decay=0.1, grad_clip=1.0, schedule="warmup_cosine", warmup_steps=2000,
                 min_learning_rate_ratio=0.1, label_smoothing=0.0, log_every_steps=200)
  c.eval.update(every_steps=5000, num_batches=50, num_decode_examples=0, metrics="bpc")
  c.eval.decode.update(method="sample", temperature=1.0, top_k=40)
  c.checkpoint.update(every_steps=2500, keep=3)
  return c
