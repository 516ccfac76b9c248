r"""Reliability campaign: bad inputs and failing machines, tried as an adversarial user would.

  python benchmarks/adversarial.py [--workdir=/tmp/adversarial] [--only=NAME,...] [--record]

One table of cases, each a command run as a subprocess (with a timeout) on its own copy of one
small trained G2P run (tests/g2p_mini.py: CMUdict words, a 1+1-layer d=32 model, checkpoints at
steps 30 and 60). Every case states what must happen, `expect`:
  ok           exit 0 with the right result (the case's own check, e.g. a warning naming the file)
  clear error  a non-zero exit whose last stderr line is `error: ...` naming the culprit
and gets what happened, `observed`, one of
  ok | clear error | unclear error (non-zero, but no `error:` line naming the culprit) |
  traceback | hang (the timeout expired) | silent corruption (exit 0 where an error was due, or a
  wrong result) | loss (a file that existed is gone or changed other than by appending) |
  skipped (the machine cannot stage the case, e.g. no mount namespace for a read-only directory)
It prints one row per case and then the counts; the exit status is 1 if any case was not as
expected. `--record` also writes docs/results/adversarial_campaign/record.json (every row, the
counts, the command, commit, hardware and versions).

Faults are real where the machine allows: a full disk is a file size limit (RLIMIT_FSIZE: writes
past it fail with EFBIG through orbax's own writer), read-only directories are read-only bind
mounts in a private mount namespace (`unshare -m`, root), out of memory is a model whose layers
do not fit in memory. The SIGKILL campaign (kills at random moments, bitwise resume) is
benchmarks/faults.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))
import adversarial_conversion  # noqa: E402  (benchmarks/, the script's directory)
import adversarial_surfaces  # noqa: E402  (benchmarks/, the script's directory)
import adversarial_sweeps  # noqa: E402  (as adversarial_surfaces)

OUTCOMES = ("ok", "clear error", "unclear error", "traceback", "hang", "silent corruption",
            "loss", "skipped")
RECORD = os.path.join(REPO, "docs", "results", "adversarial_campaign", "record.json")
BASE_STEPS = 60  # the trained run: checkpoints at 30 and 60


@dataclasses.dataclass
class Case:
  """One row: `setup(ctx)` stages the case in ctx.dir and returns the command's argv (or argvs
  run at the same time, for concurrent writers); `culprit`: text the error line must name;
  `check(ctx, proc)`: True if the result is right (expect ok), or if the refusal left the run
  as it must (expect clear error: e.g. no half-written step behind). Concurrent commands expected
  ok may refuse with an `error:` line naming `culprit` (a loser that gives up clearly), as long
  as one of them succeeds."""
  name: str
  item: str  # the reliability goal it tests: checksums, one writer, bound files, sweeps, ...
  expect: str
  setup: Callable[[Any], list[str] | list[list[str]]]
  culprit: str = ""
  check: Callable[[Any, subprocess.CompletedProcess], bool] | None = None
  timeout: float = 240
  fsize_limit: int = 0  # bytes: RLIMIT_FSIZE of the command (a file that stops growing)
  disk_size: int = 0  # bytes: run/checkpoints is a tmpfs of that size (a disk that fills up)
  read_only: tuple[str, ...] = ()  # paths (relative to ctx.dir) mounted read-only for it
  # a path (relative to ctx.dir): read_only turns read-only once it exists, while the command runs
  read_only_after: str = ""
  may_change: tuple[str, ...] = ()  # paths (relative to ctx.dir, prefixes) it may rewrite


# What a resume rewrites by design (provenance.json names the new command and time; training
# further removes the finished marker).
RESUME = ("run/provenance.json", "run/train_done.json", "run/config.json")


@dataclasses.dataclass
class Context:
  """Where a case runs: `dir` its own directory, `run` its copy of the trained run."""
  dir: str
  base: str  # the trained run (never changed)
  data: str  # the mini data files and their prepared TFDS data
  config: str  # a config file giving the trained run's config

  @property
  def run(self) -> str:
    return os.path.join(self.dir, "run")


PY = sys.executable


def _train(ctx: Context, *flags: str) -> list[str]:
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.run}", *flags]


def _new_run(ctx: Context, *flags: str) -> list[str]:
  """train.py on a new workdir beside the run, 10 steps."""
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.train.num_steps=10", *flags]


def _eval(ctx: Context, *flags: str) -> list[str]:
  return [PY, "eval.py", f"--workdir={ctx.run}", *flags]


def _predict(ctx: Context, *args: str) -> list[str]:
  return [PY, "-m", "transformer.infer.predict", f"--workdir={ctx.run}", *args]


def _python(code: str) -> list[str]:
  """A library call as a notebook makes it: a ValueError is the one-line error it reports."""
  wrapped = ("import sys\ntry:\n" + textwrap.indent(textwrap.dedent(code), "  ") +
             "\nexcept ValueError as e:\n  print(f'error: {e}', file=sys.stderr); sys.exit(1)\n")
  return [PY, "-c", wrapped]


def _step_dir(ctx: Context, step: int = BASE_STEPS) -> str:
  return os.path.join(ctx.run, "checkpoints", str(step))


def _largest_state_file(ctx: Context, step: int = BASE_STEPS) -> str:
  paths = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(_step_dir(ctx, step),
                                                                      "state")) for n in names]
  return max(paths, key=os.path.getsize)


def _flip_bit(path: str, offset_fraction: float = 0.5) -> None:
  with open(path, "r+b") as f:
    size = os.path.getsize(path)
    f.seek(int(size * offset_fraction))
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x10]))


def _edit_json(path: str, edit: Callable[[Any], Any]) -> None:
  with open(path) as f:
    data = json.load(f)
  data = edit(data) or data
  with open(path, "w") as f:
    json.dump(data, f, indent=2)


def _tokenizer_file(ctx: Context) -> str:
  d = os.path.join(ctx.run, "tokenizers")
  return max((os.path.join(r, n) for r, _, names in os.walk(d) for n in names),
             key=os.path.getsize)


# ----------------------------------------------------------------------------- setups


def bitflip_eval(ctx):
  _flip_bit(_largest_state_file(ctx))
  return _eval(ctx, "--split=validation")


def bitflip_resume(ctx):
  _flip_bit(_largest_state_file(ctx))
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 10}")


def truncated_resume(ctx):
  path = _largest_state_file(ctx)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 10}")


def truncated_eval(ctx):
  path = _largest_state_file(ctx)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  return _eval(ctx, "--split=validation")


def two_writers(ctx):
  return [_train(ctx, f"--config.train.num_steps={BASE_STEPS + 30}") for _ in range(2)]


def foreign_workdir(ctx):
  other = os.path.join(ctx.dir, "notarun")
  os.makedirs(other)
  with open(os.path.join(other, "config.json"), "w") as f:
    f.write('{"my": "experiment notes"}\n')
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={other}",
          "--config.train.num_steps=2"]


def edited_config(ctx):
  _edit_json(os.path.join(ctx.run, "config.json"),
             lambda c: c["model"].update(positional="rope"))
  return _eval(ctx, "--split=validation")


def swapped_tokenizer(ctx):
  path = _tokenizer_file(ctx)
  with open(path) as f:
    data = json.load(f)

  def swap(obj):  # the first list of >= 6 strings: its entries 4 and 5 trade places
    if isinstance(obj, list) and len(obj) >= 6 and all(isinstance(x, str) for x in obj):
      obj[4], obj[5] = obj[5], obj[4]
      return True
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else []
    return any(swap(x) for x in items)

  if not swap(data):
    raise RuntimeError(f"no vocabulary list in {path}")
  with open(path, "w") as f:
    json.dump(data, f)
  return _eval(ctx, "--split=validation")


def edited_records_cache(ctx):
  """The validation split's records cache in the data directory, two targets swapped."""
  data_dir = os.path.join(ctx.dir, "tfds")
  shutil.copytree(os.path.join(ctx.data, "tfds"), data_dir)
  caches = [os.path.join(r, n) for r, _, names in os.walk(data_dir) for n in names
            if r.endswith("cache") and n.startswith("validation")]
  for path in caches:
    def swap(rows):
      rows[0][1], rows[1][1] = rows[1][1], rows[0][1]
    _edit_json(path, swap)
  return _eval(ctx, "--split=validation", f"--config.data.data_dir={data_dir}")


