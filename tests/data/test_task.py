"""`data.objective` through load_task on real data: span corruption of any text dataset for an
encoder-decoder, masked LM on CMUdict words for an encoder-only model, and the vocabulary sizes
training derives (tokenizer ids + [MASK] + sentinels)."""

import numpy as np

from configs import base
from transformer.config import from_configdict
from transformer.data import load_task
from transformer.data.tokenizers import BOS_ID, EOS_ID
from transformer.train.start import fill_vocab_sizes
import encoder_fixtures


def test_span_corruption_of_a_text_file_rebuilds_the_text(tmp_path):
  """Every packed example's inputs (sentinels for the spans) and targets (sentinel + span)
  rebuild a contiguous piece of the file's text; the model vocabulary counts the extra ids."""
  path = tmp_path / "corpus.txt"
  text = "the quick brown fox jumps over the lazy dog. " * 40
  path.write_text(text)
  cd = base.get_config()
  cd.data.update(dataset="text_files", text_file=str(path), data_dir=str(tmp_path / "tfds"),
                 tokenizer="char", source_tokenizer="", objective="span", max_source_len=32,
                 max_target_len=16, batch_size=4)
  cfg = from_configdict(cd)
  task = load_task(cfg, str(tmp_path / "run"))
  extra = task.extra_ids
  assert fill_vocab_sizes(cfg, task).model.vocab_size == extra.total_vocab_size
  batch = next(task.train_iterator())
  tok = task.source_tokenizer
  seen = 0
  for r in range(4):
    for s in set(batch["inputs_segment_ids"][r]) - {0}:
      inputs = batch["inputs"][r][batch["inputs_segment_ids"][r] == s]
      targets = batch["targets"][r][batch["targets_segment_ids"][r] == s]
      assert inputs[-1] == EOS_ID and targets[-1] == EOS_ID
      spans, last = {}, None
      for t in targets[:-1]:
        if t > extra.mask_id:
          spans[t], last = [], t
        else:
          spans[last].append(t)
      ids = [x for t in inputs[:-1] for x in (spans[t] if t > extra.mask_id else [t])]
      assert tok.decode(ids) in text + text
      assert any(t > extra.mask_id for t in inputs)
      seen += 1
  assert seen >= 4


def test_masked_lm_batches_of_cmudict_words(tmp_path):
  """MLM on words: rows are BOS + letters + EOS, weights are exactly the positions whose target
  is kept, never BOS or EOS, and the model vocabulary is the letters + [MASK] + sentinels."""
  cfg = from_configdict(encoder_fixtures.config(str(tmp_path / "data"), "mlm"))
  task = load_task(cfg, str(tmp_path / "run"))
  assert fill_vocab_sizes(cfg, task).model.vocab_size == (
      task.source_tokenizer.vocab_size + 1 + task.extra_ids.num_sentinels)
  batch = next(task.train_iterator())
  np.testing.assert_array_equal(batch["weights"], batch["targets"] != 0)
  real = batch["inputs"] != 0
  assert not (batch["weights"].astype(bool) & np.isin(batch["inputs"], [BOS_ID, EOS_ID])).any()
  changed = (batch["inputs"] != batch["targets"]) & (batch["targets"] != 0)
  assert changed.sum() > 0.7 * batch["weights"].sum()  # ~90% are [MASK] or a random letter
  assert 0.08 < batch["weights"].sum() / (real.sum() - 2 * (batch["inputs"] == BOS_ID).sum()) < 0.3
