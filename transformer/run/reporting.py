"""Run reporting: metrics.jsonl, TensorBoard, config.json and provenance.json, optionally a
Weights & Biases run (wandb_logging.py), the progress bar (its ETA from training's own step
rate: 'compiling' until the first step ends, evaluations not counted; an evaluation's progress,
then its result line), `TaskProgress` for eval.py, throughput and MFU (model FLOPs, Chowdhery et
al. 2022, appendix B, over the devices' peak; CPUs have none: pass one as `--config.peak_flops`),
and `maybe_profile`.
"""

import contextlib
import json
import os
import sys
import time
from typing import Any, Callable, Mapping, TextIO

from absl import logging
import jax

from transformer import choices, config as config_lib, files
from transformer.run import metrics_log, provenance, wandb_logging

# Peak dense bf16 FLOP/s per chip (Google Cloud TPU docs, NVIDIA datasheets without 2:4
# sparsity); the first key found in jax.devices()[0].device_kind wins.
PEAK_BF16_FLOPS = (
    ("v5 lite", 197e12), ("v5e", 197e12), ("v5p", 459e12), ("tpu v5", 459e12),
    ("v6 lite", 918e12), ("v6e", 918e12), ("tpu v4", 275e12),
    ("h200", 989e12), ("h100 pcie", 756e12), ("h100", 989e12), ("a100", 312e12),
)


def peak_flops(device_kind: str, override: float = 0.0) -> float | None:
  """Peak FLOP/s of one device: `override` if > 0, else the table above; None if unknown (CPU)."""
  if override and override > 0:
    return float(override)
  return next((value for key, value in PEAK_BF16_FLOPS if key in device_kind.lower()), None)


def _attention_flops(cfg: Any, t: int, s: int) -> int:
  """Forward FLOPs of one attention layer for one example: t queries over s keys/values."""
  n, k, h, hv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.v_head_dim, cfg.d_model
  projections = 2 * t * d * n * h + 2 * s * d * k * (h + hv) + 2 * t * n * hv * d  # q, kv, out
  return projections + 2 * t * s * n * h + 2 * t * s * n * hv  # scores q.k, weights.v


def _ffn_flops(cfg: Any, t: int) -> int:
  """Forward FLOPs of one feed-forward layer for t tokens (gated variants have 3 matrices); a
  mixture's active ones: its router, top_k experts and the shared experts (no capacity slack)."""
  mixture = choices.FFNS[cfg.ffn].mixture
  matrices = 3 if choices.FFNS[cfg.moe_expert_ffn if mixture else cfg.ffn].gated else 2
  dense = 2 * t * cfg.d_model * cfg.mlp_dim * matrices
  if not mixture:
    return dense
  return (dense * (cfg.moe_top_k + cfg.moe_num_shared_experts)
          + 2 * t * cfg.d_model * cfg.moe_num_experts)


def model_flops_per_step(model_cfg: Any, batch_size: int, source_len: int, target_len: int,
                         arch: str | None = None) -> int:
  """Matmul FLOPs of one training step (forward + backward) on a batch of padded/packed rows
  (decoder_only: of `target_len` tokens, encoder_only: `source_len`). Attention counts the full
  t x s score matrix (what the einsum path computes); scheduled sampling's extra pass is not."""
  cfg = model_cfg
  arch = arch or cfg.arch
  vocab = cfg.vocab_size
  if vocab <= 0:
    raise ValueError("model.vocab_size is 0: fill it in from the tokenizer before counting FLOPs")
  config_lib.check_value("model.arch", arch)
  s, t = source_len, source_len if arch == "encoder_only" else target_len
  encoder = decoder = 0
  if arch != "decoder_only":
    encoder = cfg.num_encoder_layers * (_attention_flops(cfg, s, s) + _ffn_flops(cfg, s))
  if arch != "encoder_only":
    decoder = cfg.num_decoder_layers * (_attention_flops(cfg, t, t) + _ffn_flops(cfg, t))
  if arch == "encoder_decoder":  # cross-attention
    decoder += cfg.num_decoder_layers * _attention_flops(cfg, t, s)
    if cfg.tie_embeddings and cfg.share_src_tgt_embeddings:
      vocab = max(vocab, cfg.source_vocab_size)
  if arch == "encoder_only" and cfg.head != "mlm":  # the head's output: one of the classes
    vocab = cfg.num_classes
  forward = encoder + decoder + 2 * t * cfg.d_model * vocab
  return 3 * batch_size * forward  # backward: gradients w.r.t. both operands = 2 x forward


