r"""Decodes words or sentences with a trained run from the command line.

  python -m transformer.predict --workdir=runs/g2p hello world
  printf 'hello\nworld\n' | python -m transformer.predict --workdir=runs/g2p --method=beam --beam_size=8
  python -m transformer.predict --workdir=runs/a --ensemble=runs/b,runs/c --step=best hello

Prints one `input<TAB>output` line per input (inputs from the arguments, else one per stdin line).
An encoder-only run is not decoded; its line depends on model.head:
  mlm       input<TAB>the text with each marker (--mask, default `_`) filled<TAB>then one field per
            marker: its --top_k (default 5) most likely tokens as `token=probability`
  classify  input<TAB>the predicted label<TAB>its probability
  tag       input<TAB>`token/tag` for every token of the input
  python -m transformer.predict --workdir=runs/bert --top_k=3 "paris is the _ of france."
An input that cannot be decoded (empty, characters outside the model's vocabulary, longer than the
model was trained on) gets a one-line `error:` message on stderr and the others are still decoded;
the exit status is 1 if any input (or the workdir) was bad, 0 otherwise. Inputs with no unknown
characters once lower-cased are lower-cased (CMUdict words are lower case).
"""

from __future__ import annotations

import io
import sys
from typing import Any, Sequence

from absl import flags

from transformer import cli


def _unknown_units(tokenizer: Any, text: str) -> list[str]:
  """The characters (or symbols) of `text` that the tokenizer maps to its unknown id."""
  units = text.split() if getattr(tokenizer, "kind", "") == "symbol" else list(text)
  return [u for u in dict.fromkeys(units) if tokenizer.unk_id in tokenizer.encode(u)]


def shown(text: str, limit: int = 40) -> str:
  """An input as an error message shows it: its repr, cut to `limit` characters."""
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
    shown = " ".join(repr(u) for u in dict.fromkeys(unknown[:10]))
    return f"has characters outside the model's vocabulary: {shown}", text
  cfg = run.config
  if cfg.model.arch == "encoder_only":  # BOS + ids + EOS, as long as training's rows at most
    length = sum(len(tokenizer.encode(p)) for p in pieces) + len(pieces) - 1 + 2
    limit = cfg.data.max_source_len
    if length > limit:
      return (f"is too long: {length} tokens with BOS and EOS, the model takes at most {limit} "
              "(data.max_source_len)"), text
    return None, text
  # The raw length: encode_source truncates to data.max_source_len, as the data pipeline does.
  length = len(tokenizer.encode(text)) + (run.kind != "lm")
  if cfg.model.arch == "encoder_decoder":
    limit, key = cfg.data.max_source_len, "data.max_source_len"
  elif max_decode_len:
    limit, key = cfg.model.max_len - max_decode_len, "model.max_len - max_decode_len"
  else:  # unset: the continuation gets what fits after the prompt (evaluation.decode_batches)
    limit, key = cfg.model.max_len - 1, "model.max_len - 1"
  if length > limit:
    return f"is too long: {length} tokens, the model takes at most {limit} ({key})", text
  return None, text


def _define(f: flags.FlagValues) -> None:
  flags.DEFINE_string("workdir", None, "the training run's workdir", flag_values=f)
  flags.mark_flag_as_required("workdir", flag_values=f)
  flags.DEFINE_string("step", "latest", "an integer, 'latest' or 'best'", flag_values=f)
  flags.DEFINE_string("ensemble", "", "other runs' workdirs, comma-separated: decode with the "
                      "ensemble of these and --workdir's (the mean of their probabilities; each "
                      "at --step)", flag_values=f)
  flags.DEFINE_enum("method", None, ["greedy", "beam", "sample"],
                    "default: the run's eval.decode.method", flag_values=f)
  flags.DEFINE_integer("beam_size", None, "beams", flag_values=f)
  flags.DEFINE_float("length_penalty", None, "GNMT alpha", flag_values=f)
  flags.DEFINE_float("temperature", None, "sampling temperature", flag_values=f)
  flags.DEFINE_integer("top_k", None, "sampling: the k likeliest", flag_values=f)
  flags.DEFINE_float("top_p", None, "sampling: nucleus mass", flag_values=f)
  flags.DEFINE_integer("max_decode_len", None, "longest output", flag_values=f)
  flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=f)
  flags.DEFINE_string("mask", "_", "an encoder-only masked LM's marker to fill (each one "
                      "[MASK]); --top_k fillers are printed per marker (default 5)", flag_values=f)