def _warns_of_data(ctx, proc):
  return "not the run's" in proc.stderr or "differ" in proc.stderr


def sweep_changed_overrides(ctx):
  """A two-point sweep run to the end, then the same sweep with another sweep-wide override: its
  --dry_run must refuse (the points' results are another config's), not skip them as done."""
  sweep_file = os.path.join(ctx.dir, "sweep_norm.py")
  with open(sweep_file, "w") as f:
    f.write("def get_sweep():\n  return [{'model.norm': 'layernorm'}, {'model.norm': 'rmsnorm'}]\n")
  out = os.path.join(ctx.dir, "sweep")
  common = [PY, "sweep.py", f"--config={ctx.config}", f"--sweep={sweep_file}", f"--workdir={out}",
            "--eval_split=validation", "--config.train.num_steps=4",
            "--config.eval.every_steps=4", "--config.checkpoint.every_steps=4"]
  first = subprocess.run(common + ["--config.train.learning_rate=0.005"], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=600, check=False)
  if first.returncode != 0:
    raise RuntimeError(f"the first sweep failed: {first.stderr.strip().splitlines()[-1:]}")
  return common + ["--config.train.learning_rate=0.001", "--dry_run"]


def nan_key(key):
  def setup(ctx):
    return _train(ctx, f"--config.{key}=nan", f"--config.train.num_steps={BASE_STEPS + 10}")
  return setup


def inf_key(key):
  def setup(ctx):
    return _train(ctx, f"--config.{key}=inf", f"--config.train.num_steps={BASE_STEPS + 10}")
  return setup


def predict_length_penalty_nan(ctx):
  return _predict(ctx, "--method=beam", "--beam_size=4", "--length_penalty=nan", "cat")


def predict_beam_5000(ctx):
  return _predict(ctx, "--method=beam", "--beam_size=5000", "cat")


def eval_beam_5000(ctx):
  return _eval(ctx, "--split=validation", "--config.eval.decode.method=beam",
               "--config.eval.decode.beam_size=5000")


def eval_max_decode_len_huge(ctx):
  return _eval(ctx, "--split=validation", "--config.eval.decode.max_decode_len=100000")


def generate_text_unknown(ctx):
  return _python(f"""
import transformer
print(transformer.restore({ctx.run!r}).generate_text(['cat', 'h\\u00e9llo']))""")


def generate_text_too_long(ctx):
  return _python(f"""
import transformer
print(transformer.restore({ctx.run!r}).generate_text(['cat', 'x' * 50]))""")


def disk_full(ctx):
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 10}",
                "--config.checkpoint.every_steps=10")


def read_only_checkpoints(ctx):
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 10}")


def read_only_workdir_eval(ctx):
  return _eval(ctx, "--split=validation")


def fifo_train_file(ctx):
  fifo = os.path.join(ctx.dir, "train.fifo")
  os.mkfifo(fifo)
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          f"--config.data.train_file={fifo}", f"--config.data.data_dir={ctx.dir}/tfds"]


def _corrupt_split(ctx, split: str) -> str:
  """A copy of the prepared data with every 7th byte of `split`'s array_record files (after the
  first 100) inverted; its data directory."""
  data_dir = os.path.join(ctx.dir, "tfds")
  shutil.copytree(os.path.join(ctx.data, "tfds"), data_dir)
  for r, _, names in os.walk(data_dir):
    for n in names:
      if f"{split}.array_record" in n:
        with open(os.path.join(r, n), "r+b") as f:
          raw = bytearray(f.read())
          for i in range(100, len(raw), 7):
            raw[i] ^= 0xFF
          f.seek(0)
          f.write(raw)
  return data_dir


def corrupt_prepared_data(ctx):
  return _eval(ctx, "--split=validation",
               f"--config.data.data_dir={_corrupt_split(ctx, 'validation')}")


def corrupt_prepared_train_data(ctx):
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          f"--config.data.data_dir={_corrupt_split(ctx, 'train')}", "--config.train.num_steps=2"]


