"""The one check of a text given to a trained run to decode (predict's and `Run.generate_text`'s):
`check_input` says why an input cannot be decoded or gives the text to decode (lower-cased when
that makes every character known); `input_error` is the one line both report. No JAX here.
"""

from typing import Any, Sequence


def _unknown_units(tokenizer: Any, text: str) -> list[str]:
  """The characters (or symbols) of `text` that the tokenizer maps to its unknown id."""
  units = text.split() if getattr(tokenizer, "kind", "") == "symbol" else list(text)
  return [u for u in dict.fromkeys(units) if tokenizer.unk_id in tokenizer.encode(u)]


def shown(text: str, limit: int = 40) -> str:
  """An input as error messages show it: its repr, cut to `limit` characters."""
  text = text.strip()
  return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def check_input(run: Any, text: str, max_decode_len: int, mask: str = ""
                ) -> tuple[str | None, str]:
  """(error message or None, the text to decode) for one input; max_decode_len 0 = unset; `mask`:
  the fill-mask marker of a masked-LM input (each one [MASK], the rest tokenized piece by piece)."""
  if not text.strip():
    return "is empty", text
  bad = next((c for c in text if "\udc80" <= c <= "\udcff"), None)  # undecodable bytes
  if bad is not None:  # (Python keeps them as surrogates in argv and stdin)
    return f"is not UTF-8 text (byte {ord(bad) - 0xdc00:#04x}); is it a binary file?", text
  if run.kind != "lm":  # a word or sentence; a language model's prompt keeps its whitespace
    text = text.strip()
  if mask and mask not in text:
    return f"has no mask marker {mask!r} (--mask) to fill", text
  pieces = text.split(mask) if mask else [text]
  tokenizer = run.source_tokenizer or run.target_tokenizer
  unknown = [u for p in pieces for u in _unknown_units(tokenizer, p)]
  if unknown and not [u for p in pieces for u in _unknown_units(tokenizer, p.lower())]:
    pieces, unknown = [p.lower() for p in pieces], []
    text = mask.join(pieces) if mask else pieces[0]
  if unknown:
    units = " ".join(repr(u) for u in dict.fromkeys(unknown[:10]))
    return f"has characters outside the model's vocabulary: {units}", text
  cfg, tokens = run.config, "tokens"
  if cfg.model.arch == "encoder_only":  # BOS + ids + EOS, as long as training's rows at most
    length = sum(len(tokenizer.encode(p)) for p in pieces) + len(pieces) - 1 + 2
    limit, key, tokens = cfg.data.max_source_len, "data.max_source_len", "tokens with BOS and EOS"
  else:  # the raw length: encode_source truncates to data.max_source_len, as the pipeline does
    length = len(tokenizer.encode(text)) + (run.kind != "lm")
    if cfg.model.arch == "encoder_decoder":
      limit, key = cfg.data.max_source_len, "data.max_source_len"
    elif max_decode_len:
      limit, key = cfg.model.max_len - max_decode_len, "model.max_len - max_decode_len"
    else:  # unset: the continuation gets what fits after the prompt (evaluation.decode_batches)
      limit, key = cfg.model.max_len - 1, "model.max_len - 1"
  if length > limit:
    return f"is too long: {length} {tokens}, the model takes at most {limit} ({key})", text
  return None, text


def input_error(n: int, text: str, error: str) -> str:
  """The one-line report of input number `n` (from 1) that check_input refused with `error`."""
  return f"input {n} {shown(text)} {error}"


def decode_length(run: Any, max_decode_len: int | None) -> int:
  """The decoding length an input must leave room for: `max_decode_len`, else the run's
  eval.decode.max_decode_len, else data.max_target_len (0 for a language model)."""
  return max_decode_len or run.config.eval.decode.max_decode_len or (
      0 if run.kind == "lm" else run.config.data.max_target_len)


def checked_texts(run: Any, texts: Sequence[str], max_decode_len: int | None) -> list[str]:
  """The texts to decode, as check_input gives them; ValueError (input_error) on the first bad one."""
  out = []
  for n, text in enumerate(texts, start=1):
    error, cleaned = check_input(run, text, decode_length(run, max_decode_len))
    if error:
      raise ValueError(input_error(n, text, error))
    out.append(cleaned)
  return out
