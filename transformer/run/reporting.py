"""The metrics Reporter: metrics.jsonl, TensorBoard, config.json/provenance.json, progress bar,
throughput and MFU; and `maybe_profile`, a step's profiler trace.

Only the main process writes files or shows a bar; the others get a Reporter whose methods are
no-ops, so the training loop calls it unconditionally: `add_tokens` and `progress` every step,
`write_scalars(step, {..., **reporter.throughput()})` every log step, `close` at the end.
"""

import contextlib
import json
import os
import time
from typing import Any, Mapping

import jax

from transformer import config as config_lib, files
from transformer.run import flops, provenance


def _truncate_jsonl(path: str, last_step: int) -> None:
  """Drops lines logged after `last_step` (a resumed run logs those steps again)."""
  if not files.exists(path):
    return
  lines = [line for line in files.read_text(path).split("\n") if line.strip()]
  kept = [line for line in lines if json.loads(line).get("step", 0) <= last_step]
  if len(kept) != len(lines):
    files.write_text_atomic(path, "".join(line + "\n" for line in kept))


def _last_elapsed(path: str) -> float:
  """The last `time/elapsed_s` a metrics.jsonl holds (0 if none)."""
  if not files.exists(path):
    return 0.0
  elapsed = [json.loads(line).get("time/elapsed_s") for line in files.read_text(path).split("\n")
             if line.strip()]
  return next((float(e) for e in reversed(elapsed) if e is not None), 0.0)


class Reporter:
  """Writes a run's files and shows progress; a no-op unless `is_main_process`."""

  def __init__(self, workdir: str, config: Any, is_main_process: bool = True, *,
               total_steps: int | None = None, start_step: int = 0,
               mesh_shape: Mapping[str, int] | None = None, flops_per_step: float | None = None,
               peak_flops_per_device: float | None = None, num_devices: int | None = None,
               show_progress: bool = True, data: Mapping[str, Any] | None = None,
               started: float | None = None):
    self.workdir = workdir
    # time/elapsed_s of every row: seconds since `started` (when this process began training
    # setup; default: now) plus what the run's earlier processes logged up to `start_step` (the
    # time between a killed run's last logged row and the kill is not counted).
    self._started = time.time() if started is None else started
    self._elapsed_before = 0.0
    self.active = is_main_process
    self.flops_per_step = flops_per_step
    self.peak_flops_per_device = peak_flops_per_device
    self.num_devices = num_devices or jax.device_count()
    self._step = start_step
    self._last_rates: dict[str, float] = {}
    self._loss: float | None = None  # the latest training loss, shown on the bar
    self.reset_throughput()
    self._writer = self._bar = None
    if not self.active:
      return
    files.makedirs(workdir)
    self._write_json("config.json", config_lib.to_dict(config))
    self._write_json("provenance.json", provenance.provenance(mesh_shape, data))
    self._jsonl_path = os.path.join(workdir, "metrics.jsonl")
    _truncate_jsonl(self._jsonl_path, start_step)
    self._elapsed_before = _last_elapsed(self._jsonl_path) if start_step else 0.0
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top  (process 0 only)
    # purge_step hides events a killed run logged after its last checkpoint.
    self._writer = SummaryWriter(workdir, purge_step=start_step + 1 if start_step else None)
    if show_progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top  (only on a terminal)
      self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                       mininterval=1.0, smoothing=0.1)

  def _write_json(self, name: str, obj: Any) -> None:
    files.write_text_atomic(os.path.join(self.workdir, name),
                            json.dumps(obj, indent=2, sort_keys=True, default=str))

  def add_tokens(self, tokens: int, nonpad_tokens: int) -> None:
    """Counts one step's tokens (all positions, and non-padding ones) of this host's batch."""
    self._tokens += tokens
    self._nonpad_tokens += nonpad_tokens
    self._steps += 1

  def reset_throughput(self) -> None:
    """Starts a new throughput window (call after compilation or an evaluation)."""
    self._tokens = self._nonpad_tokens = self._steps = 0
    self._window_start = time.perf_counter()

  def throughput(self) -> dict[str, float]:
    """perf/{steps,tokens,nonpad_tokens}_per_sec (and perf/mfu when FLOPs and peak are known)
    since the last call or reset, over all hosts (each loads an equal share); starts a new
    window."""
    elapsed = time.perf_counter() - self._window_start
    if self._steps == 0 or elapsed <= 0:
      return {}
    hosts = jax.process_count()
    rates = {"perf/steps_per_sec": self._steps / elapsed,
             "perf/tokens_per_sec": hosts * self._tokens / elapsed,
             "perf/nonpad_tokens_per_sec": hosts * self._nonpad_tokens / elapsed}
    if self.flops_per_step:
      value = flops.mfu(self.flops_per_step, elapsed / self._steps, self.num_devices,
                  self.peak_flops_per_device)
      if value is not None:
        rates["perf/mfu"] = value
    self._last_rates = rates
    self.reset_throughput()
    return rates

  def progress(self, step: int, loss: float | None = None) -> None:
    """Moves the bar to `step`; shows the latest loss given (here or to write_scalars) and
    tokens/s (ETA comes from tqdm)."""
    if self._bar is None:
      return
    if step > self._step:
      self._bar.update(step - self._step)
      self._step = step
    if loss is not None:
      self._loss = loss
    postfix = {}
    if self._loss is not None:
      postfix["loss"] = f"{self._loss:.4f}"
    if "perf/tokens_per_sec" in self._last_rates:
      postfix["tok/s"] = f"{self._last_rates['perf/tokens_per_sec']:.0f}"
    if postfix:
      self._bar.set_postfix(postfix, refresh=False)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Appends {"step", **scalars} to metrics.jsonl and writes each scalar to TensorBoard."""
    if not self.active:
      return
    values = {k: float(v) for k, v in scalars.items()}
    values["time/elapsed_s"] = self._elapsed_before + time.time() - self._started
    files.append_line(self._jsonl_path, json.dumps({"step": int(step), **values}))
    for key, value in values.items():
      self._writer.add_scalar(key, value, int(step))
    self._writer.flush()
    if "train/loss" in values:
      self.progress(step, values["train/loss"])

  def write_text(self, step: int, tag: str, text: str) -> None:
    """A text summary (e.g. sample predictions) in TensorBoard."""
    if self.active:
      self._writer.add_text(tag, text, int(step))

  def close(self) -> None:
    """Flushes and closes the TensorBoard writer and the bar."""
    if self._writer is not None:
      self._writer.close()
    if self._bar is not None:
      self._bar.close()
    self._writer = self._bar = None


_tracing = False  # whether maybe_profile has a jax.profiler trace running


@contextlib.contextmanager
def maybe_profile(step: int, train_cfg: Any, logdir: str):
  """Wraps one training step; traces steps [profile_start_step, +profile_num_steps) to logdir
  (from the first of them this process runs). Off when either is 0."""
  global _tracing
  start, count = train_cfg.profile_start_step, train_cfg.profile_num_steps
  in_window = start > 0 and count > 0 and start <= step < start + count
  if in_window and not _tracing:
    jax.profiler.start_trace(logdir)
    _tracing = True
  try:
    yield
  finally:
    if _tracing and step >= start + count - 1:
      jax.profiler.stop_trace()
      _tracing = False