def empty_train_split(ctx):
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.data.max_source_len=2", "--config.data.too_long=drop",
          "--config.train.num_steps=2"]


def out_of_memory(ctx):
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.model.d_model=524288", "--config.model.num_heads=2",
          "--config.model.mlp_dim=1048576", "--config.train.num_steps=2"]


def symlinked_step_resume(ctx):
  step = _step_dir(ctx)
  elsewhere = os.path.join(ctx.dir, "moved_step")
  shutil.move(step, elsewhere)
  os.symlink(elsewhere, step)
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 10}")


def symlinked_step_eval(ctx):
  step = _step_dir(ctx)
  elsewhere = os.path.join(ctx.dir, "moved_step")
  shutil.move(step, elsewhere)
  os.symlink(elsewhere, step)
  return _eval(ctx, "--split=validation")


def _hf_dir(ctx, weights_name: str) -> str:
  d = os.path.join(ctx.dir, "hf")
  os.makedirs(d)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_embd": 16,
               "n_layer": 1, "n_head": 2, "architectures": ["GPT2LMHeadModel"]}, f)
  with open(os.path.join(d, weights_name), "wb") as f:
    f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}garbage" * 3)
  return d


def corrupt_safetensors(ctx):
  return [PY, "-m", "transformer.convert", f"--from_hf={_hf_dir(ctx, 'model.safetensors')}",
          f"--workdir={ctx.dir}/converted"]


def corrupt_pytorch_bin(ctx):
  return [PY, "-m", "transformer.convert", f"--from_hf={_hf_dir(ctx, 'pytorch_model.bin')}",
          f"--workdir={ctx.dir}/converted"]


def sweep_file_raises(ctx):
  sweep_file = os.path.join(ctx.dir, "bad_sweep.py")
  with open(sweep_file, "w") as f:
    f.write("import os\nVALUES = os.environ['NO_SUCH_VARIABLE']\n\ndef get_sweep():\n"
            "  return [{'model.norm': 'rmsnorm'}]\n")
  return [PY, "sweep.py", f"--config={ctx.config}", f"--sweep={sweep_file}",
          f"--workdir={ctx.dir}/sweep", "--dry_run"]


def _data_file(content: bytes):
  def setup(ctx):
    path = os.path.join(ctx.dir, "train.tsv")
    with open(path, "wb") as f:
      f.write(content)
    return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
            f"--config.data.train_file={path}", f"--config.data.data_dir={ctx.dir}/tfds"]
  return setup


def _flags(tool: Callable[..., list[str]], *flags: str):
  return lambda ctx: tool(ctx, *flags)


def predict_binary_stdin(ctx):
  path = os.path.join(ctx.dir, "inputs.bin")
  with open(path, "wb") as f:
    f.write(b"cat\n\xff\xfe\x00binary\n")
  return ["sh", "-c", f"{shlex.join(_predict(ctx))} < {shlex.quote(path)}"]


def no_checkpoints_eval(ctx):
  shutil.rmtree(os.path.join(ctx.run, "checkpoints"))
  return _eval(ctx, "--split=validation")


def _resumes_from_30(ctx, proc):
  """A resume past a corrupt newest checkpoint: it names it and trains on from step 30."""
  return "60" in proc.stderr and (" 30" in proc.stderr or "step 30" in proc.stderr)


def _hf_out(ctx) -> str:
  """A directory of a user's files, where an export is asked to write."""
  out = os.path.join(ctx.dir, "hf_out")
  os.makedirs(out)
  for name, text in (("config.json", '{"my": "own model"}\n'), ("notes.txt", "keep me\n"),
                     ("model.safetensors", "an earlier export\n")):
    with open(os.path.join(out, name), "w") as f:
      f.write(text)
  return out


# A random 1-layer GPT-2 with a byte-pair tokenizer saved by transformers at sys.argv[1] (the G2P
# run has no Hugging Face counterpart; a GPT-2 converted into a workdir has).
_TINY_GPT2 = """
import sys, torch, transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
text = ["the cat sees a dog", "a dog likes the moon", "she eats some fish"] * 20
tok = Tokenizer(models.BPE())
tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=60, special_tokens=["<|endoftext|>"],
                                                  show_progress=False))
eot = tok.token_to_id("<|endoftext|>")
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    vocab_size=tok.get_vocab_size(), n_positions=32, n_embd=16, n_layer=1, n_head=2,
    bos_token_id=eot, eos_token_id=eot))
model.save_pretrained(sys.argv[1])
tok.save(sys.argv[1] + "/tokenizer.json")
with open(sys.argv[2], "w") as f:
  f.write("\\n".join(text) + "\\n")
"""


def _exportable_run(ctx) -> str:
  """A workdir converted from a random GPT-2 (staged, not the case's command); its path."""
  hf, corpus, run = (os.path.join(ctx.dir, n) for n in ("gpt2", "corpus.txt", "gpt2_run"))
  for argv in ([PY, "-c", _TINY_GPT2, hf, corpus],
               [PY, "-m", "transformer.convert", f"--from_hf={hf}", f"--workdir={run}",
                f"--text_file={corpus}", f"--data_dir={ctx.dir}/tfds_gpt2"]):
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode != 0:
      raise RuntimeError(f"{argv[2]}: {(done.stderr.strip().splitlines() or [''])[-1]}")
  return run


def export_non_empty(ctx):
  return [PY, "-m", "transformer.convert", f"--workdir={_exportable_run(ctx)}",
          f"--to_hf={_hf_out(ctx)}"]


def export_overwrite(ctx):
  return [PY, "-m", "transformer.convert", f"--workdir={_exportable_run(ctx)}",
          f"--to_hf={_hf_out(ctx)}", "--overwrite"]


def _exported_over(ctx, proc):
  """--overwrite replaced the export's own files and kept the user's other file."""
  out = os.path.join(ctx.dir, "hf_out")
  with open(os.path.join(out, "config.json")) as f:
    exported = '"my"' not in f.read()
  with open(os.path.join(out, "notes.txt")) as f:
    return exported and f.read() == "keep me\n"