def mfu(flops_per_step: float, seconds_per_step: float, num_devices: int,
        peak_flops_per_device: float | None) -> float | None:
  """Model FLOPs utilisation in [0, 1]; None when the peak is unknown."""
  if not peak_flops_per_device or seconds_per_step <= 0:
    return None
  return flops_per_step / seconds_per_step / (num_devices * peak_flops_per_device)


def _resume_jsonl(path: str, last_step: int) -> float:
  """Drops metrics.jsonl rows after `last_step` and lines that hold no row (a write cut short,
  stray bytes: named in one warning); the last kept time/elapsed_s if resuming, or 0."""
  if not files.exists(path):
    return 0.0
  rows, skipped = [], []
  for line in metrics_log.lines(path):
    (skipped if line.row is None else rows).append(line)
  metrics_log.warn_skipped(path, skipped, "dropped")
  kept = [line for line in rows if line.row["step"] <= last_step]
  if len(kept) != len(rows) or skipped:
    files.write_bytes_atomic(path, b"".join(line.raw + b"\n" for line in kept))
  elapsed = [line.row["time/elapsed_s"] for line in kept if "time/elapsed_s" in line.row]
  return float(elapsed[-1]) if elapsed and last_step else 0.0


# The data.* key of the file each split of a file-based dataset is read from.
_SPLIT_FILES = {"train": "train_file", "validation": "dev_file", "test": "test_file"}


def _data_source(d: Mapping[str, Any], split: str) -> str:
  """'data.<key>=<value>' naming where `split` of the data config `d` comes from."""
  key = "text_file" if d.get("text_file") else _SPLIT_FILES.get(split, "")
  return f"data.{key}={d[key]!r}" if d.get(key) else f"data.dataset={d.get('dataset')!r}"


def duration(seconds: float) -> str:
  """'m:ss', or 'h:mm:ss' from an hour on."""
  minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StepTimer:
  """Training's step rate: measured from the first step's completion after a compile (the time
  before it is compilation's), and paused during evaluations."""

  def __init__(self):
    self.steps, self.seconds = 0, 0.0  # counted so far, over the closed and the open interval
    self._mark: tuple[int, float] | None = None  # (step, time) the open interval starts at
    self.compiling = True  # until the first tick

  def tick(self, step: int, now: float) -> None:
    """A step ended (or was dispatched, one step behind the device) at `now`."""
    if self._mark is not None and step > self._mark[0]:
      self.steps += step - self._mark[0]
      self.seconds += now - self._mark[1]
    self._mark = (step, now)
    self.compiling = False

  def pause(self) -> None:
    """The time until the next tick is not training's (an evaluation, a save)."""
    self._mark = None

  def eta(self, step: int, total: int | None) -> float | None:
    """Seconds until `total` at the measured rate; None before two ticks or without a total."""
    if not total or not self.steps or self.seconds <= 0:
      return None
    return max(total - step, 0) * self.seconds / self.steps


