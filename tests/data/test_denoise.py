"""The objectives wired into the pipeline (transformer/data/denoise.py) and the encoder-only task
examples (transformer/data/labels.py): masking per (seed, epoch, example), exact resume, span
lengths known in advance, whole-word boundaries, label subsets and CMUdict labels."""

import numpy as np
import pytest

from transformer.data import denoise, labels, objectives, pipeline, tokenizers
from transformer.data.tokenizers import BOS_ID, EOS_ID, NUM_SPECIAL

EXTRA = objectives.ExtraIds(vocab_size=30, num_sentinels=20)


def _examples(n=40, seed=0):
  rng = np.random.default_rng(seed)
  rows = [[BOS_ID] + list(rng.integers(NUM_SPECIAL, 30, rng.integers(3, 12))) + [EOS_ID]
          for _ in range(n)]
  return pipeline.Examples.from_lists({"inputs": rows}), rows


def test_masked_lm_transform_selects_ordinary_ids_per_example_and_epoch():
  """Targets are nonzero exactly on the selected positions, round(15%) (>= 1) of each example's
  ordinary ids, never BOS/EOS; inputs differ from the row only there; the draw is a function of
  (seed, epoch, index): the same again, different in another epoch."""
  ex, rows = _examples()
  mlm = denoise.MaskedLM(EXTRA, seed=3)
  idx, epochs = np.arange(len(rows)), np.zeros(len(rows), np.int64)
  out = mlm(ex, idx, epochs)
  for i, row in enumerate(rows):
    row = np.array(row)
    s, n = out.starts["inputs"][i], out.lengths["inputs"][i]
    inputs, targets = out.tokens["inputs"][s:s + n], out.tokens["targets"][s:s + n]
    selected = targets != 0
    assert selected.sum() == max(1, round((len(row) - 2) * 0.15))
    assert not selected[0] and not selected[-1]
    np.testing.assert_array_equal(targets[selected], row[selected])
    np.testing.assert_array_equal(inputs[~selected], row[~selected])
  again = mlm(ex, idx, epochs)
  np.testing.assert_array_equal(again.tokens["inputs"], out.tokens["inputs"])
  other = mlm(ex, idx, epochs + 1)
  assert (other.tokens["targets"] != out.tokens["targets"]).any()


@pytest.mark.parametrize("mode", ["pack", "pad", "bucket"])
def test_resumed_iterator_masks_exactly_as_an_uninterrupted_one(mode):
  """Batches after get_state/set_state equal the uninterrupted batches, masks included, and
  every batch's weights are exactly its masked positions."""
  ex, _ = _examples(60)
  make = lambda: iter(pipeline.BatchDataset(  # noqa: E731
      ex, rows=4, row_len={"inputs": 16, "targets": 16}, mode=mode, seed=1,
      transform=denoise.MaskedLM(EXTRA, seed=1)))
  straight = make()
  batches = [next(straight) for _ in range(40)]  # several epochs
  for b in batches:
    np.testing.assert_array_equal(b["weights"], b["targets"] != 0)
  first = make()
  for _ in range(17):
    next(first)
  resumed = make()
  resumed.set_state(first.get_state())
  for want in batches[17:]:
    got = next(resumed)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_span_lengths_are_known_before_the_draw_and_corruption_inverts():
  """span_lengths(n) equals the lengths span_corrupt produces for every n, and the original ids
  come back from inputs + targets by a naive sentinel substitution."""
  sc = denoise.SpanCorruption(EXTRA, seed=0)
  rng = np.random.default_rng(0)
  rows = [list(rng.integers(NUM_SPECIAL, 30, n)) for n in range(2, 90)]
  ex = pipeline.Examples.from_lists({"inputs": rows})
  out = sc(ex, np.arange(len(rows)), np.zeros(len(rows), np.int64))
  want = sc.lengths(ex)
  for name in ("inputs", "targets"):
    np.testing.assert_array_equal(out.lengths[name], want[name])
  for i, row in enumerate(rows):
    get = lambda f: list(out.tokens[f][out.starts[f][i]:out.starts[f][i] + out.lengths[f][i]])  # noqa: E731
    inputs, targets = get("inputs")[:-1], get("targets")[:-1]
    spans, current = {}, None
    for t in targets:
      if t > EXTRA.mask_id:
        current = spans.setdefault(t, [])
      else:
        current.append(t)
    rebuilt = [x for t in inputs for x in (spans[t] if t > EXTRA.mask_id else [t])]
    assert rebuilt == row


