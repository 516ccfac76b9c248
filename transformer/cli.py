"""What the entry points share: every failure they expect is one line, `error: ...`, exit 1
(`parse_flags` / `parse_own_flags` for flags and config files, `one_line_errors` for the library's
errors and failures of the machine or of files); a bug keeps its traceback. `run` is app.run with
these, and ends quietly when the output pipe closes early (`... | head`). No JAX import here."""

import contextlib
import difflib
import errno
import itertools
import logging as pylogging
import os
import re
import sys
import textwrap
import traceback
import warnings
from typing import Any, Callable, Iterator, NoReturn, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections

from transformer import keyspec, schema
from transformer.config import integral_override

_WRAPPED = "Error whilst parsing config file"  # ml_collections' wrapper of a config file's error
# Libraries whose logs below these levels are noise on a terminal: orbax logs every save, XLA its
# missing TPU/GPU backends, TFDS every dataset it opens (with a warning for each custom config),
# matplotlib its first font cache.
_QUIET_BELOW = {"orbax": pylogging.WARNING, "xla_bridge": pylogging.WARNING,
                "tensorflow_datasets": pylogging.ERROR, "matplotlib": pylogging.ERROR}
# JAX's guess at an accelerator whose plugin is not installed ("An NVIDIA GPU may be present on
# this machine, but ..."); a backend that is installed and fails to start still warns.
_BACKEND_GUESS = "may be present on this machine"
HELP_LINES = 60  # --help fits a screen
# The status of a program ended by a closed output pipe: that of one killed by SIGPIPE in a shell.
CLOSED_PIPE_STATUS = 128 + 13
_BACKGROUND_WRITERS = ("orbax", "asyncio")  # whose logged exceptions also reach the caller


def fail(message: str) -> NoReturn:
  """Prints `error: <message>` (its first line) to stderr and exits with status 1."""
  first = (str(message).strip().splitlines() or [""])[0]
  print(f"error: {first}", file=sys.stderr)
  sys.exit(1)


def not_backend_guess(record: pylogging.LogRecord) -> bool:
  """False for JAX's guess at an accelerator whose plugin is not installed."""
  return _BACKEND_GUESS not in record.getMessage()


def quiet_backends() -> None:
  """Mutes JAX's accelerator guesses whichever handler prints JAX's logs (absl's or Python's)."""
  pylogging.getLogger("jax._src.xla_bridge").addFilter(not_backend_guess)


def quiet_logging() -> None:
  """Keeps our INFO logs and everyone's warnings, as plain lines ('warning: ...'), except library
  chatter and the tracebacks of a failed background write (its error reaches the caller, reported
  in one line)."""

  def keep(r: pylogging.LogRecord) -> bool:
    chatter = any(name in r.pathname and r.levelno < level for name, level in _QUIET_BELOW.items())
    background = r.exc_info and any(name in r.pathname for name in _BACKGROUND_WRITERS)
    r.prefix = "" if r.levelno < pylogging.WARNING else f"{r.levelname.lower()}: "
    return not_backend_guess(r) and not chatter and not background

  logging.get_absl_handler().addFilter(keep)
  logging.get_absl_handler().setFormatter(pylogging.Formatter("%(prefix)s%(message)s"))
  quiet_backends()
  # The coroutines of a failed background write that its closed loop never ran: Python names
  # each at exit, after the one line that reported the failure.
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)


# Hints for a failed file operation, by errno: what to do about it.
_ERRNO_HINTS = {
    errno.ENOSPC: "free some space, then rerun the same command (committed checkpoints are kept)",
    errno.EDQUOT: "free some space, then rerun the same command (committed checkpoints are kept)",
    errno.EFBIG: "a file size limit (ulimit -f) stopped the write; committed checkpoints are kept",
    errno.EACCES: "the directory must be writable by this user",
    errno.EPERM: "the directory must be writable by this user",
    errno.EROFS: "give a --workdir on a writable file system",
}
# tensorstore (orbax's writer) reports a failed file operation as a ValueError whose text carries
# the path in quotes and the errno as [os_error_code=N].
_OS_ERROR_CODE = re.compile(r"\[os_error_code='?(\d+)'?\]")
_QUOTED_PATH = re.compile(r'"((?:/|gs://)[^"]+)"')


