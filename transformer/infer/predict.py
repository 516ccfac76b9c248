r"""Decodes words or sentences with a trained run from the command line.

  python -m transformer.infer.predict --workdir=runs/g2p --method=beam --beam_size=8 hello world
  python -m transformer.infer.predict --workdir=runs/a --ensemble=runs/b,runs/c --step=best hello

Prints `input<TAB>output` per input (the arguments, else stdin lines, each answered as soon as
it arrives; on a terminal it prompts for each); encoder-only runs print the filled text and each
--mask marker's fillers, the label and its probability, or `token/tag` per token. A bad input is
one `error:` line, and status 1; no input at all is one line saying what it expects, status 2.
"""

import itertools
import os
import select
import sys
from typing import Any, Iterable, Iterator, Sequence

from absl import flags

from transformer import cli, keyspec
from transformer.data.inputs import check_input, decode_length, input_error


def _define(f: flags.FlagValues) -> None:
  flags.DEFINE_string("workdir", None, "the training run's workdir", flag_values=f)
  flags.mark_flag_as_required("workdir", flag_values=f)
  flags.DEFINE_string("step", "latest", "an integer, 'latest' or 'best'", flag_values=f)
  flags.DEFINE_string("ensemble", "", "other runs' workdirs, comma-separated: decode with the "
                      "ensemble of these and --workdir's (the mean of their probabilities; each "
                      "at --step)", flag_values=f)
  flags.DEFINE_string("method", None, "a decoding method, a name of eval.decode.method's table "
                      "(docs/config.md); default: the run's eval.decode.method", flag_values=f)
  flags.DEFINE_integer("beam_size", None, "beams", flag_values=f)
  flags.DEFINE_float("length_penalty", None, "GNMT alpha", flag_values=f)
  flags.DEFINE_float("temperature", None, "sampling temperature", flag_values=f)
  flags.DEFINE_integer("top_k", None, "sampling: the k likeliest", flag_values=f)
  flags.DEFINE_float("top_p", None, "sampling: nucleus mass", flag_values=f)
  flags.DEFINE_integer("max_decode_len", None, "longest output", flag_values=f)
  flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=f)
  flags.DEFINE_string("mask", "_", "an encoder-only masked LM's marker to fill (each one "
                      "[MASK]); --top_k fillers are printed per marker (default 5)", flag_values=f)


def stdin_batches(fd: int, max_batch: int = 64, first: bytes = b"") -> Iterator[list[str]]:
  """The lines of file descriptor `fd` (after the bytes `first`, read from it before) in batches
  of at most `max_batch` of those already there: a batch never waits for more lines once it has
  one. Undecodable bytes become surrogates."""
  buffer, eof = first, False
  while not eof:
    while not eof and (b"\n" not in buffer or (buffer.count(b"\n") < max_batch
                                               and select.select([fd], [], [], 0)[0])):
      chunk = os.read(fd, 1 << 16)
      eof, buffer = not chunk, buffer + chunk
    *lines, buffer = buffer.split(b"\n")
    if eof and buffer:  # a last line without its line end
      lines.append(buffer)
    texts = [line.rstrip(b"\r").decode("utf-8", errors="surrogateescape") for line in lines]
    for i in range(0, len(texts), max_batch):
      yield texts[i:i + max_batch]


PROG = "python -m transformer.infer.predict"
PROMPT = "input> "  # on a terminal, before each line read
NO_INPUT = ("no input: give the inputs as arguments (`{prog} --workdir=W hello world`) or one per "
            "line on standard input")


def prompted_lines(stream: Any, prompt: str = PROMPT) -> Iterator[list[str]]:
  """The lines a person types at a terminal, one batch each, after `prompt` on stderr (stdout
  stays for the answers); Ctrl-D ends them."""
  while True:
    print(prompt, end="", file=sys.stderr, flush=True)
    line = stream.readline()
    if not line:
      print(file=sys.stderr)  # the shell's prompt on a line of its own
      return
    yield [line.rstrip("\n")]


