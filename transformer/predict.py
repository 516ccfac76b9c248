r"""Decodes words or sentences with a trained run from the command line.

  python -m transformer.predict --workdir=runs/g2p hello world
  printf 'hello\nworld\n' | python -m transformer.predict --workdir=runs/g2p --method=beam --beam_size=8

Prints one `input<TAB>output` line per input (inputs from the arguments, else one per stdin line).
An input that cannot be decoded (empty, characters outside the model's vocabulary, longer than the
model was trained on) gets a one-line `error:` message on stderr and the others are still decoded;
the exit status is 1 if any input (or the workdir) was bad, 0 otherwise. Inputs with no unknown
characters once lower-cased are lower-cased (CMUdict words are lower case).
"""

from __future__ import annotations

import argparse
import io
import sys
from typing import Any, Sequence


def _unknown_units(tokenizer: Any, text: str) -> list[str]:
  """The characters (or symbols) of `text` that the tokenizer maps to its unknown id."""
  units = text.split() if getattr(tokenizer, "kind", "") == "symbol" else list(text)
  return [u for u in dict.fromkeys(units) if tokenizer.unk_id in tokenizer.encode(u)]


def shown(text: str, limit: int = 40) -> str:
  """An input as an error message shows it: its repr, cut to `limit` characters."""
  text = text.strip()
  return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def check_input(run: Any, text: str, max_decode_len: int) -> tuple[str | None, str]:
  """(error message or None, the text to decode) for one input; max_decode_len 0 = unset."""
  if not text.strip():
    return "is empty", text
  bad = next((c for c in text if "\udc80" <= c <= "\udcff"), None)  # undecodable bytes
  if bad is not None:  # (Python keeps them as surrogates in argv and stdin)
    return f"is not UTF-8 text (byte {ord(bad) - 0xdc00:#04x}); is it a binary file?", text
  text = text.strip()
  tokenizer = run.source_tokenizer or run.target_tokenizer
  unknown = _unknown_units(tokenizer, text)
  if unknown and not _unknown_units(tokenizer, text.lower()):
    text, unknown = text.lower(), []
  if unknown:
    shown = " ".join(repr(u) for u in unknown[:10])
    return f"has characters outside the model's vocabulary: {shown}", text
  cfg = run.config
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


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    print(f"error: {message} (see --help)", file=sys.stderr)  # one line, not the usage block
    sys.exit(2)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
  parser = _Parser(prog="python -m transformer.predict",
                   description="Decode inputs with a trained run.")
  parser.add_argument("--workdir", required=True, help="the training run's workdir")
  parser.add_argument("--step", default="latest", help="an integer, 'latest' or 'best'")
  parser.add_argument("--method", choices=("greedy", "beam", "sample"), default=None,
                      help="default: the run's eval.decode.method")
  parser.add_argument("--beam_size", type=int, default=None)
  parser.add_argument("--length_penalty", type=float, default=None)
  parser.add_argument("--temperature", type=float, default=None)
  parser.add_argument("--top_k", type=int, default=None)
  parser.add_argument("--top_p", type=float, default=None)
  parser.add_argument("--max_decode_len", type=int, default=None)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("inputs", nargs="*", help="texts to decode (default: lines of stdin)")
  return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None, stdin: Any = None) -> int:
  """Runs the command line; returns the exit status."""
  args = _parse(sys.argv[1:] if argv is None else argv)
  if not args.inputs and stdin is None:  # bytes kept as surrogates: check_input names them
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
  texts = args.inputs or [line.rstrip("\n") for line in stdin]
  from absl import logging  # pylint: disable=g-import-not-at-top  (after --help, as api)
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # keep stderr for our one-line messages (TFDS is chatty)
  try:
    return _predict(args, texts)
  finally:  # a caller in the same process (a notebook, a test) keeps its own logging
    logging.set_verbosity(verbosity)


def _predict(args: argparse.Namespace, texts: list[str]) -> int:
  """Restores the run, checks each input and prints `input<TAB>output` lines; the exit status."""
  from transformer import api  # pylint: disable=g-import-not-at-top  (after --help: JAX is slow)
  from transformer.checkpoints import CheckpointError  # pylint: disable=g-import-not-at-top  (as api)
  step = int(args.step) if args.step.lstrip("-").isdigit() else args.step
  try:
    run = api.restore(args.workdir, step)
  except (ValueError, CheckpointError, FileNotFoundError) as e:
    print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 1
  options = dict(method=args.method, beam_size=args.beam_size, length_penalty=args.length_penalty,
                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                 max_decode_len=args.max_decode_len)
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


if __name__ == "__main__":
  sys.exit(main())
