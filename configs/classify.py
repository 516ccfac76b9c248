r"""Classification with an encoder-only model: the primary-stress position of a CMUdict word from
its spelling (data.label=primary_stress on cmudict_g2p/stress), offline.

Each word is BOS + letters + EOS; its label is the 1-based syllable (vowel) carrying primary
stress in its first pronunciation (0: none). Classes in the test split: 1 (72.4%, the majority
baseline), 2 (20.4%), 3 (5.8%), 4, 5, 0, 6. Packed rows; each example is pooled over its own
tokens (model.pooling=mean; first = the BOS token). `--config.data.label=syllables` predicts the syllable count instead.

  python train.py --config=configs/classify.py --workdir=runs/stress_scratch
  python train.py --config=configs/classify.py --workdir=runs/stress_pretrained \
      --init_from=runs/mlm_cmudict          # the encoder of configs/mlm.py, a new head
  python eval.py --workdir=runs/stress_pretrained --split=test --step=best   # accuracy, F1
  --config.data.label_fraction=0.01 (or 0.1): 1% (10%) of the training words' labels.

Measured (2 layers, d_model 64, 400 steps of 32 packed rows, best of 4 dev evaluations; test
accuracy on all 12,523 test words; mean over seeds 0, 1, 2 (--config.seed and
--config.data.shuffle_seed; the labelled subset is fixed), [lowest-highest seed]; each run ~1 min
wall on a 2-core CPU VM shared with the lead's G2P trainings; fresh clone of commit ac0bd57):
  labels used            1%                  10%                 100%
  from scratch           75.4% [75.1-75.6]   77.5% [76.9-77.9]   77.9% [77.8-78.2]
  from configs/mlm.py    76.9% [75.9-77.7]   78.6% [77.6-79.7]   79.0% [78.0-80.2]
  mlm.py, 3000 steps     78.7% [78.2-79.2]   80.6% [79.9-81.2]   81.1% [80.2-81.6]
  (majority class 72.4%). Positional ablation at 100% from scratch, same seeds: RoPE 78.9%
  [78.5-79.1], none 74.8% [74.7-74.9]. Campaign (benchmarks/encoder_only.py), commands, plot and discussion: the README's
  "Encoder-only models".
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