def main(argv: Sequence[str] | None = None, stdin: Any = None) -> int:
  """Runs the command line on the arguments, else `stdin`, else standard input; the exit status."""
  args, inputs = cli.parse_own_flags(PROG, _define, sys.argv[1:] if argv is None else argv,
                                     __doc__)
  if inputs:
    batches: Iterable[list[str]] = [inputs]
  elif stdin is not None:
    lines = (line.rstrip("\n") for line in stdin)
    batches = iter(lambda: list(itertools.islice(lines, 64)), [])
  elif sys.stdin.isatty():
    print("one input per line; Ctrl-D ends", file=sys.stderr)
    batches = prompted_lines(sys.stdin)
  else:
    fd = sys.stdin.fileno()
    # Input already at its end (`< /dev/null`, an empty pipe) is told before the restore.
    first = os.read(fd, 1 << 16) if select.select([fd], [], [], 0)[0] else None
    if first == b"":
      print(f"error: {NO_INPUT.format(prog=PROG)}", file=sys.stderr)
      return 2
    batches = stdin_batches(fd, first=first or b"")
  from absl import logging  # pylint: disable=g-import-not-at-top  (after --help, as api)
  cli.quiet_backends()
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # keep stderr for our one-line messages (TFDS is chatty)
  try:
    return _predict(args, batches)
  except KeyboardInterrupt:  # Ctrl-C at the prompt (or while decoding): out, as a shell expects
    print(file=sys.stderr)
    return 130
  except Exception as e:  # pylint: disable=broad-except  (cli.error_line decides)
    line = cli.error_line(e, (ValueError, OSError))
    if line is None:
      raise
    print(f"error: {line}", file=sys.stderr)
    return 1
  finally:  # a caller in the same process (a notebook, a test) keeps its own logging
    logging.set_verbosity(verbosity)


def _predict(args: flags.FlagValues, batches: Iterable[list[str]]) -> int:
  """Restores the run, then answers each batch of inputs; the exit status."""
  # After --help: importing JAX is slow.
  from transformer.infer import api, decoding  # pylint: disable=g-import-not-at-top
  if args.method is not None and args.method not in decoding.METHODS:  # before the restore
    print(f"error: {keyspec.one_of_message('--method', args.method, decoding.METHODS)}",
          file=sys.stderr)
    return 1
  step = int(args.step) if args.step.lstrip("-").isdigit() else args.step
  run = api.restore([args.workdir, *filter(None, args.ensemble.split(","))], step)
  options = {k: getattr(args, k) for k in ("method", "beam_size", "length_penalty", "temperature",
                                           "top_k", "top_p", "max_decode_len")}
  head = run.config.model.head if run.config.model.arch == "encoder_only" else ""
  allowed = {"top_k"} if head == "mlm" else set()
  bad = head and next((k for k, v in options.items() if v is not None and k not in allowed), None)
  # 0 for an LM: its continuation gets what fits after the prompt (max_target_len is the context).
  max_decode_len = 0 if head else decode_length(run, args.max_decode_len)
  mask = args.mask if head == "mlm" else ""
  status, first = 0, 1
  for texts in batches:
    if bad:
      print(f"error: --{bad} is a decoding option; this run is encoder-only (model.head={head!r}), "
            "which is not decoded", file=sys.stderr)
      return 1
    good = []
    for n, text in enumerate(texts, start=first):
      error, cleaned = check_input(run, text, max_decode_len, mask=mask)
      if error:
        print(f"error: {input_error(n, text, error)}", file=sys.stderr)
        status = 1
      else:
        good.append((text.strip(), cleaned))
    first += len(texts)
    try:
      columns = _answers(run, head, args, options, [c for _, c in good]) if good else []
    except ValueError as e:  # a bad option, named in one line: every batch would fail the same way
      print(f"error: {'--' if head else ''}{str(e).splitlines()[0]}", file=sys.stderr)
      return 1
    for (text, _), cols in zip(good, columns):
      print("\t".join([text, *cols]))
    sys.stdout.flush()
  if first == 1:  # not one input, not even an empty line
    print(f"error: {NO_INPUT.format(prog=PROG)}", file=sys.stderr)
    return 2
  return status


def _shown_token(token: str) -> str:
  """A filler as printed: itself, or its repr when empty or with whitespace (a space token)."""
  return token if token and not any(c.isspace() for c in token) else repr(token)


def _answers(run: Any, head: str, args: flags.FlagValues, options: dict[str, Any],
             texts: list[str]) -> list[list[str]]:
  """The output columns of each input: its decoding, or by an encoder-only run's model.head."""
  if not head:
    return [[output] for output in run.generate_text(texts, seed=args.seed, **options)]
  if head == "mlm":  # --top_k < 1: a ValueError
    fillers = run.mask_fillers(texts, k=5 if args.top_k is None else args.top_k, mask=args.mask)
    return [[f, *("  ".join(f"{_shown_token(t)}={p:.3f}" for t, p in marker) for marker in m)]
            for f, m in zip(run.fill_mask(texts, mask=args.mask), fillers)]
  if head == "classify":
    return [[label, f"{p:.4f}"] for label, p in run.classify_with_probability(texts)]
  return [[" ".join(f"{_shown_token(t)}/{g}" for t, g in tags)] for tags in run.tag(texts)]


if __name__ == "__main__":
  with cli.closed_pipe_is_quiet():
    sys.exit(main())