# What a failure of the machine or of a file arrives as, possibly wrapped in one another: XLA's
# JaxRuntimeError and array_record's errors are RuntimeErrors, tensorstore's are ValueErrors.
_ENVIRONMENT_TYPES = (OSError, ValueError, RuntimeError)


def _environment_chain(error: BaseException) -> list[BaseException]:
  """`error` and what it was raised from or during, up to the first exception not of
  _ENVIRONMENT_TYPES (a KeyError raised while handling a missing file is a bug)."""
  return list(itertools.takewhile(lambda e: isinstance(e, _ENVIRONMENT_TYPES), _chain(error)))


def _file_failure(error: BaseException) -> tuple[int, str, str] | None:
  """(errno, path, reason) of a failed file operation in `error`'s chain, or None."""
  for e in _environment_chain(error):
    if isinstance(e, OSError) and e.errno:
      return e.errno, os.fspath(e.filename or ""), e.strerror or os.strerror(e.errno)
    if found := _OS_ERROR_CODE.search(str(e)):
      code, paths = int(found.group(1)), _QUOTED_PATH.findall(str(e))
      return code, paths[0] if paths else "", os.strerror(code)
  return None


def environment_error(error: BaseException, model_config: Callable[[], Any] | None = None
                      ) -> str | None:
  """One line for a failure of the machine or of a file, wherever in `error`'s chain, or None: a
  failed file operation (naming file, reason, what to do), out of memory (with the size of the
  model `model_config()` returns, when given) or corrupt prepared data."""
  texts = [str(e) for e in _environment_chain(error)]
  # First: tensorstore reports a full disk as RESOURCE_EXHAUSTED too, with the errno beside it.
  if (failed := _file_failure(error)) is not None:
    code, path, reason = failed
    hint = _ERRNO_HINTS.get(code)
    return f"{path or 'a file'}: {reason}" + (f"; {hint}" if hint else "")
  if (oom := next((t for t in texts if "RESOURCE_EXHAUSTED" in t), None)) is not None:
    size = ""
    if model_config is not None:
      try:
        from transformer.model import models  # pylint: disable=g-import-not-at-top  (imports JAX)
        n = models.parameter_count(model_config())
        size = f"; the model has {n:,} parameters ({n * 4 / 2**30:,.1f} GiB as float32)"
      except Exception:  # pylint: disable=broad-except  (the size is a courtesy)
        pass
    first = oom.strip().splitlines()[0][:300]
    return (f"out of memory: {first}{size}; make the model (model.d_model, model.mlp_dim, "
            "layers) or data.batch_size smaller")
  if (riegeli := next((t for t in texts if "Riegeli" in t), None)) is not None:
    return (f"corrupt prepared data ({riegeli.strip().splitlines()[0][:200]}); delete the "
            "prepared dataset's directory under data.data_dir and rerun to prepare it again")
  return None


def error_line(error: BaseException, ours: tuple[type[BaseException], ...] = (),
               model_config: Callable[[], Any] | None = None) -> str | None:
  """The one line reporting `error` (environment_error's, else the first line of one of `ours`,
  the library's one-line errors), or None: a bug, whose traceback is wanted, or a closed output
  pipe, which `closed_pipe_is_quiet` ends."""
  if isinstance(error, BrokenPipeError):  # the output pipe closed: `closed_pipe_is_quiet`'s
    return None
  line = environment_error(error, model_config)
  if line is None and isinstance(error, ours):
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return line