def checkpoints_turn_read_only(ctx):
  """A long run whose checkpoints directory turns read-only once step 80 is committed (the
  Case's read_only_after): its next save, at 100, cannot proceed."""
  return _train(ctx, "--config.train.num_steps=100000", "--config.checkpoint.every_steps=20")


def symlinked_old_step(ctx):
  """Step 30 moved elsewhere behind a symbolic link, then a resume whose retention (keep=3)
  would remove step 30: it keeps the linked step (naming it) and removes the others as usual."""
  step = _step_dir(ctx, 30)
  elsewhere = os.path.join(ctx.dir, "moved_step")
  shutil.move(step, elsewhere)
  os.symlink(elsewhere, step)
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 30}",
                "--config.checkpoint.every_steps=10")


def _no_half_written_step(ctx, proc):
  """Every entry of checkpoints/ is a committed step (it has its digest.json), none a temporary
  directory of a save left half way."""
  d = os.path.join(ctx.run, "checkpoints")
  for name in os.listdir(d):
    if "tmp" in name or (name.isdigit() and
                         not os.path.exists(os.path.join(d, name, "digest.json"))):
      return False
  return True


def _damage_orbax_metadata(ctx, step: int, name: str, content: str) -> None:
  """Step `step`'s orbax metadata file `name` replaced by `content`, which orbax reads before
  any digest is checked."""
  with open(os.path.join(_step_dir(ctx, step), name), "w") as f:
    f.write(content)


def orbax_metadata_resume(ctx):
  _damage_orbax_metadata(ctx, 30, "_CHECKPOINT_METADATA", "[]\n")  # JSON, not orbax's dict
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 10}")


def orbax_metadata_eval(ctx):
  _damage_orbax_metadata(ctx, 30, "metrics/metrics", "{not json")  # the best-by metrics
  return _eval(ctx, "--split=validation")


def _keeps_linked_step_30(ctx, proc):
  """No half-written step, step 30 still a link to its files, and a line naming it."""
  link = _step_dir(ctx, 30)
  return (_no_half_written_step(ctx, proc) and os.path.islink(link)
          and os.path.exists(os.path.join(link, "digest.json")) and "30" in proc.stderr)


def _moved_step_30_aside(ctx, proc):
  """Step 30, whose metadata fails its digest, is kept whole as 30.corrupt and named."""
  return (os.path.exists(_step_dir(ctx, 30) + ".corrupt") and "30" in proc.stderr
          and _no_half_written_step(ctx, proc))


def _names_step_30(ctx, proc):
  lines = proc.stderr.strip().splitlines()
  return bool(lines) and "30" in lines[-1]


def _says_disk_full(ctx, proc):
  line = _last_line(proc).lower()
  return "out of memory" not in line and ("disk" in line or "space" in line or "full" in line)


def _max_logged_step(ctx) -> int:
  with open(os.path.join(ctx.run, "metrics.jsonl")) as f:
    steps = [json.loads(l).get("step", 0) for l in f if l.strip().startswith("{")]
  return max(steps, default=0)


def _save_failure_at_once(ctx, proc):
  """The save at step 70 failed and the error names it (not a later save's); the run stopped by
  the next save (80) at the latest. Steps of this model take milliseconds, less than a failing
  background write takes to report itself, so the stop cannot be asked to come sooner here; the
  unit test of Checkpointer.check_saves covers the first dispatch after the report."""
  return "/70." in _last_line(proc) and _max_logged_step(ctx) <= BASE_STEPS + 20


def disk_full_async(ctx):
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS + 100}",
                "--config.checkpoint.every_steps=10", "--config.checkpoint.async_save=true",
                "--config.train.log_every_steps=1")


def two_preparers(ctx):
  """Two new runs preparing one fresh data directory at the same time."""
  return [[PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new_{i}",
           f"--config.data.data_dir={ctx.dir}/tfds_fresh", "--config.train.num_steps=2"]
          for i in range(2)]


def diverged_before_first_save(ctx):
  return [PY, "train.py", f"--config={ctx.config}", f"--workdir={ctx.dir}/new",
          "--config.train.learning_rate=1e30", "--config.train.warmup_steps=0",
          "--config.train.num_steps=50",
          "--config.checkpoint.every_steps=1000"]


def _no_step_none(ctx, proc):
  return "None" not in _last_line(proc)


def config_returns_none(ctx):
  path = os.path.join(ctx.dir, "none_config.py")
  with open(path, "w") as f:
    f.write("def get_config(arg=None):\n  config = {'model': {}}\n")  # forgets its return
  return [PY, "train.py", f"--config={path}", f"--workdir={ctx.dir}/new"]


def cache_edited_with_sidecar(ctx):
  """The validation split's records cache with two targets swapped and its .sha256 sidecar
  rewritten to match: only the run's provenance can tell."""
  data_dir = os.path.join(ctx.dir, "tfds")
  shutil.copytree(os.path.join(ctx.data, "tfds"), data_dir)
  caches = [os.path.join(r, n) for r, _, names in os.walk(data_dir) for n in names
            if r.endswith("cache") and n.startswith("validation")]
  if not caches:
    raise RuntimeError(f"no validation records cache under {data_dir}")
  for path in caches:
    with open(path) as f:
      rows = json.load(f)
    rows[0][1], rows[1][1] = rows[1][1], rows[0][1]
    data = json.dumps(rows, ensure_ascii=False).encode("utf-8")
    with open(path, "wb") as f:
      f.write(data)
    directory, name = os.path.split(path)
    with open(os.path.join(directory, f".{name}.sha256"), "w") as f:
      f.write(hashlib.sha256(data).hexdigest())
  return _eval(ctx, "--split=validation", f"--config.data.data_dir={data_dir}")

