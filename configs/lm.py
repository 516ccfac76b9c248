r"""Decoder-only character (or BPE) language model on a text corpus.

The corpus is TFDS `tiny_shakespeare` (prepared in array_record form in the TFDS data directory)
or any local text file: add `--config.data.dataset=text_files --config.data.text_file=PATH`
(split: the first 90% train, the last 10% validation, nanoGPT's convention). Variants:
  char (default)  nanoGPT's shakespeare_char sizes (pre-LN, learned positions, GELU); for a GPU.
  nanogpt_cpu     nanoGPT's CPU settings (a 4-layer model, short blocks, small batches).
  bpe             `char` with a SentencePiece BPE vocabulary.
  moe, moe_dense  `nanogpt_cpu` with 8 GELU experts of 256, top-2; its dense twin (docs/moe.md).
  isoflop         `nanogpt_cpu`'s IsoFLOP recipe, µP at base width 16, lr 3.2e-2 (docs/scaling.md).

  python train.py --config=configs/lm.py:nanogpt_cpu --workdir=runs/shakespeare_char \
      --config.data.dataset=text_files --config.data.text_file=/path/to/tinyshakespeare.txt

Result of :nanogpt_cpu against nanoGPT's: docs/performance.md#character-lm-against-nanogpt.
"""

from configs import base

VARIANTS = ("char", "nanogpt_cpu", "bpe", "moe", "moe_dense", "isoflop")


def get_config(arg: str = "char"):
  """The LM config; `arg` picks the variant (one of VARIANTS)."""
  variant = arg or "char"
  if variant not in VARIANTS:
    raise ValueError(f"configs/lm.py: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
  c = base.get_config()
  c.data.update(dataset="tiny_shakespeare", tokenizer="char", source_tokenizer="",
                text_split="fraction", train_fraction=0.9, batching="pack")
  c.model.update(arch="decoder_only", num_encoder_layers=0, positional="learned",
                 norm_position="pre", ffn="gelu", use_bias=False, scale_embeddings=False,
                 tie_embeddings=True)
  c.train.update(optimizer="adamw", b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1,
                 grad_clip=1.0, schedule="warmup_cosine", warmup_steps=100,
                 min_learning_rate_ratio=0.1, label_smoothing=0.0, log_every_steps=100)
  c.eval.update(metrics="bpc", num_batches=20, num_decode_examples=0)
  c.eval.decode.update(method="sample", temperature=0.8, top_k=200)
  c.checkpoint.update(keep_best_by="eval/loss", keep=2)
  if variant in ("nanogpt_cpu", "moe", "moe_dense", "isoflop"):
    c.model.update(num_decoder_layers=4, num_heads=4, d_model=128, mlp_dim=512, dropout_rate=0.0,
                   max_len=64)
    c.data.update(max_target_len=64, max_source_len=64, batch_size=12)
    c.train.update(num_steps=2000, learning_rate=1e-3)
    c.eval.update(every_steps=250)
    c.checkpoint.update(every_steps=500)
    if variant == "moe":  # 2 active experts of hidden 256: the dense FFN's 512, 4x its weights
      c.model.update(ffn="moe", mlp_dim=256, moe_num_experts=8, moe_top_k=2,
                     moe_expert_ffn="gelu", moe_capacity_factor=1.25)
    if variant == "isoflop":  # every run evaluates once, at its end, on all of validation
      c.data.update(batch_size=16)  # configs/sweeps/isoflop.py sets each shape and its steps
      c.model.update(parametrization="mup", mup_base_width=16)  # one rate for every width
      c.train.update(learning_rate=3.2e-2)  # configs/sweeps/isoflop_lr.py's pick
      c.eval.update(every_steps=10**9, num_batches=0)
      c.checkpoint.update(every_steps=1000, keep=1)
  else:
    c.model.update(num_decoder_layers=6, num_heads=6, d_model=384, mlp_dim=1536, dropout_rate=0.2,
                   max_len=256)
    c.data.update(max_target_len=256, max_source_len=256, batch_size=64)
    c.train.update(num_steps=5000, learning_rate=1e-3)
    c.eval.update(every_steps=250)
    c.checkpoint.update(every_steps=500)
    if variant == "bpe":
      c.data.update(tokenizer="sentencepiece", spm_model_type="bpe", spm_vocab_size=2048)
  return c
