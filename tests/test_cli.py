"""Validation at the edge and failures of the machine: each a one-line error naming the culprit.

Config floats that must be finite, decoding options bounded before anything compiles, one input
check shared by `Run.generate_text` and predict, and the entry points' one mechanism
(`cli.one_line_errors` / `cli.environment_error`) for a full disk, a read-only directory, corrupt
prepared data, out of memory, a FIFO given as data, corrupt converter inputs and sweep files that
raise. The same cases, run as a user runs them, are rows of benchmarks/adversarial.py.
"""

import dataclasses
import errno
import json
import math
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import pytest

import g2p_mini
from configs import base
from transformer import cli, config as config_lib, files
from transformer.config import ConfigError, from_configdict
from transformer.convert import ConvertError, read_hf
from transformer.data import builders, inputs, prepared
from transformer.infer import decoding, predict
from transformer.sweeps import spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  return g2p_mini.trained_run(tmp_path_factory)


def _config_file(tmp_path, run):
  """A config file (for train.py) giving the config.json of `run`."""
  cfg = tmp_path / "cfg.py"
  cfg.write_text("import json\nimport ml_collections\n\ndef get_config(arg=None):\n"
                 f"  return ml_collections.ConfigDict(json.load(open({str(run / 'config.json')!r})))\n")
  return cfg


def _float_keys(section, path=""):
  """Every float key of a Config (dotted)."""
  for f in dataclasses.fields(section):
    value = getattr(section, f.name)
    if dataclasses.is_dataclass(value):
      yield from _float_keys(value, f"{path}{f.name}.")
    elif isinstance(value, float):
      yield f"{path}{f.name}"


FLOAT_KEYS = sorted(_float_keys(from_configdict(base.get_config())))


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_key_must_be_finite(value):
  """nan or +-inf in any float key of the config is one ConfigError line naming that key (the
  check is generic: every float of the schema, none exempt)."""
  assert {"train.learning_rate", "train.z_loss", "model.norm_eps", "train.label_smoothing",
          "model.dropout_rate", "eval.decode.length_penalty"} <= set(FLOAT_KEYS)
  for key in FLOAT_KEYS:
    cd = base.get_config()
    cd.update_from_flattened_dict({key: value})
    with pytest.raises(ConfigError) as e:
      from_configdict(cd)
    assert str(e.value) == f"{key}={value} must be a finite number", key


@pytest.mark.parametrize("key,value,culprit", [
    ("eval.decode.beam_size", 5000, r"eval.decode.beam_size=5000 must be in \[1, 1024\]"),
    ("eval.decode.max_decode_len", 100000, "eval.decode.max_decode_len=100000 must be <= "
     "model.max_len"),
])
def test_decoding_bounds_in_the_config(key, value, culprit):
  cd = base.get_config()
  cd.update_from_flattened_dict({key: value})
  with pytest.raises(ConfigError, match=culprit):
    from_configdict(cd)


def test_search_settings_bounds_each_option_before_compiling():
  """Beam size at most the vocabulary and 1024, finite length penalty and temperature,
  max_decode_len in [0, max_len]: each a one-line ValueError naming its key."""
  good = from_configdict(base.get_config()).eval.decode
  cases = [(dict(method="beam", beam_size=50), 43, "eval.decode.beam_size=50 must be in [1, 43]"),
           (dict(method="beam", beam_size=2000), 0, "beam_size=2000 must be in [1, 1024]"),
           (dict(method="beam", length_penalty=math.nan), 43, "length_penalty=nan must be a finite"),
           (dict(method="sample", temperature=math.inf), 43, "temperature=inf must be a finite"),
           (dict(max_decode_len=40), 43, "max_decode_len=40 must be in [0, model.max_len=32]"),
           (dict(max_decode_len=-1), 43, "max_decode_len=-1 must be in")]
  for options, vocab, culprit in cases:
    with pytest.raises(ValueError, match=culprit.replace("[", r"\[")):
      decoding.search_settings(dataclasses.replace(good, **options), vocab, 32)
  assert decoding.search_settings(dataclasses.replace(good, method="beam", beam_size=43), 43,
                                  32).beam_size == 43