def metrics_row_cut_short(ctx):
  """A kill cut the last metrics.jsonl row half way after step 30 was saved; step 60 is gone."""
  shutil.rmtree(_step_dir(ctx))
  os.remove(os.path.join(ctx.run, "train_done.json"))
  path = os.path.join(ctx.run, "metrics.jsonl")
  with open(path) as f:
    rows = f.read().splitlines(keepends=True)
  with open(path, "w") as f:
    f.write("".join(rows[:3]) + rows[3][:len(rows[3]) // 2])
  return _train(ctx, f"--config.train.num_steps={BASE_STEPS}")


def _metrics_readable(ctx, proc):
  """The resumed run's metrics.jsonl: one JSON row per line, up to step 60."""
  with open(os.path.join(ctx.run, "metrics.jsonl")) as f:
    return "done: step=60" in proc.stdout and _max_logged_step(ctx) == BASE_STEPS and all(
        json.loads(l) for l in f)

def renamed_step_eval(ctx):
  """Step 60's directory renamed to 90: its state says step 60."""
  os.rename(_step_dir(ctx), _step_dir(ctx, 90))
  return _eval(ctx, "--split=validation")


def eval_out_another_run(ctx):
  """eval.py of the run with --out at another run's workdir that holds its own evaluation."""
  other = os.path.join(ctx.dir, "other_run")
  shutil.copytree(ctx.base, other, symlinks=True)
  with open(os.path.join(other, "metrics.validation.json"), "w") as f:
    json.dump({"split": "validation", "eval/loss": 1.0}, f)
  return _eval(ctx, "--split=validation", f"--out={other}")


CASES = [
    # checksummed checkpoints with fallback
    Case("checkpoint bit flip, eval", "checksums", "clear error", bitflip_eval, "checkpoint"),
    # A fallback moves the failing step aside, trains it again and logs those steps again.
    Case("checkpoint bit flip, resume", "checksums", "ok", bitflip_resume,
         check=_resumes_from_30, may_change=RESUME + ("run/checkpoints/60", "run/metrics.jsonl")),
    Case("checkpoint truncated array file, resume", "checksums", "ok", truncated_resume,
         check=_resumes_from_30, may_change=RESUME + ("run/checkpoints/60", "run/metrics.jsonl")),
    Case("checkpoint truncated array file, eval", "checksums", "clear error", truncated_eval,
         "checkpoint"),
    # one writer per workdir
    Case("two writers, one workdir", "one writer", "clear error", two_writers, "lock",
         may_change=RESUME),
    Case("workdir holding no run", "bound files", "clear error", foreign_workdir, "notarun"),
    # a run's files bound together
    Case("edited config.json (positional)", "bound files", "clear error", edited_config,
         "config.json"),
    Case("swapped tokenizer entries", "bound files", "clear error", swapped_tokenizer,
         "tokenizer"),
    Case("edited records cache", "bound files", "ok", edited_records_cache,
         check=_warns_of_data, may_change=("tfds",)),  # the cache is read again and rewritten
    # sweeps
    Case("sweep rerun with changed overrides", "sweeps", "clear error", sweep_changed_overrides,
         "holds point", timeout=120),
    # validation at the edge
    Case("train.learning_rate=nan", "validation", "clear error", nan_key("train.learning_rate"),
         "train.learning_rate"),
    Case("train.z_loss=inf", "validation", "clear error", inf_key("train.z_loss"),
         "train.z_loss"),
    Case("model.norm_eps=nan", "validation", "clear error", nan_key("model.norm_eps"),
         "model.norm_eps"),
    Case("train.label_smoothing=nan", "validation", "clear error",
         nan_key("train.label_smoothing"), "train.label_smoothing"),
    Case("model.dropout_rate=nan", "validation", "clear error", nan_key("model.dropout_rate"),
         "model.dropout_rate"),
    Case("predict --length_penalty=nan", "validation", "clear error",
         predict_length_penalty_nan, "length_penalty"),
    Case("predict --beam_size=5000", "validation", "clear error", predict_beam_5000,
         "beam_size"),
    Case("eval beam_size=5000", "validation", "clear error", eval_beam_5000, "beam_size"),
    Case("eval max_decode_len=100000", "validation", "clear error", eval_max_decode_len_huge,
         "max_decode_len"),
    Case("generate_text, unknown character", "validation", "clear error",
         generate_text_unknown, "outside the model's vocabulary"),
    Case("generate_text, input too long", "validation", "clear error", generate_text_too_long,
         "too long"),
    # no hangs, no tracebacks
    Case("disk full while saving", "no tracebacks", "clear error", disk_full, "checkpoints",
         fsize_limit=40_000, may_change=RESUME),
    Case("read-only checkpoints directory", "no hangs", "clear error", read_only_checkpoints,
         "checkpoints", read_only=("run/checkpoints",)),
    Case("read-only workdir, resume", "no tracebacks", "clear error", read_only_checkpoints,
         "run", read_only=("run",)),
    Case("read-only workdir, eval", "no tracebacks", "clear error", read_only_workdir_eval,
         "run", read_only=("run",)),
    Case("FIFO as the training file", "no hangs", "clear error", fifo_train_file, "train.fifo",
         timeout=120),
    Case("corrupt prepared data, eval", "no tracebacks", "clear error", corrupt_prepared_data,
         "array_record"),
    Case("corrupt prepared data, train", "no tracebacks", "clear error",
         corrupt_prepared_train_data, "array_record"),
    Case("no training examples left", "no tracebacks", "clear error", empty_train_split,
         "data.max_source_len"),
    Case("out of memory (huge model)", "no tracebacks", "clear error", out_of_memory,
         "parameters"),
    Case("symlinked step directory, resume", "no tracebacks", "ok", symlinked_step_resume,
         check=lambda ctx, proc: "done: step=70" in proc.stdout, may_change=RESUME),
    Case("symlinked step directory, eval", "no tracebacks", "ok", symlinked_step_eval,
         check=lambda ctx, proc: "validation" in proc.stdout + proc.stderr),
    Case("corrupt model.safetensors (convert)", "no tracebacks", "clear error",
         corrupt_safetensors, "model.safetensors"),
    Case("corrupt pytorch_model.bin (convert)", "no tracebacks", "clear error",
         corrupt_pytorch_bin, "pytorch_model.bin"),
    Case("sweep file raising on import", "no tracebacks", "clear error", sweep_file_raises,
         "bad_sweep.py:2: KeyError"),
    # bad input the entry points already named in one line
    Case("binary training file", "bad input", "clear error", _data_file(b"cat\tK AE T\n\x89PNG\x00"),
         "train.tsv:2: not UTF-8"),
    Case("empty training file", "bad input", "clear error", _data_file(b""), "train.tsv"),
    Case("training file without tabs", "bad input", "clear error",
         _data_file(b"cat K AE T\n"), "train.tsv:1"),
    Case("unknown config key", "bad input", "clear error",
         _flags(_train, "--config.model.d_modle=8"), "did you mean --config.model.d_model?"),
    Case("config value of the wrong type", "bad input", "clear error",
         _flags(_train, "--config.train.num_steps=ten"), "--config.train.num_steps=ten"),
    Case("eval overrides a shape key", "bad input", "clear error",
         _flags(_eval, "--config.model.d_model=8"), "model.d_model"),
    Case("eval of a missing step", "bad input", "clear error", _flags(_eval, "--step=7"),
         "step 7"),
    Case("eval of an unknown split", "bad input", "clear error", _flags(_eval, "--split=dev"),
         "'dev'"),
    Case("eval of a run without checkpoints", "bad input", "clear error", no_checkpoints_eval,
         "no checkpoints"),
    Case("eval temperature=0", "validation", "clear error",
         _flags(_eval, "--config.eval.decode.method=sample", "--config.eval.decode.temperature=0"),
         "temperature"),
    Case("eval top_p=1.5", "validation", "clear error",
         _flags(_eval, "--config.eval.decode.method=sample", "--config.eval.decode.top_p=1.5"),
         "top_p"),
    Case("predict --max_decode_len=100000", "validation", "clear error",
         _flags(_predict, "--max_decode_len=100000", "cat"), "max_decode_len"),
    Case("predict, binary stdin", "bad input", "clear error", predict_binary_stdin,
         "not UTF-8"),
    Case("predict --temperature=inf", "validation", "clear error",
         _flags(_predict, "--method=sample", "--temperature=inf", "cat"), "temperature"),
    # issue 51: exports that never overwrite, saves that fail loudly, the last unchecked inputs
    Case("export to HF into a non-empty directory", "nothing lost", "clear error",
         export_non_empty, "hf_out"),
    Case("export to HF, --overwrite", "nothing lost", "ok", export_overwrite,
         check=_exported_over, may_change=("hf_out/config.json", "hf_out/model.safetensors")),
    Case("checkpoints directory turns read-only mid-run", "no hangs", "clear error",
         checkpoints_turn_read_only, "checkpoints", timeout=180, read_only=("run/checkpoints",),
         read_only_after="run/checkpoints/80/digest.json", may_change=RESUME),
    Case("symlinked older step, retention", "no tracebacks", "ok", symlinked_old_step,
         check=_keeps_linked_step_30,
         may_change=RESUME + ("run/checkpoints/60", "run/metrics.jsonl")),
    Case("damaged orbax metadata of an older step, resume", "no tracebacks", "ok",
         orbax_metadata_resume, check=_moved_step_30_aside,
         may_change=RESUME + ("run/checkpoints/30", "run/metrics.jsonl")),
    Case("damaged orbax metadata of an older step, eval", "no tracebacks", "clear error",
         orbax_metadata_eval, "metrics", check=_names_step_30),
    Case("disk full during async save", "clear messages", "clear error", disk_full_async,
         "checkpoints", check=_says_disk_full, disk_size=1_000_000,  # steps 30, 60 and 166 kB
         may_change=RESUME + ("run/metrics.jsonl",)),
    Case("failed save reported at once", "clear messages", "clear error", disk_full_async,
         "checkpoints", check=_save_failure_at_once, fsize_limit=40_000,
         may_change=RESUME + ("run/metrics.jsonl",)),
    Case("two processes preparing one fresh data directory", "clear messages", "ok",
         two_preparers, "tfds_fresh", timeout=360),
    Case("divergence before the first save", "clear messages", "clear error",
         diverged_before_first_save, "non-finite", check=_no_step_none),
    Case("config file whose get_config returns None", "clear messages", "clear error",
         config_returns_none, "none_config.py"),
    Case("train.b1=1.0", "validation", "clear error",
         _flags(_new_run, "--config.train.b1=1.0"), "train.b1"),
    Case("train.b2=-0.1", "validation", "clear error",
         _flags(_new_run, "--config.train.b2=-0.1"), "train.b2"),
    Case("train.eps=0", "validation", "clear error",
         _flags(_new_run, "--config.train.eps=0.0"), "train.eps"),
    Case("train.momentum=2 (sgd)", "validation", "clear error",
         _flags(_new_run, "--config.train.optimizer=sgd", "--config.train.momentum=2.0"),
         "train.momentum"),
    Case("records cache edited with its digest", "bound files", "clear error",
         cache_edited_with_sidecar, "validation", may_change=("tfds",)),
    # found by attacking it: kinds of no issue before
    Case("step directory renamed to a higher number, eval", "bound files", "clear error",
         renamed_step_eval, "90"),
    Case("eval --out at another run's workdir", "nothing lost", "clear error",
         eval_out_another_run, "other_run"),
    Case("metrics.jsonl row cut short, resume", "resume", "ok", metrics_row_cut_short,
         check=_metrics_readable, may_change=RESUME + ("run/metrics.jsonl",)),
]
# Beyond checkpoints and training: metrics.jsonl readers, changed meanings, inputs, the write guard
CASES += [Case(name, item, expect, setup, culprit, check, may_change=may_change)
          for name, item, expect, setup, culprit, check, may_change in adversarial_surfaces.CASES
          + adversarial_conversion.CASES + adversarial_sweeps.CASES]


# ----------------------------------------------------------------------------- running


def _env() -> dict[str, str]:
  return dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")


def _snapshot(root: str) -> dict[str, bytes]:
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      path = os.path.join(d, n)
      if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
          out[path] = f.read()
  return out


def _lost(before: dict[str, bytes], root: str, may_change: tuple[str, ...]) -> list[str]:
  """Files of `before` that are gone or changed other than by appending (those under
  `may_change`, relative to root, aside)."""
  after = _snapshot(root)
  return [p for p, data in before.items()
          if not os.path.relpath(p, root).startswith(may_change)
          and (p not in after or not after[p].startswith(data))]


def _can_unshare() -> bool:
  return (shutil.which("unshare") is not None and subprocess.run(
      ["unshare", "-m", "true"], capture_output=True, check=False).returncode == 0)


# Runs sys.argv[1:] with RLIMIT_FSIZE = sys.argv[1] bytes (no preexec_fn: this process has JAX's
# threads, and a fork that runs Python code in the child may deadlock).
_FSIZE_LIMITED = ("import os, resource, sys\n"
                  "n = int(sys.argv[1])\n"
                  "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))\n"
                  "os.execvp(sys.argv[2], sys.argv[2:])\n")


def _command(case: Case, ctx: Context, argv: list[str]) -> list[str]:
  """argv, with case.fsize_limit, inside a private mount namespace with case.read_only mounted
  read-only."""
  if case.fsize_limit:
    argv = [PY, "-c", _FSIZE_LIMITED, str(case.fsize_limit), *argv]
  if not case.read_only:
    return argv
  if case.read_only_after:  # writable at first; read-only once that path exists
    paths = [shlex.quote(os.path.join(ctx.dir, r)) for r in case.read_only]
    binds = " && ".join(f"mount --bind {p} {p}" for p in paths)
    remounts = " && ".join(f"mount -o remount,bind,ro {p}" for p in paths)
    trigger = shlex.quote(os.path.join(ctx.dir, case.read_only_after))
    return ["unshare", "-m", "sh", "-c",
            f"{binds} && {{ {shlex.join(argv)} & pid=$!; "
            f"while [ ! -e {trigger} ] && kill -0 $pid 2>/dev/null; do sleep 0.1; done; "
            f"{remounts}; wait $pid; }}"]
  mounts = " && ".join(
      f"mount --bind {shlex.quote(p)} {shlex.quote(p)} && "
      f"mount -o remount,bind,ro {shlex.quote(p)}"
      for p in (os.path.join(ctx.dir, r) for r in case.read_only))
  return ["unshare", "-m", "sh", "-c", f"{mounts} && exec {shlex.join(argv)}"]


def _last_line(proc: subprocess.CompletedProcess) -> str:
  lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  return lines[-1] if lines else ""


def _names(line: str, case: Case, ctx: Context) -> bool:
  """Whether `line` names case.culprit other than in the case's own directory's name (which is
  the case's name: it may hold the culprit)."""
  return case.culprit in line.replace(ctx.dir, "")


def classify(case: Case, ctx: Context, procs: list[subprocess.CompletedProcess | None],
             lost: list[str]) -> tuple[str, str]:
  """(observed outcome, the line that shows it) of a case's finished processes."""
  if any(p is None for p in procs):
    return "hang", f"no exit within {case.timeout:.0f} s"
  if lost:
    return "loss", f"changed or deleted: {', '.join(os.path.relpath(p, ctx.dir) for p in lost[:3])}"
  err = "\n".join(p.stderr for p in procs)
  lines = [l for l in err.strip().splitlines() if l.strip()]
  last = lines[-1][:300] if lines else ""
  if "Traceback (most recent call last)" in err or "Exception ignored" in err:
    return "traceback", last
  failed = [p for p in procs if p.returncode != 0]
  if case.expect == "clear error":
    if not failed:
      return "silent corruption", "exit 0" + (f": {last}" if last else "")
    errors = [l for p in failed for l in p.stderr.strip().splitlines()[-1:]]
    named = [l for l in errors if l.startswith("error: ") and _names(l, case, ctx)]
    if not named:
      return "unclear error", (errors or [""])[0][:300]
    if case.check and not all(case.check(ctx, p) for p in failed):
      return "silent corruption", f"refused, but not as due: {named[0][:280]}"
    return "clear error", named[0][:300]
  refused = [p for p in failed if len(procs) > 1 and case.culprit and _last_line(p).startswith(
      "error: ") and _names(_last_line(p), case, ctx)]  # a concurrent loser that gave up clearly
  if len(refused) < len(failed) or len(refused) == len(procs):
    return ("clear error" if last.startswith("error: ") else "unclear error"), last
  procs = [p for p in procs if p not in refused]
  right = all(case.check(ctx, p) for p in procs) if case.check else True
  return ("ok", last) if right else ("silent corruption", f"exit 0, wrong result: {last}")


def run_case(case: Case, root: str, base: str, data: str, config: str, unshare: bool
             ) -> dict[str, Any]:
  """Stages and runs one case; its row."""
  ctx = Context(os.path.join(root, "cases", case.name.replace(" ", "_").replace("/", "_")), base,
                data, config)
  small_disk = os.path.join(ctx.run, "checkpoints")
  subprocess.run(["umount", small_disk], capture_output=True, check=False)  # an earlier try's
  shutil.rmtree(ctx.dir, ignore_errors=True)
  os.makedirs(ctx.dir)
  shutil.copytree(base, ctx.run, symlinks=True)
  row = {"case": case.name, "item": case.item, "expected": case.expect}
  if case.read_only and not unshare:
    return {**row, "observed": "skipped", "detail": "no private mount namespace (unshare -m)",
            "seconds": 0.0}
  if case.disk_size:
    if not _small_disk(small_disk, case.disk_size):
      return {**row, "observed": "skipped", "detail": "cannot mount a tmpfs (needs root)",
              "seconds": 0.0}
    try:
      return _run_staged(case, ctx, row)
    finally:
      subprocess.run(["umount", small_disk], capture_output=True, check=False)
  return _run_staged(case, ctx, row)


def _small_disk(path: str, size: int) -> bool:
  """Mounts a tmpfs of `size` bytes at `path` holding path's files; False if it cannot."""
  aside = path + ".before_tmpfs"
  os.rename(path, aside)
  os.makedirs(path)
  if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                    capture_output=True, check=False).returncode != 0:
    os.rmdir(path)
    os.rename(aside, path)
    return False
  shutil.copytree(aside, path, symlinks=True, dirs_exist_ok=True)
  shutil.rmtree(aside)
  return True


def _run_staged(case: Case, ctx: Context, row: dict[str, Any]) -> dict[str, Any]:
  """Stages case in ctx (its run copied there) and runs it; its row."""
  try:
    argvs = case.setup(ctx)
  except Exception as e:  # pylint: disable=broad-except  (a staging failure is reported)
    return {**row, "observed": "skipped", "detail": f"staging failed: {e}", "seconds": 0.0}
  started = time.monotonic()  # the case's own command(s), not the staging
  argvs = argvs if argvs and isinstance(argvs[0], list) else [argvs]
  before = _snapshot(ctx.dir)

  popens = [subprocess.Popen(_command(case, ctx, a), cwd=REPO, env=_env(), text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True) for a in argvs]
  procs: list[subprocess.CompletedProcess | None] = []
  for p in popens:
    try:
      out, err = p.communicate(timeout=max(1.0, case.timeout - (time.monotonic() - started)))
      procs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, 9)
      p.communicate()
      procs.append(None)
  observed, detail = classify(case, ctx, procs, _lost(before, ctx.dir, case.may_change))
  return {**row, "observed": observed, "detail": detail,
          "seconds": round(time.monotonic() - started, 1)}


