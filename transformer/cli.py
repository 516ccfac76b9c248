"""What the entry points share: absl flag parsing whose every failure is one line.

absl and ml_collections report a bad flag as a traceback, or as a wrapped message that loses the
culprit: a config file's own `get_config` error becomes "Error whilst parsing config file:" followed
by a traceback. `parse_flags` turns each failure into one line naming the flag, config key or file
(and line), printed as `error: ...` with exit status 1. Importing this module does not import JAX,
so `--help` and flag errors stay fast.
"""

from __future__ import annotations

import difflib
import logging as pylogging
import os
import sys
import traceback
from typing import Callable, NoReturn, Sequence

from absl import flags
from absl import logging
import ml_collections

from transformer import schema
from transformer.sweeps import flat_items

_WRAPPED = "Error whilst parsing config file"  # ml_collections' wrapper of a config file's error
# Libraries whose logs below these levels are noise on a terminal: orbax logs every save, XLA its
# missing TPU/GPU backends, TFDS every dataset it opens (with a warning for each custom config).
_QUIET_BELOW = {"orbax": pylogging.WARNING, "xla_bridge": pylogging.WARNING,
                "tensorflow_datasets": pylogging.ERROR}


def fail(message: str) -> NoReturn:
  """Prints `error: <message>` (its first line) to stderr and exits with status 1."""
  first = (str(message).strip().splitlines() or [""])[0]
  print(f"error: {first}", file=sys.stderr)
  sys.exit(1)


def quiet_logging() -> None:
  """Keeps our INFO logs and everyone's warnings, except the chatter of orbax, XLA and TFDS."""
  logging.get_absl_handler().addFilter(lambda r: all(
      r.levelno >= level for name, level in _QUIET_BELOW.items() if name in r.pathname))


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
  known = flat_items(schema.get_config())
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


def parse_own_flags(prog: str, define: Callable[[flags.FlagValues], None],
                    argv: Sequence[str]) -> tuple[flags.FlagValues, list[str]]:
  """The absl flags `define(flag_values)` declares, parsed from `argv` into a FlagValues of their
  own (so a `main(argv)` runs again in one process), and the positional arguments. --help prints
  them and exits 0; a bad flag is one line `error: ... (see --help)`, exit status 2."""
  flag_values = flags.FlagValues()
  define(flag_values)
  if "--help" in argv or "-h" in argv:
    print(f"usage: {prog} [--flag=value ...] [args]\n{flag_values.get_help()}")
    sys.exit(0)
  try:
    rest = flag_values([prog, *argv])
  except flags.Error as e:
    message = flag_error(e, argv)
    print(f"error: {message}{'' if '--help' in message else ' (see --help)'}", file=sys.stderr)
    sys.exit(2)
  return flag_values, rest[1:]


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flag parsing (`flags_parser` of app.run); a bad flag or argument is one line, exit 1."""
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