def main(argv: Sequence[str] | None = None, stdin: Any = None) -> int:
  """Runs the command line; returns the exit status."""
  args, inputs = cli.parse_own_flags("python -m transformer.predict", _define,
                                     sys.argv[1:] if argv is None else argv)
  if not inputs and stdin is None:  # bytes kept as surrogates: check_input names them
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
  texts = inputs or [line.rstrip("\n") for line in stdin]
  from absl import logging  # pylint: disable=g-import-not-at-top  (after --help, as api)
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # keep stderr for our one-line messages (TFDS is chatty)
  try:
    return _predict(args, texts)
  finally:  # a caller in the same process (a notebook, a test) keeps its own logging
    logging.set_verbosity(verbosity)


def _predict(args: flags.FlagValues, texts: list[str]) -> int:
  """Restores the run, checks each input and prints `input<TAB>output` lines; the exit status."""
  from transformer import api  # pylint: disable=g-import-not-at-top  (after --help: JAX is slow)
  from transformer.checkpoints import CheckpointError  # pylint: disable=g-import-not-at-top  (as api)
  step = int(args.step) if args.step.lstrip("-").isdigit() else args.step
  workdirs = [args.workdir, *filter(None, args.ensemble.split(","))]
  try:
    run = api.restore(workdirs, step)
  except (ValueError, CheckpointError, FileNotFoundError) as e:
    print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 1
  options = dict(method=args.method, beam_size=args.beam_size, length_penalty=args.length_penalty,
                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                 max_decode_len=args.max_decode_len)
  if run.config.model.arch == "encoder_only":
    return _predict_encoder(run, args, texts, options)
  # 0 for an LM: its continuation gets what fits after the prompt (max_target_len is the context).
  max_decode_len = args.max_decode_len or run.config.eval.decode.max_decode_len or (
      0 if run.kind == "lm" else run.config.data.max_target_len)
  good, status = [], 0
  for n, text in enumerate(texts, start=1):
    error, cleaned = check_input(run, text, max_decode_len)
    if error:
      print(f"error: input {n} {shown(text)} {error}", file=sys.stderr)
      status = 1
    else:
      good.append((text, cleaned))
  if good:
    try:
      outputs = run.generate_text([c for _, c in good], seed=args.seed, **options)
    except ValueError as e:  # bad decoding options: one line naming the option
      print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
      return 1
    for (text, _), output in zip(good, outputs):
      print(f"{text.strip()}\t{output}")
  return status


def _shown_token(token: str) -> str:
  """A filler as printed: itself, or its repr when empty or with whitespace (a space token)."""
  return token if token and not any(c.isspace() for c in token) else repr(token)


def _predict_encoder(run: Any, args: flags.FlagValues, texts: list[str],
                     options: dict[str, Any]) -> int:
  """An encoder-only run's lines, by model.head: 'mlm' input<TAB>filled<TAB>one field per marker
  of --top_k `token=probability` fillers; 'classify' input<TAB>label<TAB>probability; 'tag'
  input<TAB>token/tag per token. The exit status."""
  head = run.config.model.head
  allowed = {"top_k"} if head == "mlm" else set()
  bad = next((k for k, v in options.items() if v is not None and k not in allowed), None)
  if bad:
    print(f"error: --{bad} is a decoding option; this run is encoder-only (model.head={head!r}), "
          "which is not decoded", file=sys.stderr)
    return 1
  good, status = [], 0
  for n, text in enumerate(texts, start=1):
    error, cleaned = check_input(run, text, 0, mask=args.mask if head == "mlm" else "")
    if error:
      print(f"error: input {n} {shown(text)} {error}", file=sys.stderr)
      status = 1
    else:
      good.append((text.strip(), cleaned))
  if not good:
    return status
  cleaned = [c for _, c in good]
  if head == "mlm":
    try:
      fillers = run.mask_fillers(cleaned, k=5 if args.top_k is None else args.top_k,
                                 mask=args.mask)
    except ValueError as e:  # --top_k < 1
      print(f"error: --{str(e).splitlines()[0]}", file=sys.stderr)
      return 1
    columns = [[f, *("  ".join(f"{_shown_token(t)}={p:.3f}" for t, p in marker)
                     for marker in m)]
               for f, m in zip(run.fill_mask(cleaned, mask=args.mask), fillers)]
  elif head == "classify":
    columns = [[label, f"{p:.4f}"] for label, p in run.classify_with_probability(cleaned)]
  else:
    columns = [[" ".join(f"{_shown_token(t)}/{g}" for t, g in tags)] for tags in run.tag(cleaned)]
  for (text, _), cols in zip(good, columns):
    print("\t".join([text, *cols]))
  return status


if __name__ == "__main__":
  sys.exit(main())
