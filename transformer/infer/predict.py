r"""Decodes words or sentences with a trained run from the command line.

  python -m transformer.infer.predict --workdir=runs/g2p hello world
  printf 'hello\nworld\n' | python -m transformer.infer.predict --workdir=runs/g2p --method=beam --beam_size=8
  python -m transformer.infer.predict --workdir=runs/a --ensemble=runs/b,runs/c --step=best hello

Prints one `input<TAB>output` line per input (inputs from the arguments, else one per stdin line;
each stdin line is answered as soon as it arrives, so it works as an interactive prompt).
An encoder-only run is not decoded; its line depends on model.head:
  mlm       input<TAB>the text with each marker (--mask, default `_`) filled<TAB>then one field per
            marker: its --top_k (default 5) most likely tokens as `token=probability`
  classify  input<TAB>the predicted label<TAB>its probability
  tag       input<TAB>`token/tag` for every token of the input
  python -m transformer.infer.predict --workdir=runs/bert --top_k=3 "paris is the _ of france."
An input that cannot be decoded (empty, characters outside the model's vocabulary, longer than the
model was trained on) gets a one-line `error:` message on stderr and the others are still decoded;
the exit status is 1 if any input (or the workdir) was bad, 0 otherwise. Inputs with no unknown
characters once lower-cased are lower-cased (CMUdict words are lower case).
"""

from __future__ import annotations

import itertools
import os
import select
import sys
from typing import Any, Iterable, Iterator, Sequence

from absl import flags

from transformer import cli
from transformer.data.inputs import check_input, decode_length, input_error


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


def stdin_batches(fd: int, max_batch: int = 64) -> Iterator[list[str]]:
  """The lines of file descriptor `fd` in batches of those already there: a batch never waits for
  more lines once it has one (so a terminal or a pipe gets each answer as soon as its line is
  typed), and holds at most `max_batch` (so a file is decoded in batches). Undecodable bytes are
  kept as surrogates, which check_input names."""
  buffer, eof = b"", False
  while not eof:
    while not eof and (b"\n" not in buffer or (buffer.count(b"\n") < max_batch
                                               and select.select([fd], [], [], 0)[0])):
      chunk = os.read(fd, 1 << 16)
      eof, buffer = not chunk, buffer + chunk
    *lines, buffer = buffer.split(b"\n")
    if eof and buffer:  # a last line without its line end
      lines.append(buffer)
    for i in range(0, len(lines), max_batch):
      yield [_text(line) for line in lines[i:i + max_batch]]


def _text(line: bytes) -> str:
  """One input line as text: UTF-8, undecodable bytes as surrogates, without its line end."""
  return line.rstrip(b"\r").decode("utf-8", errors="surrogateescape")


def main(argv: Sequence[str] | None = None, stdin: Any = None) -> int:
  """Runs the command line; returns the exit status. Inputs come from the arguments, else from
  `stdin` (a text stream, in batches of 64 lines), else from this process's standard input, each
  line answered as soon as it arrives (stdin_batches)."""
  args, inputs = cli.parse_own_flags("python -m transformer.infer.predict", _define,
                                     sys.argv[1:] if argv is None else argv)
  if inputs:
    batches: Iterable[list[str]] = [inputs]
  elif stdin is not None:
    lines = (line.rstrip("\n") for line in stdin)
    batches = iter(lambda: list(itertools.islice(lines, 64)), [])
  else:
    batches = stdin_batches(sys.stdin.fileno())
  from absl import logging  # pylint: disable=g-import-not-at-top  (after --help, as api)
  cli.quiet_backends()
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # keep stderr for our one-line messages (TFDS is chatty)
  try:
    return _predict(args, batches)
  except Exception as e:  # pylint: disable=broad-except  (cli.error_line decides)
    # The library's own errors (ConfigError, CheckpointError, bad options) are ValueErrors.
    line = cli.error_line(e, (ValueError, OSError))
    if line is None:
      raise
    print(f"error: {line}", file=sys.stderr)
    return 1
  finally:  # a caller in the same process (a notebook, a test) keeps its own logging
    logging.set_verbosity(verbosity)


def _predict(args: flags.FlagValues, batches: Iterable[list[str]]) -> int:
  """Restores the run, then checks each batch of inputs and prints its `input<TAB>output` lines
  (flushed); the exit status."""
  from transformer.infer import api  # pylint: disable=g-import-not-at-top  (after --help: JAX is slow)
  step = int(args.step) if args.step.lstrip("-").isdigit() else args.step
  run = api.restore([args.workdir, *filter(None, args.ensemble.split(","))], step)
  options = dict(method=args.method, beam_size=args.beam_size, length_penalty=args.length_penalty,
                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                 max_decode_len=args.max_decode_len)
  answer = _predict_encoder if run.config.model.arch == "encoder_only" else _predict_decoder
  status, first = 0, 1
  for texts in batches:
    batch_status = answer(run, args, texts, options, first)
    sys.stdout.flush()
    if batch_status == 2:  # bad options: every batch would fail the same way
      return 1
    status, first = max(status, batch_status), first + len(texts)
  return status


def _predict_decoder(run: Any, args: flags.FlagValues, texts: list[str],
                     options: dict[str, Any], first: int) -> int:
  """Decodes one batch of inputs (numbered from `first`) and prints their lines; 0, 1 if an input
  was bad, 2 if the options are."""
  # 0 for an LM: its continuation gets what fits after the prompt (max_target_len is the context).
  max_decode_len = decode_length(run, args.max_decode_len)
  good, status = [], 0
  for n, text in enumerate(texts, start=first):
    error, cleaned = check_input(run, text, max_decode_len)
    if error:
      print(f"error: {input_error(n, text, error)}", file=sys.stderr)
      status = 1
    else:
      good.append((text, cleaned))
  if good:
    try:
      outputs = run.generate_text([c for _, c in good], seed=args.seed, **options)
    except ValueError as e:  # bad decoding options: one line naming the option
      print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
      return 2
    for (text, _), output in zip(good, outputs):
      print(f"{text.strip()}\t{output}")
  return status


def _shown_token(token: str) -> str:
  """A filler as printed: itself, or its repr when empty or with whitespace (a space token)."""
  return token if token and not any(c.isspace() for c in token) else repr(token)


def _predict_encoder(run: Any, args: flags.FlagValues, texts: list[str],
                     options: dict[str, Any], first: int) -> int:
  """An encoder-only run's lines for one batch of inputs (numbered from `first`), by model.head:
  'mlm' input<TAB>filled<TAB>one field per marker of --top_k `token=probability` fillers;
  'classify' input<TAB>label<TAB>probability; 'tag' input<TAB>token/tag per token. 0, 1 if an
  input was bad, 2 if the options are."""
  head = run.config.model.head
  allowed = {"top_k"} if head == "mlm" else set()
  bad = next((k for k, v in options.items() if v is not None and k not in allowed), None)
  if bad:
    print(f"error: --{bad} is a decoding option; this run is encoder-only (model.head={head!r}), "
          "which is not decoded", file=sys.stderr)
    return 2
  good, status = [], 0
  for n, text in enumerate(texts, start=first):
    error, cleaned = check_input(run, text, 0, mask=args.mask if head == "mlm" else "")
    if error:
      print(f"error: {input_error(n, text, error)}", file=sys.stderr)
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
      return 2
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
