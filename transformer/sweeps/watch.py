"""A running sweep on the console: a status line per running point (its step, latest training
loss and in-training metric, ETA), read from its metrics.jsonl; a line the moment a point fails
(its exit code, its sweep.log and that log's last error line) and one when it finishes (its
result). On a terminal the status lines are redrawn in place under the other lines; elsewhere (a
log file) they are plain lines, a point's only when its logged step has moved."""

import contextlib
import json
import math
import os
import re
import shutil
import signal
import threading
from typing import Any, Callable, Sequence, TextIO

from transformer import files
from transformer.run import metrics_log
from transformer.sweeps import spec

# The in-training metric a status line shows: the first of these the point has logged.
DEV_METRICS = ("wer", "bleu", "f1", "accuracy", "loss")
# Test metrics a finished point's line shows: the first of these metrics.<split>.json holds.
TEST_METRICS = ("wer", "bleu", "bits_per_char", "bits_per_byte", "bits_per_token", "f1",
                "accuracy", "loss")
_ERROR = re.compile(r"^(error:|[\w.]*(Error|Exception|Interrupt|Exit)\b)")
_LOG_TAIL = 65536  # bytes of a failed point's log read for its last error line


def duration(seconds: float) -> str:
  """'m:ss', or 'h:mm:ss' from an hour on (as the training bar's); '?' for NaN or infinity,
  '>999:59:59' from a thousand hours on."""
  if not math.isfinite(seconds):
    return "?"
  if seconds >= 1000 * 3600:
    return ">999:59:59"
  minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def metrics_rows(workdir: str) -> list[dict[str, Any]]:
  """The rows of `workdir`/metrics.jsonl ([] if none; metrics_log.read: lines that hold no row
  named in one warning and skipped)."""
  return metrics_log.read(os.path.join(workdir, metrics_log.FILE))


def _value(key: str, value: float) -> str:
  return f"{key} {value:.4f}" if abs(value) < 1e4 else f"{key} {value:.4g}"


def eta_seconds(rows: Sequence[dict[str, Any]], num_steps: int) -> float | None:
  """Seconds to `num_steps` at the rate between the first and the latest logged training step
  (the first is logged after compilation; the evaluations between them are counted, as they
  recur); None before two such steps, or where their times are not finite."""
  timed = [r for r in rows if "train/loss" in r and "time/elapsed_s" in r]
  if len(timed) < 2 or timed[-1]["step"] <= timed[0]["step"]:
    return None
  seconds = timed[-1]["time/elapsed_s"] - timed[0]["time/elapsed_s"]
  if not math.isfinite(seconds):  # a log holding NaN or an infinity as its time
    return None
  rate = (timed[-1]["step"] - timed[0]["step"]) / max(seconds, 1e-9)
  return max(num_steps - timed[-1]["step"], 0) / rate


def status_line(name: str, rows: Sequence[dict[str, Any]], num_steps: int) -> str:
  """'<name>: step S/N  loss L  dev/<metric> M  ETA m:ss' from a point's metrics.jsonl rows
  (the parts it has logged so far)."""
  train = [r for r in rows if "train/loss" in r]
  if not train:
    return f"{name}: starting (no step logged yet: loading data, compiling)"
  parts = [f"{name}: step {train[-1]['step']}/{num_steps}", _value("loss", train[-1]["train/loss"])]
  evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
  key = next((f"eval/{m}" for m in DEV_METRICS if evals and f"eval/{m}" in evals[-1]), None)
  if key:
    parts.append(_value("dev/" + key[len("eval/"):], evals[-1][key]))
  eta = eta_seconds(rows, num_steps)
  if eta is not None:
    parts.append(f"ETA {duration(eta)}")
  return "  ".join(parts)


def last_error_line(log_path: str) -> str:
  """The log's last error line ('error: ...', an exception's line), else its last line that is
  not a command the runner wrote; '' for none. Progress bars' carriage returns split lines."""
  try:
    with open(log_path, "rb") as f:
      f.seek(max(0, os.path.getsize(log_path) - _LOG_TAIL))
      text = f.read().decode("utf-8", "replace")
  except OSError:
    return ""
  lines = [line.strip() for line in re.split(r"[\r\n]", text)]
  lines = [line for line in lines if line and not line.startswith("$ ")]
  line = next((line for line in reversed(lines) if _ERROR.match(line)), lines[-1] if lines else "")
  return line if len(line) <= 300 else line[:297] + "..."


def _exit(code: Any) -> str:
  if isinstance(code, int) and code < 0:
    with contextlib.suppress(ValueError):
      return f"killed by {signal.Signals(-code).name}"
  return f"exit code {code}" if isinstance(code, int) else str(code)