def test_whole_word_boundaries_of_a_char_tokenizer():
  """Word starts are the non-space characters after a space (or at the start)."""
  tok = tokenizers.build("char", ["the cat sat"])
  ids = np.array(tok.encode("the cat  sat"))
  got = denoise.word_starts_fn(tok)(ids)
  text = "the cat  sat"
  want = [c != " " and (i == 0 or text[i - 1] == " ") for i, c in enumerate(text)]
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="whole_word_masking"):
    denoise.word_starts_fn(tokenizers.build("symbol", ["A B"]))


def test_whole_word_boundaries_of_a_wordpiece_tokenizer():
  """BERT's WordPiece ('hf'): a word starts at every piece without the '##' prefix, exactly where
  Hugging Face's own word_ids() begin a new word (punctuation is a word of its own, as in BERT's
  whole-word masking); a byte-level BPE tokenizer.json is a one-line error naming its model."""
  hf = pytest.importorskip("tokenizers")
  tok = hf.Tokenizer(hf.models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = hf.normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = hf.pre_tokenizers.BertPreTokenizer()
  tok.train_from_iterator(["the cat sees the mat.", "a dog likes a red ball."] * 10,
                          hf.trainers.WordPieceTrainer(vocab_size=40, show_progress=False,
                                                       special_tokens=["[PAD]", "[UNK]"]))
  text = "the cats like red balls, the dog sees."
  ours = tokenizers.HFTokenizer(tok.to_str())
  ids = np.array(ours.encode(text))
  words = tok.encode(text, add_special_tokens=False).word_ids
  want = [i == 0 or words[i] != words[i - 1] for i in range(len(words))]
  assert any(not w for w in want) and len(want) == len(ids)  # some word has several pieces
  np.testing.assert_array_equal(denoise.word_starts_fn(ours)(ids), want)
  bpe = hf.Tokenizer(hf.models.BPE())
  bpe.train_from_iterator(["a b"], hf.trainers.BpeTrainer(special_tokens=["<s>", "</s>"],
                                                          show_progress=False))
  with pytest.raises(ValueError, match=r"whole_word_masking.* this one is 'hf' \('BPE'\)$"):
    denoise.word_starts_fn(tokenizers.HFTokenizer(bpe.to_str()))


def test_label_fraction_subsets_are_nested_and_in_order():
  ex, _ = _examples(200)
  small, large = labels.subset(ex, 0.01), labels.subset(ex, 0.1)
  assert len(small) == 2 and len(large) == 20
  assert set(small.starts["inputs"]) <= set(large.starts["inputs"])
  assert list(large.starts["inputs"]) == sorted(large.starts["inputs"])


def test_cmudict_labels():
  """Primary stress is the 1-based vowel with stress 1; syllables count the vowels; a word is
  labelled from its first pronunciation."""
  assert labels.label_of("HH AH0 L OW1", "primary_stress") == "2"
  assert labels.label_of("HH AH0 L OW1", "syllables") == "2"
  assert labels.label_of("F S", "primary_stress") == "0"
  records = [("hello", "HH AH0 L OW1"), ("hello", "HH EH1 L OW0"), ("a", "AH0")]
  assert labels.word_labels(records, "primary_stress") == [("hello", "2"), ("a", "0")]
  with pytest.raises(ValueError, match="cmudict_g2p/stress"):
    labels.word_labels([("hello", "HH AH L OW")], "primary_stress")
