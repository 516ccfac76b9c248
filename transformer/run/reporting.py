"""Run reporting: metrics.jsonl, TensorBoard, config/provenance files, progress bar, throughput, MFU.

Only the main process (jax.process_index() == 0) writes files or shows a bar; the others get a
Reporter whose methods are no-ops, so the training loop calls it unconditionally:

  reporter = Reporter(workdir, config, jax.process_index() == 0, total_steps=cfg.train.num_steps,
                      start_step=resumed_step, mesh_shape=dict(mesh.shape),
                      flops_per_step=model_flops_per_step(cfg.model, batch, src_len, tgt_len),
                      peak_flops_per_device=peak_flops(jax.devices()[0].device_kind,
                                                       cfg.peak_flops),
                      data=data_fingerprint(task))
  for step ...:
    reporter.add_tokens(tokens, nonpad_tokens)   # host-side counts of this host's batch
    reporter.progress(step)                      # the bar (cheap, no device sync)
    if step % log_every == 0:
      reporter.write_scalars(step, {"train/loss": float(loss), **reporter.throughput()})
  reporter.close()

provenance.json records `data_fingerprint(task)`, the sizes of the prepared split files the run
reads and a sha256 of their records; `eval.py` calls `warn_if_data_differs`, so evaluating on other
data than training read (another builder version or data_dir content) is one warning line.

MFU = model FLOPs per step * steps per second / (devices * peak FLOP/s per device). Model FLOPs
count the matmuls of forward + backward (backward = 2 x forward) exactly per layer; elementwise
work (norms, softmax, activations, the optimizer) and rematerialised recomputation are excluded, as
in the usual MFU definition (Chowdhery et al. 2022, appendix B). CPUs have no table entry: measure
a peak with `measure_matmul_flops()` and pass it as `--config.peak_flops`.
"""

import contextlib
import datetime
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from absl import logging
from etils import epath
import jax

from transformer import config as config_lib, files
from transformer.data import builders

# A split whose files are larger than this is fingerprinted by its file sizes only: hashing
# gigabytes (from a bucket, at every start) would cost more than the check is worth.
DATA_HASH_LIMIT = 1 << 30
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "tensorflow-datasets",
            "numpy")

# Peak dense bf16 FLOP/s per chip, from the vendors' spec pages: Google Cloud TPU system
# architecture docs (v4 275, v5e 197, v5p 459, v6e 918 TFLOP/s); NVIDIA A100 datasheet (312);
# NVIDIA H100 datasheet (SXM 989, PCIe 756: the 1979/1513 figures there assume 2:4 sparsity);
# NVIDIA H200 datasheet (989, same tensor cores as H100 SXM). Matched against
# jax.devices()[0].device_kind, in order (first substring that matches wins).
PEAK_BF16_FLOPS = (
    ("v5 lite", 197e12), ("v5e", 197e12), ("v5p", 459e12), ("tpu v5", 459e12),
    ("v6 lite", 918e12), ("v6e", 918e12), ("tpu v4", 275e12),
    ("h200", 989e12), ("h100 pcie", 756e12), ("h100", 989e12), ("a100", 312e12),
)


def peak_flops(device_kind: str, override: float = 0.0) -> float | None:
  """Peak FLOP/s of one device: `override` if > 0, else the table above; None if unknown (CPU)."""
  if override and override > 0:
    return float(override)
  kind = device_kind.lower()
  for key, value in PEAK_BF16_FLOPS:
    if key in kind:
      return value
  return None


def _attention_flops(cfg: Any, t: int, s: int) -> int:
  """Forward FLOPs of one attention layer for one example: t queries over s keys/values."""
  n, k, h, hv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.v_head_dim, cfg.d_model
  projections = 2 * t * d * n * h + 2 * s * d * k * (h + hv) + 2 * t * n * hv * d  # q, kv, out
  return projections + 2 * t * s * n * h + 2 * t * s * n * hv  # scores q.k, weights.v


def _ffn_flops(cfg: Any, t: int) -> int:
  """Forward FLOPs of one feed-forward layer for t tokens (gated variants have 3 matrices)."""
  matrices = 3 if cfg.ffn in ("swiglu", "geglu") else 2
  return 2 * t * cfg.d_model * cfg.mlp_dim * matrices


