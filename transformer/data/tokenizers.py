"""Tokenizers behind one interface, in one table `TOKENIZERS` (data.tokenizer -> class): char,
byte, symbol, SentencePiece (BPE / unigram) and a Hugging Face `tokenizer.json` ('hf').

All share the special ids pad 0 (also the decoder's start token), eos 1, bos 2 (never emitted for
the decoder) and unk 3; ordinary tokens start at NUM_SPECIAL = 4. A tokenizer is saved as a
directory holding `tokenizer.json` (plus `spm.model` or `hf_tokenizer.json`). A Hugging Face
tokenizer's id i is our id i + `data.hf_id_offset`: NUM_SPECIAL (GPT-2), or 0 for one whose ids 0
and 1 are pad and end-of-sequence as ours are (T5); transformer/convert/ maps weights the same way.

Text is text: `encode` reads a special token spelled in the text (`<s>`, `</s>`, `<unk>`, `<pad>`,
`<|endoftext|>`, `[SEP]`) as its characters, never as the special id, so a corpus cannot inject
control tokens; the special ids come only from the pipeline (EOS, BOS) or an unknown unit (UNK).
"""

import io
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from transformer import files, keyspec
from transformer.config import check_value

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
NUM_SPECIAL = 4
_JSON = "tokenizer.json"
_SPM_FILE = "spm.model"
HF_FILE = "hf_tokenizer.json"  # a Hugging Face tokenizer.json, renamed: ours is tokenizer.json


class Tokenizer:
  """Base class: the special ids and the shared decode rule (stop at EOS, drop pad and BOS).
  A subclass defines `encode`, `new`, `_decode_ids` (the ids left to decode) and `_config` (what
  tokenizer.json holds besides its type)."""

  kind = ""
  pad_id, eos_id, bos_id, unk_id = PAD_ID, EOS_ID, BOS_ID, UNK_ID
  vocab_size: int  # number of ids, specials included

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without BOS/EOS; a special token spelled in `text` is text."""
    raise NotImplementedError

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`: stops at the first EOS, drops pad and BOS, shows unknowns as <unk>."""
    ids = itertools.takewhile(lambda i: i != EOS_ID, map(int, ids))
    return self._decode_ids([i for i in ids if i not in (PAD_ID, BOS_ID)])

  @classmethod
  def new(cls, texts: Iterable[str], **options: Any) -> "Tokenizer":
    """A new tokenizer whose vocabulary comes from `texts` (this default: a fixed vocabulary);
    `options`: `build`'s, each kind reading its own."""
    return cls()

  @classmethod
  def read(cls, spec: dict[str, Any], directory: str) -> "Tokenizer":
    """The tokenizer saved in `directory`, whose tokenizer.json holds `spec`."""
    del directory  # the units are in `spec`
    return cls(**{k: v for k, v in spec.items() if k != "type"})

  def _key(self) -> Any:
    """What equal tokenizers of one type share."""
    return json.dumps(self._config(), sort_keys=True)

  def save(self, directory: str) -> None:
    """Writes the tokenizer to `directory` (created if missing)."""
    files.makedirs(directory)
    files.write_text_atomic(os.path.join(directory, _JSON), json.dumps(
        {"type": self.kind, **self._config()}, ensure_ascii=False, indent=1))

  def __eq__(self, other: Any) -> bool:
    return type(self) is type(other) and self._key() == other._key()

  def __hash__(self) -> int:
    return hash((self.kind, self._key()))

  def __repr__(self) -> str:
    return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class _VocabTokenizer(Tokenizer):
  """A fixed list of units mapped to ids NUM_SPECIAL, NUM_SPECIAL+1, ...: characters, or with a
  `_separator` the symbols it separates."""

  _separator = ""

  def __init__(self, units: Sequence[str]):
    self.units = list(units)
    self._ids = {u: i + NUM_SPECIAL for i, u in enumerate(self.units)}
    if len(self._ids) != len(self.units):
      raise ValueError(f"{self.kind} tokenizer: duplicate units in the vocabulary")
    self.vocab_size = NUM_SPECIAL + len(self.units)

  @classmethod
  def _split(cls, text: str) -> Sequence[str]:
    return text.split() if cls._separator else text

  @classmethod
  def new(cls, texts: Iterable[str], **options: Any) -> Tokenizer:
    return cls(sorted(set().union(*map(cls._split, texts))))

  def encode(self, text: str) -> list[int]:
    return [self._ids.get(u, UNK_ID) for u in self._split(text)]

  def _decode_ids(self, ids: list[int]) -> str:
    return self._separator.join(self.units[i - NUM_SPECIAL] if NUM_SPECIAL <= i < self.vocab_size
                                else "<unk>" for i in ids)

  def _config(self) -> dict[str, Any]:
    return {"units": self.units}


class CharTokenizer(_VocabTokenizer):
  """One id per Unicode character of the training text."""

  kind = "char"


