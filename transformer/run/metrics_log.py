"""The one reader of a run's metrics.jsonl (training's log of `{"step", **scalars}` rows), used by
resume, compare, the sweep report and watcher, ASHA and the plots. It survives anything a log can
hold: bytes that are not UTF-8, lines that are not JSON objects (a write cut short), rows without
an integer step, values that are not numbers, lines of any length, files of any size (read line
by line). What it skips is named in one warning line per file: the file, the first such line and
how many there were. NaN and infinities are kept as floats: a reader shows them, never drops or
averages them away.
"""

import dataclasses
import json
import math
import os
from typing import Any, Iterator

from absl import logging

from transformer import files

FILE = "metrics.jsonl"
# A metrics row is a few hundred bytes; a longer line is not one (it is skipped unread).
MAX_LINE_BYTES = 1 << 20
_CHUNK = 1 << 16
_warned: set[tuple[str, int, int]] = set()  # (path, first bad line, count) already named


@dataclasses.dataclass
class Line:
  """One line of the file: its number, its bytes (without the newline; None for one over
  MAX_LINE_BYTES), the row read from it (None if it holds none) and why not."""
  number: int
  raw: bytes | None
  row: dict[str, Any] | None
  problem: str = ""


def path_of(workdir_or_file: str) -> str:
  """`<workdir>/metrics.jsonl` for a directory, else the path itself."""
  return os.path.join(workdir_or_file, FILE) if files.isdir(workdir_or_file) else workdir_or_file


def parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
  """(row, '') for a metrics row's bytes, else (None, why not); values that are not numbers
  are dropped from the row (the writer logs numbers only), NaN and infinities kept."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    return None, "bytes that are not UTF-8"
  try:
    row = json.loads(text)
  except (ValueError, RecursionError):
    return None, "not a JSON line (a write cut short?)"
  if not isinstance(row, dict):
    return None, "not a JSON object"
  step = row.get("step")
  if not isinstance(step, int) or isinstance(step, bool) or step < 0:
    return None, "no integer step"
  out: dict[str, Any] = {"step": step}
  for key, value in row.items():
    if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
      try:
        out[key] = float(value)
      except OverflowError:  # an integer too large for a float
        continue
  return out, ""


def _raw_lines(f) -> Iterator[bytes | None]:
  """The lines of binary file `f` without their newlines; None for one over MAX_LINE_BYTES
  (read past in chunks, never held whole)."""
  while True:
    line = f.readline(MAX_LINE_BYTES + 1)
    if not line:
      return
    if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
      while (chunk := f.readline(_CHUNK)) and not chunk.endswith(b"\n"):
        pass
      yield None
      continue
    yield line.rstrip(b"\r\n")


def lines(path: str) -> Iterator[Line]:
  """Every non-empty line of the metrics file at `path`, read or not ([] without the file)."""
  try:
    f = files.open_binary(path)
  except (OSError, ValueError):
    return
  with f:
    for number, raw in enumerate(_raw_lines(f), 1):
      if raw is None:
        yield Line(number, None, None, f"a line over {MAX_LINE_BYTES} bytes")
      elif raw.strip():
        row, problem = parse(raw)
        yield Line(number, raw, row, problem)


def warn_skipped(path: str, skipped: list[Line], what: str = "skipped") -> None:
  """One warning line naming `path`, the first skipped line and how many (once per process)."""
  if not skipped or (key := (path, skipped[0].number, len(skipped))) in _warned:
    return
  _warned.add(key)
  more = f" (and {len(skipped) - 1} more lines)" if len(skipped) > 1 else ""
  logging.warning("%s:%d: %s%s: %s", path, skipped[0].number, skipped[0].problem, more, what)


def read(workdir_or_file: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl (of a workdir, or the file itself), in file order; [] without
  one; lines that hold no row are named in one warning and skipped."""
  path = path_of(workdir_or_file)
  rows, skipped = [], []
  for line in lines(path):
    if line.row is None:
      skipped.append(line)
    else:
      rows.append(line.row)
  warn_skipped(path, skipped)
  return rows


def is_finite(value: Any) -> bool:
  """A number that is neither NaN nor infinite."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
