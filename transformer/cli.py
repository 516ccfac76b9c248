"""What train.py, eval.py and sweep.py share: flag parsing whose every failure is one line.

absl and ml_collections report a bad flag as a traceback, or as a wrapped message that loses the
culprit: a config file's own `get_config` error becomes "Error whilst parsing config file:" followed
by a traceback. `parse_flags` turns each failure into one line naming the flag, config key or file
(and line), printed as `error: ...` with exit status 1. `--help` prints one screen (the tool's
first docstring paragraph, its own flags, where the config keys are documented) and exits 0;
`--help_keys` lists every config key with its default. Importing this module does not import JAX,
so `--help` and flag errors stay fast.
"""

from __future__ import annotations

import difflib
import logging as pylogging
import os
import sys
import textwrap
import traceback
from typing import NoReturn, Sequence

from absl import flags
from absl import logging
import ml_collections

from transformer import defaults
from transformer.sweeps import flat_items

_WRAPPED = "Error whilst parsing config file"  # ml_collections' wrapper of a config file's error
# Libraries whose logs below these levels are noise on a terminal: orbax logs every save, XLA its
# missing TPU/GPU backends, TFDS every dataset it opens (with a warning for each custom config).
_QUIET_BELOW = {"orbax": pylogging.WARNING, "xla_bridge": pylogging.WARNING,
                "tensorflow_datasets": pylogging.ERROR}
# JAX's guesses at accelerators whose plugin is not installed ("An NVIDIA GPU may be present on
# this machine, but a CUDA-enabled jaxlib is not installed. Falling back to cpu."): noise on a CPU.
# A backend that is installed and fails to start still warns.
_BACKEND_GUESS = "may be present on this machine"
_JAX_BACKENDS_LOGGER = "jax._src.xla_bridge"
HELP_FLAGS = ("--help", "-h", "-?", "--helpshort")
KEYS_FLAG = "--help_keys"
HELP_LINES = 60  # --help fits a screen


def fail(message: str) -> NoReturn:
  """Prints `error: <message>` (its first line) to stderr and exits with status 1."""
  first = (str(message).strip().splitlines() or [""])[0]
  print(f"error: {first}", file=sys.stderr)
  sys.exit(1)


def keep_record(record: pylogging.LogRecord) -> bool:
  """False for library chatter: orbax, XLA, TFDS below their levels; JAX's accelerator guesses."""
  return not_backend_guess(record) and all(
      record.levelno >= level for name, level in _QUIET_BELOW.items() if name in record.pathname)


def not_backend_guess(record: pylogging.LogRecord) -> bool:
  """False for JAX's guess at an accelerator whose plugin is not installed."""
  return _BACKEND_GUESS not in record.getMessage()


def quiet_backends() -> None:
  """Mutes JAX's accelerator guesses whichever handler prints JAX's logs (absl's or Python's)."""
  pylogging.getLogger(_JAX_BACKENDS_LOGGER).addFilter(not_backend_guess)


def quiet_logging() -> None:
  """Keeps our INFO logs and everyone's warnings, except the chatter `keep_record` drops."""
  logging.get_absl_handler().addFilter(keep_record)
  quiet_backends()


def _chain(error: BaseException) -> list[BaseException]:
  """`error` and the exceptions it was raised from or during, outermost first."""
  out = [error]
  while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and nxt not in out:
    out.append(nxt)
  return out


def _config_path(argv: Sequence[str]) -> str:
  """The file of a `--config=path[:arg]` argument, or ''."""
  for arg in argv:
    if arg.startswith("--config="):
      return arg.split("=", 1)[1].split(":", 1)[0]
  return ""


def _line_in(error: BaseException, path: str) -> int | None:
  """The line of `path` (a config file) deepest in `error`'s traceback, or None."""
  same = lambda f: bool(f) and os.path.exists(f) and os.path.samefile(f, path)  # noqa: E731
  if isinstance(error, SyntaxError) and same(error.filename):
    return error.lineno
  lines = [line for frame, line in traceback.walk_tb(error.__traceback__)
           if same(frame.f_code.co_filename)]
  return lines[-1] if lines else None


def _config_file_message(error: BaseException, path: str) -> str | None:
  """The config file's own error as `path[:line]: message`, if `error` came from loading it."""
  if not path or not os.path.isfile(path):
    return None
  chain = _chain(error)
  for i, e in enumerate(chain):
    if str(e).startswith(_WRAPPED) and i + 1 < len(chain):
      chain = chain[i + 1:]  # the exception get_config raised, not ml_collections' rewrap of it
      break
  for e in reversed(chain):  # the innermost exception raised inside the config file
    line = _line_in(e, path)
    if line is not None:
      msg = (getattr(e, "msg", None) if isinstance(e, SyntaxError) else None) or str(e)
      msg = (msg.strip().splitlines() or [type(e).__name__])[0]
      if path in msg or os.path.basename(path) in msg:  # it names its file already
        return msg
      return f"{path}:{line}: {type(e).__name__}: {msg}"
  return None