class SymbolTokenizer(_VocabTokenizer):
  """One id per whitespace-separated symbol (phones); decodes with single spaces."""

  kind, _separator = "symbol", " "


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes: byte b is id b + NUM_SPECIAL (vocabulary 260); nothing is ever unknown."""

  kind, vocab_size = "byte", NUM_SPECIAL + 256

  def encode(self, text: str) -> list[int]:
    return [b + NUM_SPECIAL for b in text.encode("utf-8")]

  def _decode_ids(self, ids: list[int]) -> str:
    data = bytes(i - NUM_SPECIAL for i in ids if NUM_SPECIAL <= i < self.vocab_size)
    return data.decode("utf-8", errors="replace")

  def _config(self) -> dict[str, Any]:
    return {}


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (BPE or unigram) with our special ids."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (optional: BPE only)
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    got = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
    if got != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
      raise ValueError(f"SentencePiece model has special ids (pad, eos, bos, unk)={got}, "
                       f"expected {(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}")
    self.vocab_size = self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def _decode_ids(self, ids: list[int]) -> str:
    return self._sp.decode(ids)

  def _config(self) -> dict[str, Any]:
    return {"model_file": _SPM_FILE}

  @classmethod
  def new(cls, texts: Iterable[str], *, spm_vocab_size: int = 8000, spm_model_type: str = "bpe",
          **options: Any) -> Tokenizer:
    """Trains SentencePiece on `texts` deterministically (one thread, no sampling shuffle)."""
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (optional: BPE only)
    check_value("data.spm_model_type", spm_model_type)
    max_sentences = 1_000_000
    lines = (line for text in itertools.islice(texts, max_sentences)
             for line in text.splitlines() if line.strip())
    out = io.BytesIO()
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=lines, model_writer=out, vocab_size=spm_vocab_size,
          model_type=spm_model_type, pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
          character_coverage=1.0, num_threads=1, shuffle_input_sentence=False,
          input_sentence_size=max_sentences, hard_vocab_limit=False, minloglevel=2)
    except RuntimeError as e:
      raise ValueError(f"data.spm_vocab_size={spm_vocab_size}: SentencePiece training failed: "
                       f"{str(e).splitlines()[0]}") from None
    return cls(out.getvalue())

  @classmethod
  def read(cls, spec: dict[str, Any], directory: str) -> Tokenizer:
    return cls(files.read_bytes(os.path.join(directory, spec["model_file"])))

  def save(self, directory: str) -> None:
    files.makedirs(directory)
    files.write_bytes_atomic(os.path.join(directory, _SPM_FILE), self.model_proto)
    super().save(directory)

  def _key(self) -> Any:
    return self.model_proto


class HFTokenizer(Tokenizer):
  """A Hugging Face `tokenizers` tokenizer (its tokenizer.json text); its id i is our i + `offset`.
  Its own special tokens (GPT-2's <|endoftext|>) are ordinary ids here, and never come from text
  (`encode_special_tokens`: `</s>` in text is split like any other word). offset=0 needs its ids 0
  and 1 to be special tokens (T5's <pad> and </s>); its id 2 is then our BOS, which decoding drops
  (T5's <unk>, never produced on text T5 covers)."""

  kind = "hf"

  def __init__(self, tokenizer_json: str, offset: int = NUM_SPECIAL):
    from tokenizers import Tokenizer as _HF  # pylint: disable=g-import-not-at-top  (optional)
    check_value("data.hf_id_offset", offset)
    self.tokenizer_json, self.offset = tokenizer_json, offset
    try:
      self._tok = _HF.from_str(tokenizer_json)
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises a bare Exception)
      why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise ValueError(f"not a Hugging Face tokenizers tokenizer.json ({why})") from None
    self._tok.encode_special_tokens = True  # text is text (the module doc); not saved in the json
    self.vocab_size = offset + self._tok.get_vocab_size(with_added_tokens=True)
    spec = json.loads(tokenizer_json)
    if offset == 0:
      special = {t.get("id") for t in spec.get("added_tokens", []) if t.get("special")}
      if not {PAD_ID, EOS_ID} <= special:
        raise ValueError(f"data.hf_id_offset=0 needs a tokenizer whose ids {PAD_ID} and {EOS_ID} "
                         f"are special tokens (pad, end of sequence; T5's); this one's are "
                         f"{self._tok.id_to_token(PAD_ID)!r}, {self._tok.id_to_token(EOS_ID)!r}")
    model = spec.get("model") or {}
    unk = model.get("unk_token")  # BPE, WordPiece; a Unigram model (T5's) gives its unk_id
    unk_hf = self._tok.token_to_id(unk) if unk else model.get("unk_id")
    self.unk_token = self.token(unk_hf) if unk_hf is not None else None
    # Without an unknown token nothing is unknown; with offset 0 our UNK_ID is one of its pieces.
    self.unk_id = (UNK_ID if offset else -1) if unk_hf is None else unk_hf + offset

  def token_id(self, token: str) -> int | None:
    """The tokenizer's own id (without our offset) of `token`, e.g. BERT's "[MASK]", or None."""
    return self._tok.token_to_id(token)

  def token(self, hf_id: int) -> str | None:
    """The token of the tokenizer's own id `hf_id` (without our offset), or None."""
    return self._tok.id_to_token(hf_id)

  def encode(self, text: str) -> list[int]:
    return [i + self.offset for i in self._tok.encode(text, add_special_tokens=False).ids]

  def hf_encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """The tokenizer's own ids (no offset) of `text`; add_special_tokens applies its
    post-processor (a Llama tokenizer's BOS, a T5 tokenizer's EOS) as transformers does."""
    return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

  def hf_decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The text of the tokenizer's own ids (no offset), as transformers decodes them."""
    return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def _decode_ids(self, ids: list[int]) -> str:
    return self._tok.decode([i - self.offset for i in ids if i >= self.offset],
                            skip_special_tokens=False)

  def _config(self) -> dict[str, Any]:
    return {"file": HF_FILE} | ({"offset": self.offset} if self.offset != NUM_SPECIAL else {})

  @classmethod
  def new(cls, texts: Iterable[str], *, hf_tokenizer: str = "", hf_id_offset: int = NUM_SPECIAL,
          **options: Any) -> Tokenizer:
    if not hf_tokenizer:
      raise ValueError("data.tokenizer='hf' needs data.hf_tokenizer (a tokenizer.json path)")
    return read_hf_tokenizer(hf_tokenizer, hf_id_offset)

  @classmethod
  def read(cls, spec: dict[str, Any], directory: str) -> Tokenizer:
    return cls(files.read_text(os.path.join(directory, spec["file"])),
               spec.get("offset", NUM_SPECIAL))

  def save(self, directory: str) -> None:
    files.makedirs(directory)
    files.write_text_atomic(os.path.join(directory, HF_FILE), self.tokenizer_json)
    super().save(directory)

  def _key(self) -> Any:
    return self.tokenizer_json, self.offset


def read_hf_tokenizer(path: str, offset: int = NUM_SPECIAL) -> HFTokenizer:
  """The HFTokenizer of a Hugging Face tokenizer.json file, or of the one in directory `path`."""
  if files.isdir(path):
    path = os.path.join(path, "tokenizer.json")
  if not files.exists(path):
    raise FileNotFoundError(f"data.hf_tokenizer={path!r}: no such tokenizer.json")
  try:
    return HFTokenizer(files.read_text(path), offset)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


class OffsetTokenizer(Tokenizer):
  """Another tokenizer's ordinary ids moved up by `offset`, so that a decoder-only prefix-LM reads
  the source and writes the target with one embedding table (specials shared). Decoding maps ids
  outside the target's range to <unk>. Saving writes the inner tokenizer: the offset is derived
  again from the source vocabulary when a task is loaded."""

  def __init__(self, inner: Tokenizer, offset: int):
    self.inner, self.offset, self.kind = inner, offset, inner.kind
    self.vocab_size = inner.vocab_size + offset

  def encode(self, text: str) -> list[int]:
    return [i + self.offset if i >= NUM_SPECIAL else i for i in self.inner.encode(text)]

  def _decode_ids(self, ids: list[int]) -> str:
    inner = [i - self.offset if i >= NUM_SPECIAL + self.offset else
             (i if i < NUM_SPECIAL else UNK_ID) for i in ids]
    return self.inner.decode(inner)

  def _config(self) -> dict[str, Any]:
    return {"inner": self.inner._config(), "offset": self.offset}  # pylint: disable=protected-access

  def save(self, directory: str) -> None:
    self.inner.save(directory)


TOKENIZERS: keyspec.Table[type[Tokenizer]] = keyspec.Table("data.tokenizer", {
    "char": CharTokenizer,
    "byte": ByteTokenizer,
    "symbol": SymbolTokenizer,
    "sentencepiece": SentencePieceTokenizer,
    "hf": HFTokenizer,
})
# The values of data.source_tokenizer: "" is the target's own tokenizer.
SOURCE_TOKENIZERS: keyspec.Table[type[Tokenizer] | None] = keyspec.Table(
    "data.source_tokenizer", {"": None, **TOKENIZERS})


def build(kind: str, texts: Iterable[str], **options: Any) -> Tokenizer:
  """A new tokenizer of `kind` whose vocabulary comes from `texts` (the training split); kind 'hf'
  reads the tokenizer.json `hf_tokenizer` instead. `options`: the data.spm_* and data.hf_* keys
  of the kinds that read them (`new`'s keywords)."""
  return TOKENIZERS[kind].new(texts, **options)


def load(directory: str) -> Tokenizer:
  """Reads a tokenizer written by `Tokenizer.save(directory)`."""
  path = os.path.join(directory, _JSON)
  if not files.exists(path):
    raise FileNotFoundError(f"no tokenizer at {path}")
  spec = json.loads(files.read_text(path))
  if spec.get("type") not in TOKENIZERS:
    raise ValueError(f"{path}: unknown tokenizer type {spec.get('type')!r}")
  return TOKENIZERS[spec["type"]].read(spec, directory)