def test_generate_text_and_predict_share_one_input_check(trained, capsys):
  """An input predict refuses (unknown characters, too long, empty) makes generate_text raise a
  ValueError with predict's very line; bad options too, before anything compiles."""
  run = pytest.importorskip("transformer").restore(trained)
  for bad in ["h\u00e9llo", "x" * 50, "  "]:
    with pytest.raises(ValueError) as e:
      run.generate_text(["cat", bad])
    assert predict.main([f"--workdir={trained}", "cat", bad]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {e.value}"]
    error, _ = inputs.check_input(run, bad, inputs.decode_length(run, None))
    assert str(e.value) == inputs.input_error(2, bad, error)
  with pytest.raises(ValueError, match="beam_size=5000 must be in"):
    run.generate_text(["cat"], method="beam", beam_size=5000)
  with pytest.raises(ValueError, match="length_penalty=nan must be a finite"):
    run.generate_text(["cat"], method="beam", beam_size=2, length_penalty=math.nan)


# ----------------------------------------------------------------------------- the machine


def test_environment_errors_are_one_line_naming_the_file():
  """A failed file operation (an OSError, or tensorstore's error text with an os_error_code)
  names the path and what to do; corrupt Riegeli data says how to prepare it again; anything
  else is not an environment error (a bug keeps its traceback)."""
  disk = OSError(errno.ENOSPC, "No space left on device", "/w/checkpoints/80/state")
  assert cli.environment_error(disk) == (
      "/w/checkpoints/80/state: No space left on device; free some space, then rerun the same "
      "command (committed checkpoints are kept)")
  tensorstore = ValueError(
      'OUT_OF_RANGE: Error writing local file "/w/checkpoints/80.orbax-checkpoint-tmp/state/x": '
      'Failed writing: "/w/checkpoints/80.orbax-checkpoint-tmp/state/x.__lock": Failed to write '
      "14864 bytes to file 19: No space left on device [os_error_code='28']")
  wrapped = RuntimeError("save failed")
  wrapped.__cause__ = tensorstore
  assert cli.environment_error(wrapped).startswith(
      "/w/checkpoints/80.orbax-checkpoint-tmp/state/x: No space left on device; free some space")
  full = ValueError(  # tensorstore's code for a full disk, as an asynchronous save reports it
      'RESOURCE_EXHAUSTED: Error writing local file "/w/checkpoints/40.orbax-checkpoint-tmp/s": '
      "Failed to write 34864 bytes to file 8: No space left on device [os_error_code='28']")
  assert cli.environment_error(full) == (
      "/w/checkpoints/40.orbax-checkpoint-tmp/s: No space left on device; free some space, then "
      "rerun the same command (committed checkpoints are kept)")  # not 'out of memory'
  assert "Read-only file system" in cli.environment_error(
      OSError(errno.EROFS, os.strerror(errno.EROFS), "/w"))
  riegeli = RuntimeError("Corrupted Riegeli/records file: block header hash mismatch")
  assert "rerun to prepare it again" in cli.environment_error(riegeli)
  assert cli.environment_error(KeyError("x")) is None
  try:
    try:
      raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/w/cache")
    except FileNotFoundError:
      raise KeyError("a bug while handling it")  # pylint: disable=raise-missing-from
  except KeyError as bug:
    assert cli.environment_error(bug) is None  # the bug keeps its traceback
  assert cli.error_line(KeyError("x"), (ValueError,)) is None
  assert cli.error_line(ConfigError("a.b=1 bad\nmore"), (ValueError,)) == "a.b=1 bad"


def test_out_of_memory_names_the_model_size():
  """XLA's RESOURCE_EXHAUSTED (a real one: a 1 TiB buffer) is one line with the model's
  parameter count."""
  with pytest.raises(Exception) as e:
    jax.jit(lambda: jnp.ones((2**38,), jnp.float32))().block_until_ready()
  model = config_lib.model_config(d_model=64, num_heads=2, mlp_dim=128, vocab_size=50,
                                  source_vocab_size=50)
  line = cli.environment_error(e.value, lambda: model)
  assert line.startswith("out of memory: RESOURCE_EXHAUSTED") and "\n" not in line
  from transformer.model import models  # pylint: disable=g-import-not-at-top
  n = models.parameter_count(model)
  assert f"the model has {n:,} parameters (" in line and n > 64 * 128


def test_one_line_errors_exits_1_with_the_line_and_keeps_bugs(capsys):
  with pytest.raises(SystemExit) as e:
    with cli.one_line_errors(ConfigError):
      raise OSError(errno.ENOSPC, "No space left on device", "/w/f")
  assert e.value.code == 1
  assert capsys.readouterr().err.startswith("error: /w/f: No space left on device;")
  with pytest.raises(ZeroDivisionError):
    with cli.one_line_errors(ConfigError):
      _ = 1 / 0


def test_check_writable_probes_by_creating_a_file(tmp_path, monkeypatch):
  """A directory (or its nearest existing parent) where no file can be created is an OSError
  naming it, with the errno of the failed creation (a read-only file system here)."""
  files.check_writable(tmp_path / "not" / "yet")
  assert os.listdir(tmp_path) == []  # the probe is gone
  (tmp_path / "file").write_text("x")
  with pytest.raises(NotADirectoryError):
    files.check_writable(tmp_path / "file" / "checkpoints")
  real_open = os.open

  def read_only(path, *args, **kwargs):
    if ".write_probe" in os.fspath(path):
      raise OSError(errno.EROFS, "Read-only file system", path)
    return real_open(path, *args, **kwargs)

  monkeypatch.setattr(os, "open", read_only)
  with pytest.raises(OSError) as e:
    files.check_writable(tmp_path)
  assert e.value.errno == errno.EROFS and e.value.filename == str(tmp_path)


def _can_mount_read_only() -> bool:
  return shutil.which("unshare") is not None and subprocess.run(
      ["unshare", "-m", "true"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs a private mount namespace (root)")
def test_read_only_checkpoints_directory_fails_at_once(trained, tmp_path):
  """Resuming into a read-only checkpoints directory (a read-only bind mount) is one line naming
  it within seconds, not minutes of orbax retries and a traceback; nothing changes."""
  run = tmp_path / "run"
  shutil.copytree(trained, run)
  cfg = _config_file(tmp_path, run)
  before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
  ckpt = run / "checkpoints"
  script = (f"mount --bind {ckpt} {ckpt} && mount -o remount,bind,ro {ckpt} && exec "
            f"{sys.executable} train.py --config={cfg} --workdir={run} "
            "--config.train.num_steps=70")
  out = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == (
      f"error: {ckpt}: Read-only file system; give a --workdir on a writable file system")
  assert {p: p.read_bytes() for p in before} == before


def test_a_fifo_is_refused_not_read(tmp_path):
  """A FIFO given as a data file (training pairs or an LM's text) is a one-line error naming it;
  reading it would wait for a writer forever. (In a subprocess: a hang fails the timeout.)"""
  fifo = tmp_path / "text.fifo"
  os.mkfifo(fifo)
  code = ("from configs import base\nfrom transformer.config import from_configdict\n"
          "from transformer.data import builders\nimport sys\n"
          "for key, dataset in (('text_file', 'text_files'), ('train_file', 'tsv_pairs')):\n"
          "  c = base.get_config()\n"
          f"  c.data.update(dataset=dataset, data_dir={str(tmp_path / 'd')!r}, **{{key: {str(fifo)!r}}})\n"
          "  try:\n    builders.open_dataset(from_configdict(c).data)\n"
          "  except FileNotFoundError as e:\n    print(e)\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True,
                       text=True, timeout=120)
  assert out.stdout.splitlines() == [
      f"data.{key}={str(fifo)!r} is a FIFO (named pipe), not a regular file; give a file"
      for key in ("text_file", "train_file")], out.stderr[-2000:]


def test_corrupt_prepared_data_names_the_file_and_the_remedy(trained, tmp_path):
  """A prepared array_record file with corrupt blocks is an OSError naming the file (when
  fingerprinted) or the dataset's directory (when read), and how to prepare it again."""
  with open(os.path.join(trained, "config.json")) as f:
    saved = ml_collections.ConfigDict(json.load(f))
  data_dir = tmp_path / "tfds"
  shutil.copytree(saved.data.data_dir, data_dir)
  saved.data.data_dir = str(data_dir)
  paths = sorted(data_dir.rglob("*validation.array_record*"))
  raw = bytearray(paths[0].read_bytes())
  for i in range(100, len(raw), 7):
    raw[i] ^= 0xFF
  paths[0].write_bytes(bytes(raw))
  with pytest.raises(OSError) as e:
    prepared.prepared_records_sha256(paths)
  assert str(paths[0]) == e.value.filename and "rerun to prepare it again" in e.value.strerror
  assert cli.environment_error(e.value).startswith(f"{paths[0]}: corrupt prepared data (")
  ds = builders.open_dataset(from_configdict(saved).data)
  with pytest.raises(OSError, match="corrupt prepared data") as e:
    source = ds.source("validation")
    [source[i] for i in range(len(source))]  # pylint: disable=expression-not-assigned


def _hf_dir(tmp_path, name):
  d = tmp_path / name.replace(".", "_")
  d.mkdir()
  (d / "config.json").write_text(json.dumps({
      "model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_embd": 16, "n_layer": 1,
      "n_head": 2}))
  (d / name).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}garbage" * 3)
  return d


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_corrupt_converter_weights_are_one_line(tmp_path, name):
  with pytest.raises(ConvertError) as e:
    read_hf(str(_hf_dir(tmp_path, name)))
  assert str(e.value).startswith(f"{tmp_path / name.replace('.', '_') / name}: not a readable "
                                 "weights file (")
  assert "\n" not in str(e.value)


def test_a_sweep_file_that_raises_names_its_line(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text("import os\nVALUES = os.environ['NO_SUCH_VARIABLE_X']\n")
  with pytest.raises(spec.SweepError, match=rf"sweep file {path}:2: KeyError: 'NO_SUCH"):
    spec.load_sweep(str(path), base.get_config())
  path.write_text("def get_sweep():\n  return [{'a': 1 / 0}]\n")
  with pytest.raises(spec.SweepError, match=rf"sweep file {path}:2: ZeroDivisionError"):
    spec.load_sweep(str(path), base.get_config())


def test_no_training_examples_left_is_a_config_error(trained):
  """Lengths that drop every training pair are a ConfigError naming the keys (train.py reports
  it in one line), not a ValueError from deep in the pipeline."""
  from transformer.data import load_task  # pylint: disable=g-import-not-at-top
  with open(os.path.join(trained, "config.json")) as f:
    cd = ml_collections.ConfigDict(json.load(f))
  cd.data.update(max_source_len=2, too_long="drop")
  task = load_task(from_configdict(cd))
  with pytest.raises(ConfigError, match=r"data.max_source_len=2, data.max_target_len=12 with "
                     r"data.too_long='drop': no training example of .* is left \(\d+ dropped"):
    task.train_iterator()


@pytest.mark.slow  # a resume that trains and saves: ~30 s on 2 cores
def test_disk_full_while_saving_is_one_line_and_keeps_checkpoints(trained, tmp_path):
  """A resume whose checkpoint write fails (a file size limit: orbax's own writer gets EFBIG, as
  it gets ENOSPC from a full disk) ends with one line naming the file, no traceback (orbax's
  background threads log theirs), exit 1; the committed checkpoint is unchanged."""
  run = tmp_path / "run"
  shutil.copytree(trained, run)
  before = {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
  train = [sys.executable, "train.py", f"--config={_config_file(tmp_path, run)}",
           f"--workdir={run}", "--config.train.num_steps=62", "--config.checkpoint.every_steps=2"]
  limited = ("import os, resource, sys\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))\n"
             "os.execv(sys.executable, sys.argv[1:])\n")
  out = subprocess.run([sys.executable, "-c", limited, *train], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {run}/checkpoints/62.orbax-checkpoint-tmp") and (
      "File too large; a file size limit (ulimit -f) stopped the write" in last), last
  assert {p: p.read_bytes() for p in before} == before


def test_a_train_state_larger_than_memory_is_refused_before_allocating(trained):
  """A model whose train state (by shapes) exceeds the memory here is one ConfigError line with
  its parameter count, raised before anything is allocated (an allocation that size waits or is
  killed on a host)."""
  with open(os.path.join(trained, "config.json")) as f:
    cd = ml_collections.ConfigDict(json.load(f))
  cd.model.update(d_model=524288, num_heads=2, mlp_dim=1048576)
  from transformer.train import loop  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=r"model.d_model=524288, model.mlp_dim=1048576: the model "
                     r"has [\d,]+ parameters and its train state needs [\d,.]+ GiB, more than"):
    loop.train_and_evaluate(cd, os.path.join(os.path.dirname(trained), "huge"))