@contextlib.contextmanager
def one_line_errors(*ours: type[BaseException], model_config: Callable[[], Any] | None = None
                    ) -> Iterator[None]:
  """Ends the program with `error: <error_line>` (status 1) where that reports; else raises."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except  (error_line decides)
    line = error_line(e, ours, model_config)
    if line is None:
      raise
    fail(line)


def _chain(error: BaseException) -> list[BaseException]:
  """`error` and the exceptions it was raised from or during, outermost first."""
  out = [error]
  while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and nxt not in out:
    out.append(nxt)
  return out


def _config_path(argv: Sequence[str]) -> str:
  """The file of a `--config=path[:arg]` argument, or ''."""
  return next((a.split("=", 1)[1].split(":", 1)[0] for a in argv if a.startswith("--config=")), "")


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
  # The exception get_config raised, not ml_collections' rewrap of it.
  wrapped = [i for i, e in enumerate(chain[:-1]) if str(e).startswith(_WRAPPED)]
  chain = chain[wrapped[0] + 1:] if wrapped else chain
  for e in reversed(chain):  # the innermost exception raised inside the config file
    if (line := _line_in(e, path)) is not None:
      msg = (getattr(e, "msg", None) if isinstance(e, SyntaxError) else None) or str(e)
      msg = (msg.strip().splitlines() or [type(e).__name__])[0]
      if path in msg or os.path.basename(path) in msg:  # it names its file already
        return msg
      return f"{path}:{line}: {type(e).__name__}: {msg}"
  return None


def _unknown_override(argv: Sequence[str]) -> str | None:
  """`--config.KEY=...` whose KEY is not in configs/base.py, as a one-line message, or None."""
  known = keyspec.flat_items(schema.get_config())
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
  if found := _config_file_message(error, _config_path(argv)):
    return found
  if isinstance(error, flags.UnrecognizedFlagError) and not error.flagname.startswith("config."):
    return f"--{error.flagname}: unknown flag (see --help)"
  text = " ".join(str(error).replace("\\n", " ").split())
  if "Overriding config is not allowed" in text:
    return ("--config: eval.py takes no config file (the run's saved config.json is used); "
            "override single keys with --config.KEY=VALUE")
  unknown_key = (AttributeError, KeyError, flags.UnrecognizedFlagError)
  if isinstance(error, unknown_key) and (found := _unknown_override(argv)):
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
  """The --help screen: `doc` (its first paragraph past HELP_LINES), the flags, where keys live."""
  lines = [line for f in sorted(main_flags, key=lambda f: f.name) for line in _flag_lines(f)]
  if any(f.name == "config" for f in main_flags):
    lines.append("  --config.KEY=VALUE: override one config key, e.g. "
                 "--config.eval.decode.beam_size=4")
  tail = ["", "Every config key is documented in docs/config.md;",
          f"`python {script} --help_keys` lists them all with their defaults and allowed values",
          "(--helpfull: absl's own flags too)."]
  text = (doc or "").strip()
  if len(text.splitlines()) + len(lines) + len(tail) + 2 > HELP_LINES:
    text = text.split("\n\n")[0] + f"\n(More in the docstring of {script}.)"
  return "\n".join([text, "", "flags:", *lines, *tail])


def _allowed(key: str, meaning: str = "") -> str:
  """What `key` accepts (` (one of a|b|c)`, ` (> 0)`), unless its `meaning` names each choice."""
  if (declared := schema.KEYS.get(key)) is None:
    return ""
  if choices := declared.choices():
    if all(re.search(rf"(^|[\s|]){re.escape(str(c))}\b", meaning) for c in choices if c != ""):
      return "" if "" not in choices else " (or '')"
    return " (one of " + "|".join(str(c) if c != "" else repr(c) for c in choices) + ")"
  return f" ({declared.range})" if declared.range else ""


def key_lines(config: ml_collections.ConfigDict) -> list[str]:
  """Every key of `config` with its default, meaning and allowed values or range, one per line,
  under its section."""
  out, section = [], None
  for key, value in sorted(keyspec.flat_items(config).items(), key=lambda kv: kv[0].rpartition(".")[::2]):
    head, _, name = key.rpartition(".")
    if head != section:
      out.append(f"{head}:" if head else "(top level):")
      section = head
    meaning = schema.KEYS[key].meaning if key in schema.KEYS else ""
    meaning += _allowed(key, meaning)
    out.append(f"  {name} = {value!r}" + (f"  # {meaning.strip()}" if meaning else ""))
  return out


def _help(argv: Sequence[str]) -> None:
  """Answers --help (one screen), --helpfull (absl's list) or --help_keys (every key of --config,
  its value there) and exits 0; else returns."""
  args = argv[1:]
  script = os.path.basename(argv[0])
  if "--help_keys" in args:
    given = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), "")
    try:  # the values of the --config file (its get_config(arg)), else the defaults
      config = flags.FLAGS["config"].parser.parse(given) if given else schema.get_config()
      config.keys()  # ml_collections' stand-in for a file that failed to load raises
    except Exception as e:  # pylint: disable=broad-except  (a config file raises anything)
      fail(flag_error(e, args))
    print(f"Every config key: its value in {given or 'configs/base.py'}, meaning, allowed values.")
    print("\n".join(key_lines(config)))
    sys.exit(0)
  if "--helpfull" in args:  # absl's list: every module's flags, absl's own included
    print(flags.FLAGS.get_help())
    sys.exit(0)
  if any(a in ("--help", "-h", "-?", "--helpshort") for a in args):
    main = sys.modules.get("__main__")
    print(help_text(script, getattr(main, "__doc__", "") or "",
                    flags.FLAGS.get_key_flags_for_module(argv[0])))
    sys.exit(0)


def own_help_text(prog: str, doc: str, flag_values: flags.FlagValues) -> str:
  """The --help screen of a command with flags of its own: usage, `doc` (what it does, examples),
  its flags, one line each."""
  own = {f for module, defined in flag_values.flags_by_module_dict().items()
         if module != "absl.flags" for f in defined}  # absl.flags: --flagfile, --undefok
  lines = [line for f in sorted(own, key=lambda f: f.name) for line in _flag_lines(f)]
  return "\n".join([f"usage: {prog} [--flag=value ...] [args]", "", (doc or "").strip(), "",
                    "flags:", *lines, "", "(--helpfull: absl's own flags too.)"])


def parse_own_flags(prog: str, define: Callable[[flags.FlagValues], None],
                    argv: Sequence[str], doc: str = "") -> tuple[flags.FlagValues, list[str]]:
  """(the flags `define(flag_values)` declares, parsed from `argv` into a FlagValues of their own
  so that `main(argv)` can run again, the positional arguments); a bad flag exits 2. --help
  prints `own_help_text` (with `doc`), --helpfull absl's list; both exit 0."""
  flag_values = flags.FlagValues()
  define(flag_values)
  if "--helpfull" in argv:
    print(f"usage: {prog} [--flag=value ...] [args]\n{flag_values.get_help()}")
    sys.exit(0)
  if "--help" in argv or "-h" in argv:
    print(own_help_text(prog, doc, flag_values))
    sys.exit(0)
  try:
    rest = flag_values([prog, *argv])
  except flags.Error as e:
    message = flag_error(e, argv)
    print(f"error: {message}{'' if '--help' in message else ' (see --help)'}", file=sys.stderr)
    sys.exit(2)
  return flag_values, rest[1:]