def prepare(root: str) -> tuple[str, str, str]:
  """The trained run (checkpoints at 30 and 60), its data and a config file for train.py."""
  import g2p_mini  # pylint: disable=g-import-not-at-top  (tests/: the mini G2P run)
  data, base = os.path.join(root, "data"), os.path.join(root, "base")
  config = os.path.join(root, "config.py")
  if not os.path.exists(os.path.join(root, "config.json")):  # (its data files are written once)
    cd = g2p_mini.config(data, num_steps=BASE_STEPS)
    cd.checkpoint.update(every_steps=30, keep=3)
    cd.eval.update(every_steps=30)
    with open(os.path.join(root, "config.json"), "w") as f:
      json.dump(cd.to_dict(), f, indent=1)
  with open(config, "w") as f:
    f.write("import json\nimport ml_collections\n\n\ndef get_config(arg=None):\n"
            f"  with open({os.path.join(root, 'config.json')!r}) as f:\n"
            "    return ml_collections.ConfigDict(json.load(f))\n")
  if not os.path.exists(os.path.join(base, "train_done.json")):
    shutil.rmtree(base, ignore_errors=True)
    subprocess.run([PY, "train.py", f"--config={config}", f"--workdir={base}"], cwd=REPO,
                   env=_env(), check=True, capture_output=True)
  return base, data, config


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
  """How many rows observed each outcome, and how many were as expected."""
  out = {o: sum(r["observed"] == o for r in rows) for o in OUTCOMES}
  out["as_expected"] = sum(r["observed"] == r["expected"] for r in rows)
  out["cases"] = len(rows)
  return out


