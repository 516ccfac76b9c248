r"""A Vision Transformer (Dosovitskiy et al. 2021) classifying scikit-learn's 8x8 digits, offline.

Each image is 16 patches of 2x2 pixels after a learned class token; learned positions, pre-LN,
GELU, a classifier with a bias on the class token. Data: the digits' pinned stratified split
(1,259 train, 179 validation, 359 test; transformer/data/images.py), training images cropped
from a copy padded by 1 pixel (no flips). Best checkpoint by validation accuracy.
  tiny     d_model 64, 4 layers, 2x2 patches, 1,500 steps: a few CPU minutes.
  default  the same model on 4x4 patches (a third of the compute per step), 4,500 steps.
A TFDS image dataset prepared in data_dir works too: --config.data.dataset=mnist
--config.model.image_size=28 --config.model.patch_size=4 --config.data.eval_split=test

  python train.py --config=configs/vit.py:tiny --workdir=runs/vit_tiny
  python eval.py --workdir=runs/vit_tiny --split=test --step=best   # accuracy, confusion matrix

Results (3 seeds each, beside an SVC on the same split; a patch-size sweep): docs/vit.md.
"""

from configs import base

VARIANTS = ("tiny", "default")


def get_config(arg: str = "default"):
  """The ViT config; `arg` picks the variant (tiny | default)."""
  variant = arg or "default"
  if variant not in VARIANTS:
    raise ValueError(f"configs/vit.py: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
  c = base.get_config()
  c.model.update(arch="encoder_only", head="classify", pooling="class_token", head_bias=True,
                 image_size=8, image_channels=1, patch_size=2, positional="learned", max_len=17,
                 norm_position="pre", ffn="gelu", d_model=64, num_heads=4, mlp_dim=128,
                 num_encoder_layers=4, dropout_rate=0.1, norm_eps=1e-6)
  c.data.update(dataset="digits", batch_size=128, crop_padding=1, flip=False, prefetch=2)
  c.train.update(optimizer="adamw", schedule="warmup_cosine", learning_rate=3e-3, b2=0.999,
                 eps=1e-8, warmup_steps=100, weight_decay=0.05, label_smoothing=0.1,
                 grad_clip=1.0, num_steps=1500, log_every_steps=100)
  c.eval.update(every_steps=250, num_batches=0, batch_size=256)
  c.checkpoint.update(every_steps=250, keep=1, keep_best_by="eval/accuracy", best_mode="max")
  if variant == "default":  # 4x4 patches won the patch-size sweep on validation (docs/vit.md)
    c.model.update(patch_size=4, max_len=5)
    c.train.update(num_steps=4500, warmup_steps=300)
    c.eval.every_steps = c.checkpoint.every_steps = 500
  return c