class Reporter:
  """Writes a run's files and shows progress; a no-op unless `is_main_process`."""

  def __init__(self, workdir: str, config: Any, is_main_process: bool = True, *,
               total_steps: int | None = None, start_step: int = 0,
               mesh_shape: Mapping[str, int] | None = None, flops_per_step: float | None = None,
               peak_flops_per_device: float | None = None, num_devices: int | None = None,
               show_progress: bool = True, data: Mapping[str, Any] | None = None,
               started: float | None = None):
    self.workdir = workdir
    # time/elapsed_s: since `started` (default: now), plus what earlier processes of the run logged.
    self._started = time.time() if started is None else started
    self._elapsed_before = 0.0
    self.active = is_main_process
    self.flops_per_step = flops_per_step
    self.peak_flops_per_device = peak_flops_per_device
    self.num_devices = num_devices or jax.device_count()
    self._step = start_step
    self._total = total_steps
    self._last_rates: dict[str, float] = {}
    self._loss: float | None = None  # the latest training loss, shown on the bar
    self.timer = StepTimer()  # the ETA's step rate
    self._eval_started: float | None = None  # perf_counter() when the running evaluation began
    self._shown = 0.0  # perf_counter() of the bar's last refresh during an evaluation
    self.reset_throughput()
    self._writer = self._bar = self._wandb = None
    if not self.active:
      return
    files.makedirs(workdir)
    as_dict = config_lib.to_dict(config)
    d = as_dict.get("data") or {}
    trained = [d[k] for k in ("train_split", "eval_split") if d.get(k)] if start_step else []
    data = provenance.carried_over(os.path.join(workdir, "provenance.json"), data,
                                   {split: _data_source(d, split) for split in trained})
    records = {"config.json": as_dict,
               "provenance.json": provenance.provenance(mesh_shape, data)}
    for name, record in records.items():
      files.write_text_atomic(os.path.join(workdir, name),
                              json.dumps(record, indent=2, sort_keys=True, default=str))
    self._wandb = wandb_logging.start_run(workdir, records["config.json"], json.loads(
        json.dumps(records["provenance.json"], default=str)))
    self._jsonl_path = os.path.join(workdir, "metrics.jsonl")
    self._elapsed_before = _resume_jsonl(self._jsonl_path, start_step)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top  (process 0 only)
    # purge_step hides events a killed run logged after its last checkpoint.
    self._writer = SummaryWriter(workdir, purge_step=start_step + 1 if start_step else None)
    if show_progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top  (only on a terminal)
      # tqdm's own rate and remaining time would count compilation and evaluations: ours instead.
      self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                       mininterval=1.0, postfix="compiling",
                       bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

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
    """perf/* rates (over all hosts) and MFU since the last call or reset; starts a new window."""
    elapsed = time.perf_counter() - self._window_start
    if self._steps == 0 or elapsed <= 0:
      return {}
    hosts = jax.process_count()
    rates = {"perf/steps_per_sec": self._steps / elapsed,
             "perf/tokens_per_sec": hosts * self._tokens / elapsed,
             "perf/nonpad_tokens_per_sec": hosts * self._nonpad_tokens / elapsed}
    if self.flops_per_step:
      value = mfu(self.flops_per_step, elapsed / self._steps, self.num_devices,
                  self.peak_flops_per_device)
      if value is not None:
        rates["perf/mfu"] = value
    self._last_rates = rates
    self.reset_throughput()
    return rates

  def status(self) -> str:
    """The bar's postfix: 'compiling' until the first step ends, then the ETA (once a step rate
    is measured), the latest loss and tokens/s."""
    if self.timer.compiling:
      return "compiling"
    eta = self.timer.eta(self._step, self._total)
    parts = [] if eta is None else [f"ETA {duration(eta)}"]
    if self._loss is not None:
      parts.append(f"loss={self._loss:.4f}")
    if "perf/tokens_per_sec" in self._last_rates:
      parts.append(f"tok/s={self._last_rates['perf/tokens_per_sec']:.0f}")
    return ", ".join(parts)

  def progress(self, step: int, loss: float | None = None) -> None:
    """Times `step` (StepTimer.tick) and moves the bar to it; shows the ETA, the latest loss given
    (here or to write_scalars) and tokens/s."""
    self.timer.tick(step, time.perf_counter())
    self._show(step, loss)

  def _show(self, step: int, loss: float | None = None) -> None:
    self._loss = self._loss if loss is None else loss
    moved, self._step = step - self._step, max(step, self._step)
    if self._bar is not None:
      self._bar.set_postfix_str(self.status(), refresh=False)
      if moved > 0:
        self._bar.update(moved)

  def evaluating(self, done: int = 0, total: int = 0) -> None:
    """An evaluation runs (its time not training's): the bar says so, with `done` of `total`
    decoded examples once decoding has begun (a decode_split progress callback)."""
    if self._eval_started is None:
      self.timer.pause()
      self._eval_started = time.perf_counter()
    now = time.perf_counter()
    if self._bar is None or (0 < done < total and now - self._shown < 0.5):
      return
    self._shown = now
    what = f"decoding {total} examples) {done}/{total}" if total else "scoring)"
    self._bar.set_postfix_str(f"evaluating ({what}", refresh=True)

  def evaluated(self, step: int, metrics: Mapping[str, Any], name: str = "") -> None:
    """Prints the evaluation's result line above the bar: its loss and task metrics, its time."""
    seconds = time.perf_counter() - (self._eval_started or time.perf_counter())
    if self._bar is not None:
      shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float))
               and k.split("/")[-1] not in ("scored_tokens", "decoded_examples", "perplexity")}
      values = ", ".join(f"{k} {v:.4f}" for k, v in shown.items())
      who = f"{name}: " if name else ""
      self._bar.set_postfix_str(self.status(), refresh=False)
      self._bar.write(f"{who}step {step}: {values or 'evaluated'} ({duration(seconds)})",
                      file=sys.stderr)

  def evaluation_done(self) -> None:
    """Training resumes: the step rate goes on from the next step."""
    self._eval_started = None

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
    if self._wandb is not None:
      self._wandb.log({"step": int(step), **values})
    if "train/loss" in values:
      self._show(step, values["train/loss"])

  def close(self) -> None:
    """Flushes and closes the TensorBoard writer, the bar and the W&B run."""
    for handle in (self._writer, self._bar):
      if handle is not None:
        handle.close()
    if self._wandb is not None:
      self._wandb.finish()
    self._writer = self._bar = self._wandb = None