def table(rows: list[dict[str, Any]]) -> str:
  """The rows as a Markdown table."""
  lines = ["| case | goal | expected | observed | what it said |", "|---|---|---|---|---|"]
  for r in rows:
    mark = "" if r["observed"] == r["expected"] else " **(!)**"
    detail = r["detail"].replace("|", "\\|")[:160]
    lines.append(f"| {r['case']} | {r['item']} | {r['expected']} | {r['observed']}{mark} | "
                 f"{detail} |")
  return "\n".join(lines)


def record(rows: list[dict[str, Any]], command: str, wall: float, prov: dict[str, Any]
           ) -> dict[str, Any]:
  """docs/results/adversarial_campaign/record.json's content (`prov`: the provenance of the code
  the campaign ran, taken when it started)."""
  c = counts(rows)
  return {
      "name": "adversarial_campaign",
      "title": f"Reliability campaign: {c['as_expected']}/{c['cases']} cases as expected",
      "task": "G2P (CMUdict)", "config": "tests/g2p_mini.py (1+1 layers, d=32)",
      "overrides": [], "command": command,
      "commit": None if prov.get("git_dirty") else prov.get("git_sha"),
      "hardware": f"{os.cpu_count()}-core {platform.machine()} CPU",
      "versions": prov.get("packages"),
      "wall_clock_s": round(wall, 1), "rates": {},
      "metrics": {k.replace(" ", "_"): v for k, v in c.items()}, "seeds": [0],
      "report": "docs/reliability.md#adversarial-campaign"}