def model_flops_per_step(model_cfg: Any, batch_size: int, source_len: int, target_len: int,
                         arch: str | None = None) -> int:
  """Matmul FLOPs of one training step (forward + backward) on a batch of padded/packed rows.

  encoder_decoder: rows of `source_len` encoder and `target_len` decoder tokens; decoder_only:
  rows of `target_len` tokens (source_len is ignored). Attention is counted over the full t x s
  score matrix, which is what the einsum path computes whatever the mask. With tied and shared
  embeddings the logits use the whole shared table (max of both vocabularies), as the model does.
  Scheduled sampling's extra decoder pass is not included.
  """
  cfg = model_cfg
  arch = arch or cfg.arch
  vocab = cfg.vocab_size
  if vocab <= 0:
    raise ValueError("model.vocab_size is 0: fill it in from the tokenizer before counting FLOPs")
  t = target_len
  if arch == "encoder_decoder":
    s = source_len
    if cfg.tie_embeddings and cfg.share_src_tgt_embeddings:
      vocab = max(vocab, cfg.source_vocab_size)
    encoder = cfg.num_encoder_layers * (_attention_flops(cfg, s, s) + _ffn_flops(cfg, s))
    decoder = cfg.num_decoder_layers * (_attention_flops(cfg, t, t) + _attention_flops(cfg, t, s)
                                        + _ffn_flops(cfg, t))
  elif arch == "decoder_only":
    encoder = 0
    decoder = cfg.num_decoder_layers * (_attention_flops(cfg, t, t) + _ffn_flops(cfg, t))
  elif arch == "encoder_only":  # rows of source_len tokens; the head's output over them
    t, decoder = source_len, 0
    encoder = cfg.num_encoder_layers * (_attention_flops(cfg, t, t) + _ffn_flops(cfg, t))
    vocab = vocab if cfg.head == "mlm" else cfg.num_classes
  else:
    raise ValueError(f"model.arch={arch!r} is not one of encoder_decoder|decoder_only|encoder_only")
  forward = encoder + decoder + 2 * t * cfg.d_model * vocab
  return 3 * batch_size * forward  # backward: gradients w.r.t. both operands = 2 x forward


def measure_matmul_flops(n: int = 1024, dtype: str = "float32", repeats: int = 5) -> float:
  """FLOP/s of one jitted n x n matmul on the default device, best of `repeats` (a CPU "peak").

  On CPU there is no datasheet number; pass this as `--config.peak_flops` to get MFU as a share of
  what this machine's matmul reaches in the same run, e.g.
  `python -c "from transformer import reporting; print(reporting.measure_matmul_flops())"`.
  """
  a = jax.numpy.ones((n, n), dtype)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()  # compile
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def mfu(flops_per_step: float, seconds_per_step: float, num_devices: int,
        peak_flops_per_device: float | None) -> float | None:
  """Model FLOPs utilisation in [0, 1]; None when the peak is unknown."""
  if not peak_flops_per_device or seconds_per_step <= 0:
    return None
  return flops_per_step / seconds_per_step / (num_devices * peak_flops_per_device)


def _git(args: list[str], cwd: str) -> str | None:
  try:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def data_fingerprint(task: Any, splits: Sequence[str] | None = None) -> dict[str, Any] | None:
  """The prepared data a task reads: dataset, builder version, directory and, per split (default
  all), the number and total bytes of its files and what they hold: `records` and
  `records_sha256` (builders.prepared_records_sha256: the same for the same records, whichever
  process prepared them) for array_record shards, else the files' `sha256`; `cache_sha256`
  {file: sha256} of the split's records cache (data/task.py), when one exists; no hash above
  DATA_HASH_LIMIT. None when the data has no directory (mocked or in-memory tasks)."""
  ds = getattr(task, "dataset", None)
  if ds is None or not files.isdir(ds.root):
    return None
  names = sorted(files.listdir(ds.root))
  prefix = ds.name.split("/")[0]
  out = {}
  for split in ds.splits if splits is None else splits:
    shards = [epath.Path(ds.root) / n for n in names if n.startswith(f"{prefix}-{split}.")]
    size = sum(p.stat().length for p in shards)
    out[split] = {"files": len(shards), "bytes": size}
    if size > DATA_HASH_LIMIT:
      out[split]["sha256"] = None
    elif shards and all(".array_record-" in p.name for p in shards):
      records, sha = builders.prepared_records_sha256([str(p) for p in shards])
      out[split].update(records=records, records_sha256=sha)
    else:
      digest = hashlib.sha256()
      for path in shards:
        with path.open("rb") as f:
          while chunk := f.read(1 << 22):
            digest.update(chunk)
      out[split]["sha256"] = digest.hexdigest()
    # The records cache of the split (data/task.py), which the pipeline reads instead of shards.
    cache_dir = epath.Path(ds.root) / "cache"
    caches = sorted(p for p in cache_dir.iterdir() if p.name.startswith(f"{split}-")
                    and p.name.endswith(".json")) if cache_dir.is_dir() else []
    if caches and sum(p.stat().length for p in caches) <= DATA_HASH_LIMIT:
      out[split]["cache_sha256"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                    for p in caches}
  # TFDS lays prepared data out as <data_dir>/<name>/<config>/<version>.
  return {"dataset": ds.name, "version": os.path.basename(os.path.normpath(ds.root)),
          "dir": ds.root, "splits": out}


