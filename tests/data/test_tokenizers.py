"""Tokenizers: round trips, special ids, unknown handling, save/load."""

import pytest

from transformer.data import tokenizers as T

TEXTS = ["the quick brown fox", "jumps over the lazy dog's back", "zebra, 42 times!"]
PHONES = ["DH AH", "K W IH K", "B R AW N", "F AA K S"]


def _all(kind, texts=TEXTS, **kw):
  return T.build(kind, texts, **kw)


@pytest.mark.parametrize("kind", ["char", "byte", "sentencepiece"])
def test_text_round_trip(kind):
  """decode(encode(s)) == s on the training texts, and encode adds no specials (ids >= 4)."""
  texts = TEXTS * 20 if kind == "sentencepiece" else TEXTS
  tok = _all(kind, texts, spm_vocab_size=60) if kind == "sentencepiece" else _all(kind)
  for s in TEXTS:
    ids = tok.encode(s)
    assert ids and min(ids) >= T.NUM_SPECIAL and max(ids) < tok.vocab_size
    assert tok.decode(ids) == s


def test_symbol_round_trip_and_vocab():
  """Symbols are whitespace-separated units; the vocabulary is the sorted set plus 4 specials."""
  tok = _all("symbol", PHONES)
  units = sorted({p for s in PHONES for p in s.split()})
  assert tok.vocab_size == T.NUM_SPECIAL + len(units)
  assert tok.encode("K W IH K") == [units.index(u) + T.NUM_SPECIAL for u in ["K", "W", "IH", "K"]]
  assert tok.decode(tok.encode("  F  AA K S ")) == "F AA K S"


def test_special_ids_are_the_same_for_every_kind():
  """pad 0, eos 1, bos 2, unk 3 for char, byte, symbol and SentencePiece (documented contract)."""
  toks = [_all("char"), _all("byte"), _all("symbol", PHONES),
          _all("sentencepiece", TEXTS * 20, spm_vocab_size=60)]
  for tok in toks:
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3), tok


def test_byte_tokenizer_is_utf8_plus_offset():
  """Byte ids are the UTF-8 bytes + 4 (vocabulary 260); non-ASCII text round-trips."""
  tok = T.ByteTokenizer()
  s = "Grüße, 日本"
  assert tok.encode(s) == [b + 4 for b in s.encode("utf-8")]
  assert tok.vocab_size == 260 and tok.decode(tok.encode(s)) == s


def test_unknown_units_map_to_unk():
  """Characters / symbols outside the training vocabulary become unk_id, no crash."""
  char = _all("char")
  assert char.encode("q#x") == [char.encode("q")[0], T.UNK_ID, char.encode("x")[0]]
  assert char.decode(char.encode("a#")) == "a<unk>"
  sym = _all("symbol", PHONES)
  assert sym.encode("K ZZ K").count(T.UNK_ID) == 1


def test_decode_stops_at_eos_and_drops_pad_and_bos():
  """decode stops at the first EOS and ignores padding and BOS ids."""
  tok = _all("char")
  ids = tok.encode("fox")
  assert tok.decode([T.BOS_ID, *ids, T.EOS_ID, *tok.encode("dog"), 0, 0]) == "fox"
  assert tok.decode([0, *ids[:1], 0, *ids[1:]]) == "fox"


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_is_deterministic(model_type):
  """Training twice on the same text gives the identical model; the vocab size is honoured
  (unigram may stop below it on a tiny corpus: hard_vocab_limit=False)."""
  texts = [" ".join(TEXTS)] * 30
  a = _all("sentencepiece", texts, spm_vocab_size=50, spm_model_type=model_type)
  b = _all("sentencepiece", texts, spm_vocab_size=50, spm_model_type=model_type)
  assert a == b and (a.vocab_size == 50 if model_type == "bpe" else a.vocab_size <= 50)
  assert a.decode(a.encode("the lazy fox")) == "the lazy fox"


@pytest.mark.parametrize("kind", ["char", "byte", "symbol", "sentencepiece"])
def test_save_load_gives_the_same_tokenizer(kind, tmp_path):
  """A saved tokenizer loads back with the same vocabulary and the same ids."""
  texts = PHONES if kind == "symbol" else TEXTS * 20
  tok = T.build(kind, texts, spm_vocab_size=60)
  tok.save(str(tmp_path / "tok"))
  again = T.load(str(tmp_path / "tok"))
  assert again == tok and again.vocab_size == tok.vocab_size
  assert again.encode(texts[1]) == tok.encode(texts[1])


def test_bad_kind_and_missing_dir_are_one_line_errors(tmp_path):
  """An unknown kind names the config key; loading from an empty dir names the file."""
  with pytest.raises(ValueError, match="data.tokenizer='words'"):
    T.build("words", TEXTS)
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    T.load(str(tmp_path))


SPELLED = "a <s> b </s> c <unk> <pad> <|endoftext|> [SEP] d"  # specials as a corpus spells them


def _hf_tokenizer(offset: int) -> T.HFTokenizer:
  """A byte-level BPE trained here whose specials <pad> </s> <unk> <s> <|endoftext|> are ids 0-4
  (T5's pad and end of sequence first, as offset 0 needs)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS * 5, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>", "<s>", "<|endoftext|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  return T.HFTokenizer(tok.to_str(), offset)


@pytest.mark.parametrize("kind", ["char", "byte", "symbol", "sentencepiece", "hf", "hf0"])
def test_special_tokens_spelled_in_text_are_text(kind):
  """Text is text, for every kind: `<s>`, `</s>`, `<unk>`, `<pad>`, `<|endoftext|>` spelled in a
  corpus never become pad, EOS or BOS, nor any id of a Hugging Face tokenizer's own special tokens
  (whose shifted copies a converted model never predicts); the byte-level ones decode back to the
  text exactly."""
  texts = TEXTS + [SPELLED]
  if kind.startswith("hf"):
    tok = _hf_tokenizer(0 if kind == "hf0" else T.NUM_SPECIAL)
    specials = {tok.token_id(t) + tok.offset
                for t in ("<pad>", "</s>", "<unk>", "<s>", "<|endoftext|>")}
  else:
    tok = _all(kind, texts * 20, spm_vocab_size=80) if kind == "sentencepiece" else \
        _all(kind, texts)
    specials = {T.PAD_ID, T.EOS_ID, T.BOS_ID}
  ids = tok.encode(SPELLED)
  assert not set(ids) & specials, (kind, ids)
  if kind in ("byte", "hf", "hf0"):
    assert tok.decode(ids) == SPELLED