def main(argv: list[str] | None = None) -> int:
  """Runs the campaign; the exit status (1 if any case was not as expected)."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="/tmp/adversarial")
  p.add_argument("--only", default="", help="comma-separated case names (substrings)")
  p.add_argument("--list", action="store_true", help="print the case names and exit")
  p.add_argument("--record", action="store_true",
                 help=f"write {os.path.relpath(RECORD, REPO)} and the table of cases beside it")
  args = p.parse_args(argv)
  if args.list:
    print("\n".join(f"{c.name}\t{c.item}\t{c.expect}" for c in CASES))
    return 0
  wanted = [w.strip() for w in args.only.split(",") if w.strip()]
  cases = [c for c in CASES if not wanted or any(w in c.name for w in wanted)]
  started = time.monotonic()
  from transformer.run import provenance  # pylint: disable=g-import-not-at-top
  prov = provenance.provenance()  # the code the cases run
  os.makedirs(args.workdir, exist_ok=True)
  base, data, config = prepare(args.workdir)
  unshare = _can_unshare()
  rows = []
  for case in cases:
    row = run_case(case, args.workdir, base, data, config, unshare)
    rows.append(row)
    print(f"{row['observed']:>17} (expected {row['expected']}) {row['case']}  "
          f"[{row['seconds']} s] {row['detail'][:160]}", flush=True)
  print()
  print(table(rows))
  c = counts(rows)
  print("\n" + ", ".join(f"{k}: {v}" for k, v in c.items()))
  if args.record:
    command = shlex.join(["python", "benchmarks/adversarial.py", *sys.argv[1:]])
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    with open(RECORD, "w") as f:
      json.dump(record(rows, command, time.monotonic() - started, prov), f, indent=1)
      f.write("\n")
    cases = os.path.join(os.path.dirname(RECORD), "cases.md")  # every row, beside the record
    with open(cases, "w") as f:
      f.write(table(rows) + "\n")
    print(f"wrote {os.path.relpath(RECORD, REPO)} and {os.path.relpath(cases, REPO)}")
  return 0 if c["as_expected"] == c["cases"] else 1


if __name__ == "__main__":
  sys.exit(main())