class TaskProgress:
  """A task's progress on the console (stderr), as a (done, total) callback: a tqdm bar on a
  terminal; elsewhere (a log file) a line when it starts and one when it ends."""

  def __init__(self, describe: Callable[[int], str], unit: str, stream: TextIO | None = None,
               enabled: bool = True):
    self.describe, self.unit = describe, unit  # describe(total) -> 'evaluating (...)'
    self.stream = stream or sys.stderr
    self.enabled = enabled
    self._bar = None
    self._started: float | None = None
    self._done = 0

  def __call__(self, done: int, total: int = 0) -> None:
    """`done` of `total` (0: not known) are done."""
    if not self.enabled:
      return
    if self._started is None:
      self._started = time.perf_counter()
      if self.stream.isatty():
        from tqdm import tqdm  # pylint: disable=g-import-not-at-top  (as Reporter's)
        self._bar = tqdm(total=total or None, desc=self.describe(total), unit=self.unit,
                         file=self.stream, leave=False, mininterval=0.5)
      else:
        print(self.describe(total), file=self.stream, flush=True)
    if self._bar is not None:
      self._bar.update(done - self._done)
    self._done = done

  def close(self) -> None:
    """Ends the bar; off a terminal, prints what was done and how long it took."""
    if self._started is None:
      return
    seconds = time.perf_counter() - self._started
    if self._bar is not None:
      self._bar.close()
    else:
      print(f"  {self._done} {self.unit} in {duration(seconds)}", file=self.stream, flush=True)
    self._started, self._bar, self._done = None, None, 0


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
