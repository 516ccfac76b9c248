r"""Classification with an encoder-only model: the primary-stress position of a CMUdict word from
its spelling (data.label=primary_stress on cmudict_g2p/stress), offline.

Each word is BOS + letters + EOS; its label is the 1-based syllable (vowel) carrying primary
stress in its first pronunciation (0: none); `--config.data.label=syllables` predicts the
syllable count instead. Packed rows; each example is pooled over its own tokens (model.pooling).

  python train.py --config=configs/classify.py --workdir=runs/stress_scratch
  python train.py --config=configs/classify.py --workdir=runs/stress_pretrained \
      --init_from=runs/mlm_cmudict          # the encoder of configs/mlm.py, a new head
  python eval.py --workdir=runs/stress_pretrained --split=test --step=best   # accuracy, F1
  --config.data.label_fraction=0.01 (or 0.1) trains on 1% (10%) of the training words' labels.

Results (from scratch vs pretrained, label fractions, seeds):
docs/encoder_only.md#masked-lm-pretraining-for-a-stress-classifier.
"""

from configs import base
from configs import mlm


def get_config(arg: str = ""):
  """The stress-position classifier (the argument is unused)."""
  del arg
  c = base.get_config()
  mlm.encoder(c)
  c.model.update(head="classify", pooling="mean")
  c.data.update(label="primary_stress", max_target_len=8)  # up to 8 words packed per row
  c.train.num_steps = 400
  c.eval.update(every_steps=100, num_batches=0)
  c.checkpoint.update(every_steps=100, keep=1, keep_best_by="eval/accuracy", best_mode="max")
  return c