def _unknown_override(argv: Sequence[str]) -> str | None:
  """`--config.KEY=...` whose KEY is not in configs/base.py, as a one-line message, or None."""
  known = flat_items(defaults.get_config())
  sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
  for arg in argv:
    if arg.startswith("--config."):
      key = arg[len("--config."):].split("=", 1)[0]
      if key not in known:
        what = "a section, not a key" if key in sections else "not a key of configs/base.py"
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f"; did you mean --config.{close[0]}?" if close else ""
        return f"--config.{key}: unknown config key ({what}){hint}"
  return None


def flag_error(error: BaseException, argv: Sequence[str]) -> str:
  """One line naming the culprit of an exception raised while parsing the flags in `argv`."""
  path = _config_path(argv)
  found = _config_file_message(error, path)
  if found:
    return found
  if isinstance(error, flags.UnrecognizedFlagError) and not error.flagname.startswith("config."):
    return f"--{error.flagname}: unknown flag (see --help)"
  text = " ".join(str(error).replace("\\n", " ").split())
  if "Overriding config is not allowed" in text:
    return ("--config: eval.py takes no config file (the run's saved config.json is used); "
            "override single keys with --config.KEY=VALUE")
  if any(a.startswith("--config.") for a in argv) and isinstance(
      error, (AttributeError, KeyError, flags.UnrecognizedFlagError)):
    found = _unknown_override(argv)
    if found:
      return found
  if "must have a value other than None" in text:
    name = text.split("Flag --", 1)[-1].split(" ", 1)[0]
    return f"--{name} is required"
  if text.startswith("flag --"):
    text = text[len("flag "):]  # absl's "flag --x=y: why" is already the one line we want
  return text or type(error).__name__


def _flag_lines(flag: flags.Flag) -> list[str]:
  """`--name: help (default: x)`, wrapped to 100 columns."""
  default = flag.default
  shown = "" if default in (None, "", []) or isinstance(default, ml_collections.ConfigDict) else (
      f" (default: {default!r})" if isinstance(default, str) else f" (default: {default})")
  return textwrap.wrap(f"--{flag.name}: {flag.help}{shown}", 100, initial_indent="  ",
                       subsequent_indent="      ")


def help_text(script: str, doc: str, main_flags: Sequence[flags.Flag]) -> str:
  """The --help screen: the docstring (its first paragraph if all of it does not fit in
  HELP_LINES), the script's own flags, and where every config key is documented."""
  lines = [line for f in sorted(main_flags, key=lambda f: f.name) for line in _flag_lines(f)]
  if any(f.name == "config" for f in main_flags):
    lines.append("  --config.KEY=VALUE: override one config key, e.g. "
                 "--config.eval.decode.beam_size=4")
  tail = ["", "Every config key is documented in docs/config.md;",
          f"`python {script} {KEYS_FLAG}` lists them all with their defaults."]
  text = (doc or "").strip()
  if len(text.splitlines()) + len(lines) + len(tail) + 2 > HELP_LINES:
    text = text.split("\n\n")[0] + f"\n(More in the docstring of {script}.)"
  return "\n".join([text, "", "flags:", *lines, *tail])


def key_lines(config: ml_collections.ConfigDict) -> list[str]:
  """Every key of `config` with its default, one per line, indented under its section."""
  out, section = [], None
  for key, value in sorted(flat_items(config).items(), key=lambda kv: kv[0].rpartition(".")[::2]):
    head, _, name = key.rpartition(".")
    if head != section:
      out.append(f"{head}:" if head else "(top level):")
      section = head
    out.append(f"  {name} = {value!r}")
  return out


def _help(argv: Sequence[str]) -> None:
  """Answers --help (one screen) or --help_keys (every config key) and exits 0; else returns."""
  args = argv[1:]
  script = os.path.basename(argv[0])
  if KEYS_FLAG in args:
    print("Every config key and its default (configs/base.py); what each means: docs/config.md.")
    print("\n".join(key_lines(defaults.get_config())))
    sys.exit(0)
  if any(a in HELP_FLAGS for a in args):
    main = sys.modules.get("__main__")
    print(help_text(script, getattr(main, "__doc__", "") or "",
                    flags.FLAGS.get_key_flags_for_module(argv[0])))
    sys.exit(0)


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flag parsing (`flags_parser` of app.run); a bad flag or argument is one line, exit 1;
  --help and --help_keys print their screens and exit 0."""
  _help(argv)
  path = _config_path(argv[1:])
  if path and not os.path.isfile(path):
    fail(f"--config file {path} not found")
  try:
    rest = flags.FLAGS(argv)
    config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
      getattr(config, "keys", None)  # ml_collections' stand-in for a file that failed to load raises
      fail(f"--config: get_config() of {path} returned {type(config).__name__}, not a ConfigDict")
  except Exception as e:  # pylint: disable=broad-except  (absl and config files raise anything)
    fail(flag_error(e, argv[1:]))
  if len(rest) > 1:
    fail(f"unexpected arguments: {' '.join(rest[1:])} (flags are --name=value)")
  return rest