def parse_flags(argv: Sequence[str]) -> list[str]:
  """app.run's `flags_parser`: a bad flag or argument is one line, exit 1; --help* exit 0."""
  path = _config_path(argv[1:])
  if path and not os.path.isfile(path):
    fail(f"--config file {path} not found")
  _help(argv)
  try:  # an int key's integral value ('1e3') as an int, another one line (integral_override)
    rest = flags.FLAGS([argv[0], *map(integral_override, argv[1:])])
    config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
      getattr(config, "keys", None)  # ml_collections' stand-in for a file that failed to load raises
      fail(f"--config: get_config() of {path} returned {type(config).__name__}, not a ConfigDict")
  except Exception as e:  # pylint: disable=broad-except  (absl and config files raise anything)
    if path and "--config must have a value other than None" in str(e):  # get_config gave None
      fail(f"{path}: get_config() returned None (it must return an ml_collections.ConfigDict)")
    fail(flag_error(e, argv[1:]))
  if len(rest) > 1:
    fail(f"unexpected arguments: {' '.join(rest[1:])} (flags are --name=value)")
  return rest


@contextlib.contextmanager
def closed_pipe_is_quiet() -> Iterator[None]:
  """A program's body: when its output pipe closes early (`... | head -1`), it ends with status
  CLOSED_PIPE_STATUS and no traceback (Python ignores SIGPIPE, so a write raises
  BrokenPipeError; see the note on SIGPIPE in the docs of Python's `signal` module)."""
  try:
    try:
      yield
    finally:  # what is still buffered fails here, not in Python's flush at exit
      sys.stdout.flush()
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit too
    sys.exit(CLOSED_PIPE_STATUS)


def run(main: Callable[[list[str]], Any]) -> None:
  """app.run(main) with `parse_flags`, quiet on a closed pipe."""
  with closed_pipe_is_quiet():
    app.run(main, flags_parser=parse_flags)