def failed_line(point: spec.Point, attempt: dict[str, Any], log_path: str) -> str:
  """'<name>: FAILED (<stage>, exit code N), see <log>: <its last error line>'."""
  last = last_error_line(log_path)
  return (f"{point.name}: FAILED ({attempt.get('stage', '?')}, {_exit(attempt.get('returncode'))})"
          f", see {log_path}" + (f": {last}" if last else ""))


def finished_line(point: spec.Point, split: str, seconds: float | None) -> str:
  """'<name>: finished in m:ss, step N, test/<metric> V' (else the last dev metric)."""
  rows = metrics_rows(point.workdir)
  parts = [f"{point.name}: finished" + (f" in {duration(seconds)}" if seconds else "")]
  if rows:
    parts.append(f"step {rows[-1]['step']}")
  try:
    test = json.loads(files.read_text(os.path.join(point.workdir, f"metrics.{split}.json")))
  except (OSError, ValueError):
    test = None
  key = next((m for m in TEST_METRICS if isinstance(test, dict) and
              isinstance(test.get(m), (int, float))), None) if split else None
  if key:
    parts.append(_value(f"{split}/{key}", test[key]))
  else:
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    key = next((m for m in DEV_METRICS if evals and f"eval/{m}" in evals[-1]), None)
    if key:
      parts.append(_value(f"dev/{key}", evals[-1][f"eval/{key}"]))
  return ", ".join(parts)


class Console:
  """The sweep's console: `say` prints a line; `running`/`ended` track the points whose status
  lines a thread refreshes every `every` seconds (0: none). With a terminal `stream` the status
  lines are redrawn in place below the rest; else they go to `echo`, a point's only when its
  logged step has moved."""

  def __init__(self, echo: Callable[[str], None] = print, every: float = 0.0,
               stream: TextIO | None = None):
    self.echo, self.every, self.stream = echo, every, stream
    self._lock = threading.RLock()
    self._running: dict[str, tuple[spec.Point, str]] = {}  # name -> (point, stage)
    self._shown: dict[str, Any] = {}  # plain lines: name -> the step its last line showed
    self._drawn = 0  # status lines on the terminal below the rest
    self._last: list[tuple[str, str]] = []  # the (name, status line) pairs drawn last
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def __enter__(self) -> "Console":
    self._stop.clear()  # entered again (packing.run: the packs, then the other points)
    if self.every > 0:
      self._thread = threading.Thread(target=self._loop, name="sweep-console", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc: Any) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    with self._lock:
      self._erase()

  def say(self, line: str) -> None:
    """Prints `line` (on a terminal: above the status lines)."""
    with self._lock:
      if self.stream is None:
        self.echo(line)
        return
      self._erase()
      self.stream.write(line + "\n")
      self._draw()

  def running(self, point: spec.Point, stage: str) -> None:
    """`point` has started `stage` ('train' or 'eval')."""
    with self._lock:
      self._running[point.name] = (point, stage)

  def ended(self, point: spec.Point) -> None:
    """`point` runs no more processes."""
    with self._lock:
      self._running.pop(point.name, None)
      self._shown.pop(point.name, None)

  def lines(self) -> list[tuple[str, str]]:
    """(name, status line) of each running point."""
    with self._lock:
      running = list(self._running.values())
    return [(p.name, status_line(p.name, metrics_rows(p.workdir), p.num_steps)
             if stage == "train" else f"{p.name}: evaluating (eval.py)") for p, stage in running]

  def refresh(self) -> None:
    """Redraws the status lines (terminal), or prints those whose point logged a new step."""
    lines = self.lines()
    with self._lock:
      if self.stream is not None:
        self._erase()
        self._draw(lines)
        return
      for name, line in lines:
        seen = line.split("  ", 1)[0]  # '<name>: step S/N', or the whole line before a step
        if name in self._running and self._shown.get(name) != seen:
          self._shown[name] = seen
          self.echo(line)

  def _loop(self) -> None:
    while not self._stop.wait(self.every):
      self.refresh()

  def _erase(self) -> None:
    if self._drawn:  # up to the first status line, then clear to the end of the screen
      self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
      self._drawn = 0

  def _draw(self, lines: Sequence[tuple[str, str]] | None = None) -> None:
    """Draws (name, status line) pairs: `lines`, else the last ones of points still running."""
    lines = [(n, line) for n, line in (self._last if lines is None else lines)
             if n in self._running]
    self._last = lines
    width = max(20, shutil.get_terminal_size().columns - 1)  # a wrapped line would miscount
    for _, line in lines:
      self.stream.write(line[:width] + "\n")
    self._drawn = len(lines)
    self.stream.flush()