# What two fingerprints of a split compare: the records when both hashed them (the bytes of the
# same records may differ, see data_fingerprint), else what both recorded (runs written before
# records_sha256 existed hold the files' bytes and sha256).
_CONTENT = ("records", "records_sha256")
_FILES = ("files", "bytes", "sha256")


def data_difference(run: Mapping[str, Any] | None, now: Mapping[str, Any] | None,
                    split: str) -> str | None:
  """How split `split` of fingerprint `now` differs from the run's (its records, or its files'
  count, bytes or sha256), in words; None when it does not, or when either side lacks it
  (nothing to compare)."""
  if not run or not now or split not in run["splits"] or split not in now["splits"]:
    return None
  a, b = run["splits"][split], now["splits"][split]
  keys = _CONTENT if all(k in a and k in b for k in _CONTENT) else [
      k for k in _FILES if k in a and k in b]
  caches = a.get("cache_sha256") or {}, b.get("cache_sha256") or {}
  cache = next((n for n in sorted(set(caches[0]) & set(caches[1]))
                if caches[0][n] != caches[1][n]), None)
  if cache is not None:
    return (f"its records cache {now['dir']}/cache/{cache} is not the one the run read "
            f"(sha256 {caches[1][cache][:12]}, not {caches[0][cache][:12]})")
  if all(a[k] == b[k] for k in keys):  # content only: the same data may move
    return None
  return f"{_describe(now, split)} in {now['dir']}, not {_describe(run, split)}"


def _describe(fingerprint: Mapping[str, Any], split: str) -> str:
  """One split of a data fingerprint in words."""
  f = fingerprint["splits"][split]
  held = (f"{f['records']} records, records sha256 {f['records_sha256'][:12]}"
          if "records_sha256" in f else f"sha256 {(f.get('sha256') or 'not hashed')[:12]}")
  return (f"{fingerprint['dataset']} {fingerprint['version']} {split} ({f['files']} files, "
          f"{f['bytes']} bytes, {held})")


def warn_if_data_differs(workdir: str, task: Any, split: str) -> str | None:
  """Logs one warning line, and returns it, when the data `task` reads for `split` differs
  from what training recorded in `<workdir>/provenance.json`."""
  path = os.path.join(workdir, "provenance.json")
  if not files.exists(path):
    return None
  run = json.loads(files.read_text(path)).get("data")
  difference = data_difference(run, data_fingerprint(task, [split]), split)
  if difference is None:
    return None
  message = (f"the data read is not the run's ({path}): {difference}; metrics may not be "
             f"comparable with training's")
  logging.warning(message)
  return message


def provenance(mesh_shape: Mapping[str, int] | None = None,
               data: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Where and with what a run was made: git state of this code, packages, devices, command and
  the fingerprint of the prepared data it reads (`data_fingerprint`)."""
  code_dir = os.path.dirname(os.path.abspath(__file__))
  sha = _git(["rev-parse", "HEAD"], code_dir)
  status = _git(["status", "--porcelain", "--untracked-files=no"], code_dir)
  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  devices = jax.devices()
  return {
      "git_sha": sha,
      "git_dirty": None if status is None else bool(status),
      "code_dir": code_dir,
      "packages": versions,
      "python": sys.version.split()[0],
      "platform": devices[0].platform,
      "device_kind": devices[0].device_kind,
      "num_devices": len(devices),
      "num_local_devices": jax.local_device_count(),
      "process_count": jax.process_count(),
      "mesh_shape": dict(mesh_shape) if mesh_shape else None,
      "hostname": socket.gethostname(),
      "command": sys.argv,
      "data": dict(data) if data else None,
      "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }


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
    # time/elapsed_s, logged with every row: wall-clock seconds since `started` (time.time() when
    # the run's process began training setup; default: now) plus the elapsed time the run's
    # earlier processes logged up to `start_step` (a resumed run continues its clock; the time
    # between its last logged row and the kill is not counted).
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
    self._write_json("provenance.json", provenance(mesh_shape, data))
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
    """Rates since the last call / reset, over all hosts; then starts a new window.

    Keys: perf/steps_per_sec, perf/tokens_per_sec, perf/nonpad_tokens_per_sec and, when the
    FLOPs and the peak are known, perf/mfu. Per-host counts are scaled by the process count
    (every host loads an equal share of the global batch).
    """
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
  """Wraps one training step; traces steps [profile_start_step, +profile_num_steps) to logdir.

  The trace starts at the first step of the window this process runs (a run resumed inside the
  window starts there) and stops after the last profiled step; open it in TensorBoard's profile
  plugin or Perfetto. Off when profile_start_step or profile_num_steps is 0.
  """
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
