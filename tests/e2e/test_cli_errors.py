"""Bad input to every command-line tool is one line naming the culprit, and nothing saved is lost.

One table of cases over train.py, eval.py, sweep.py, `python -m transformer.infer.predict` and the
notebook's `restore()`: missing and truncated checkpoints, a workdir of another config, empty,
binary and huge input files, unknown characters, wrong types on the command line. Each case runs
on its own copy of one small trained run (tests/g2p_mini.py) and checks: a non-zero exit, no
traceback, the last stderr line names the culprit, and every file that existed before is
byte-for-byte unchanged. `cli` cases run the tool as a subprocess; `lib` cases call, in this
process, the function the tool calls and require the exception types the tool turns into its
one-line message (this keeps the file fast: each subprocess pays ~3-5 s to import JAX). Last, a
data preparation SIGKILLed half way is never read: the next run prepares the data again.
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import g2p_mini
from configs import base
from transformer.config import from_configdict
from transformer.data import builders
from transformer.data.task import read_records
from transformer.infer import api, evaluation, predict
from transformer.run.checkpoints import CheckpointError
from transformer.train import loop

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
# What eval.py, train.py and predict turn into `error: <first line>` (ConfigError is a ValueError).
CAUGHT = {"eval": (ValueError, OSError, CheckpointError),
          "train": (ValueError, CheckpointError, loop.TrainingDiverged),
          "restore": (ValueError, OSError, CheckpointError)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  return g2p_mini.trained_run(tmp_path_factory)


# ----------------------------------------------------------------------------- setups
# Each takes (the trained workdir, this case's tmp dir) and returns the {placeholders} of its args.


def _copy(trained, tmp):
  shutil.copytree(trained, tmp / "run")
  return str(tmp / "run")


def run_copy(trained, tmp):
  return {"W": _copy(trained, tmp)}


def no_checkpoints(trained, tmp):
  shutil.rmtree(os.path.join(w := _copy(trained, tmp), "checkpoints"))
  return {"W": w}


def truncated(trained, tmp):
  """The newest checkpoint's state files cut to 100 bytes (a disk that filled up mid-copy)."""
  w = _copy(trained, tmp)
  step = max(int(n) for n in os.listdir(os.path.join(w, "checkpoints")) if n.isdigit())
  for root, _, names in os.walk(os.path.join(w, "checkpoints", str(step), "state")):
    for name in names:
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(min(100, os.path.getsize(f.name)))
  return {"W": w}


def foreign_config(trained, tmp):
  """config.json of another model (d_model 48) next to the run's checkpoints."""
  w = _copy(trained, tmp)
  with open(os.path.join(w, "config.json")) as f:
    saved = json.load(f)
  saved["model"]["d_model"] = 48
  with open(os.path.join(w, "config.json"), "w") as f:
    json.dump(saved, f)
  return {"W": w}


def binary_config(trained, tmp):
  w = _copy(trained, tmp)
  with open(os.path.join(w, "config.json"), "wb") as f:
    f.write(bytes(range(256)))
  return {"W": w}


def config_file(trained, tmp):
  """A config file (for train.py) giving the trained run's own config, a copy of the run, and a
  binary, an empty and a missing data file."""
  w = _copy(trained, tmp)
  (tmp / "cfg.py").write_text(
      "import json\nimport ml_collections\n\ndef get_config(arg=None):\n"
      f"  return ml_collections.ConfigDict(json.load(open({os.path.join(w, 'config.json')!r})))\n")
  (tmp / "bin.tsv").write_bytes(b"cat\tK AE T\n\x89PNG\r\n\x1a\n\x00\x00")
  (tmp / "empty.tsv").write_bytes(b"")
  (tmp / "variant.py").write_text(
      "def get_config(arg=None):\n  sizes = {'a': 1}\n  return sizes[arg]\n")
  (tmp / "none.py").write_text("def get_config():\n  pass\n")
  return {"W": w, "C": str(tmp / "cfg.py"), "T": str(tmp), "V": str(tmp / "variant.py"),
          "N": str(tmp / "none.py")}


def empty_dir(trained, tmp):
  del trained
  return {"W": str(tmp)}


# ----------------------------------------------------------------------------- the table
# (tool, setup, arguments (placeholders in braces), stdin, culprit in the last stderr line)
CLI = [
    ("train.py", config_file, ["--config=configs/g2p.py:huge", "--workdir={T}/new"], None,
     "configs/g2p.py: unknown variant 'huge' (one of tiny, fast, best, small, base, ablate, gpu)"),
    ("train.py", config_file, ["--config={V}:b", "--workdir={T}/new"], None,
     "variant.py:3: KeyError: 'b'"),
    ("train.py", config_file, ["--config={T}/nope.py", "--workdir={T}/new"], None, "nope.py not found"),
    ("train.py", config_file, ["--config={N}", "--workdir={T}/new"], None,
     "none.py: get_config() returned None (it must return an ml_collections.ConfigDict)"),
    ("train.py", config_file, ["--config={C}", "--workdir={W}", "--config.train.num_steps=ten"],
     None, "--config.train.num_steps=ten: must be an integer"),
    ("train.py", config_file, ["--config={C}", "--workdir={T}/new", "--config.train.num_steps=1e3",
                               "--config.data.train_file=/no/such.tsv"], None,
     "error: data.train_file='/no/such.tsv': no such file"),  # 1e3 taken; the data is the culprit
    ("train.py", config_file, ["--config={C}", "--workdir={W}", "--config.model.d_modle=8"], None,
     "--config.model.d_modle: unknown config key (not a key of configs/base.py); did you mean "
     "--config.model.d_model?"),
    ("train.py", config_file, ["--config={C}", "--workdir={W}", "extra"], None,
     "unexpected arguments: extra"),
    ("train.py", config_file, ["--config={C}", "--workdir={T}/new", "--config.data.data_dir={T}/d",
                               "--config.data.train_file={T}/bin.tsv"], None,
     "bin.tsv:2: not UTF-8 text (byte 0x89)"),
    ("eval.py", truncated, ["--workdir={W}"], None, "fails verification"),
    ("eval.py", run_copy, ["--workdir={W}", "--config=configs/g2p.py"], None,
     "--config: eval.py takes no config file"),
    ("eval.py", run_copy, ["--workdir={W}", "--config.eval.decode.beam_size=2.5"], None,
     "--config.eval.decode.beam_size=2.5"),
    ("sweep.py", config_file, ["--config=configs/g2p.py:huge", "--sweep=configs/sweeps/norm.py",
                               "--workdir={T}/s"], None, "unknown variant 'huge'"),
    ("sweep.py", config_file, ["--config={C}", "--sweep=configs/sweeps/norm.py", "--workdir={T}/s",
                               "--parallel=two"], None, "--parallel=two: invalid literal"),
    ("predict", run_copy, ["--workdir={W}", "--beam_size=four", "cat"], None, "--beam_size"),
]
LIB = [
    ("eval", no_checkpoints, lambda w: evaluation.evaluate_split(w, verbose=False), "no checkpoints in"),
    ("eval", empty_dir, lambda w: evaluation.evaluate_split(w, verbose=False), "config.json not found"),
    ("eval", binary_config, lambda w: evaluation.evaluate_split(w, verbose=False),
     "config.json: not a JSON config"),
    ("eval", foreign_config, lambda w: evaluation.evaluate_split(w, verbose=False),
     "config.json is not the config checkpoint"),
    ("eval", run_copy, lambda w: evaluation.evaluate_split(w, step="newest", verbose=False),
     "--step='newest' must be an integer"),
    ("eval", run_copy, lambda w: evaluation.evaluate_split(w, step=7, verbose=False),
     "no checkpoint for step 7"),
    ("eval", run_copy, lambda w: evaluation.evaluate_split(w, split="dev", verbose=False),
     "split 'dev' of"),
    ("eval", run_copy, lambda w: evaluation.evaluate_split(w, overrides={"model.d_model": 8}),
     "--config.model.d_model cannot be overridden at evaluation"),
    ("restore", truncated, api.restore, "fails verification"),
    ("restore", no_checkpoints, api.restore, "no checkpoints in"),
    ("restore", foreign_config, api.restore, "trained with: model.d_model=48 (trained with 32)"),
    ("train", run_copy, lambda w: loop.train_and_evaluate(_json_config(w, 48), w),
     "holds a run with model.d_model=32, this config has 48"),
    ("train", config_file, lambda w: loop.train_and_evaluate(
        _json_config(w, train_file=os.path.join(os.path.dirname(w), "empty.tsv")),
        os.path.join(os.path.dirname(w), "new")), "empty.tsv: no 'source<TAB>target' lines"),
    ("train", run_copy, lambda w: loop.train_and_evaluate(
        _json_config(w, train_file="/no/such.tsv"), w), "data.train_file='/no/such.tsv'"),
]
# predict's main, in this process: (stdin bytes or None, inputs, culprit in the last stderr line)
PREDICT = [
    (None, ["h\u00e9llo"], "outside the model's vocabulary: '\u00e9'"),
    (b"cat\n\xff\xfe\x00binary\n", [], "input 2 '\\udcff\\udcfe\\x00binary' is not UTF-8 text"),
    ("x" * 100_000 + "\n", [], "(100000 characters) is too long: 100001 tokens"),
    (b"cat\n\n", [], "input 2 '' is empty"),
]


def _json_config(workdir, d_model=None, train_file=None):
  """The workdir's config.json as a ConfigDict, with model.d_model or data.train_file changed (its
  data then prepared next to the workdir)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, "config.json")) as f:
    cd = ml_collections.ConfigDict(json.load(f))
  if d_model:
    cd.model.d_model = d_model
  if train_file:
    cd.data.update(train_file=train_file, data_dir=os.path.join(os.path.dirname(workdir), "d"))
  return cd


def _snapshot(root):
  """Every file under root -> its bytes."""
  return {os.path.join(d, n): open(os.path.join(d, n), "rb").read()
          for d, _, names in os.walk(root) for n in names}


def _check_one_line(err, culprit):
  assert "Traceback" not in err, err[-3000:]
  last = err.strip().splitlines()[-1] if err.strip() else ""
  assert last.startswith("error: ") and culprit in last, err[-3000:]


@pytest.mark.parametrize("tool,setup,args,stdin,culprit", CLI,
                         ids=[f"{c[0]}:{c[1].__name__}:{i}" for i, c in enumerate(CLI)])
def test_cli_bad_input_is_one_line(trained, tmp_path, tool, setup, args, stdin, culprit):
  """The tool exits non-zero with one `error:` line naming the culprit, no traceback, and leaves
  every file of the run's workdir and of the case's directory as it was."""
  subs = setup(trained, tmp_path)
  before = _snapshot(tmp_path)
  cmd = ([sys.executable, "-m", "transformer.infer.predict"] if tool == "predict"
         else [sys.executable, tool])
  out = subprocess.run(cmd + [a.format(**subs) for a in args], cwd=REPO, env=ENV, input=stdin,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode != 0, out.stdout[-2000:]
  _check_one_line(out.stderr, culprit.format(**subs))
  after = _snapshot(tmp_path)
  assert {p: after.get(p) for p in before} == before


@pytest.mark.parametrize("kind,setup,call,culprit", LIB,
                         ids=[f"{c[0]}:{c[1].__name__}:{i}" for i, c in enumerate(LIB)])
def test_library_bad_input_is_one_line(trained, tmp_path, kind, setup, call, culprit):
  """What eval.py / train.py / restore() call raises an exception type the tool reports as one
  line (CAUGHT), whose message is one line naming the culprit; no file that existed changes."""
  w = setup(trained, tmp_path)["W"]
  before = _snapshot(tmp_path)
  with pytest.raises(CAUGHT[kind]) as e:
    call(w)
  message = str(e.value)
  assert "\n" not in message.strip() and culprit in message, message
  after = _snapshot(tmp_path)
  assert {p: after.get(p) for p in before} == before


def test_predict_bad_inputs_are_one_line_each(trained, capsys):
  """predict: unknown characters, a binary stdin line, a 100,000-character line and an empty
  line each get one `error:` line naming the input (shown cut short), good lines still decode,
  and the exit status is 1."""
  for stdin, inputs, culprit in PREDICT:
    if isinstance(stdin, bytes):
      stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8", errors="surrogateescape")
    elif stdin is not None:
      stdin = io.StringIO(stdin)
    assert predict.main([f"--workdir={trained}", *inputs], stdin=stdin) == 1
    out, err = capsys.readouterr()
    _check_one_line(err, culprit)
    assert all(len(line) < 300 for line in err.splitlines())
    assert out == "" or out.startswith("cat\t")


# ----------------------------------------------------------------------------- interrupted prepare

_PREPARE = """
import os, signal, sys, time
import tensorflow_datasets as tfds
from configs import base
from transformer.config import from_configdict
from transformer.data import builders
data_dir, train, point = sys.argv[1:]
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if point == "split_files_written":  # every split file written; dataset_info.json and rename next
  tfds.core.DatasetInfo.write_to_directory = die
if point == "generating":  # slow the examples down so that the parent kills us mid-way
  read = builders.read_tsv_pairs
  builders.read_tsv_pairs = lambda path: ((time.sleep(0.002), r)[1] for r in read(path))
c = base.get_config()
c.data.update(dataset="tsv_pairs", data_dir=data_dir, train_file=train)
builders.open_dataset(from_configdict(c).data)
"""


@pytest.mark.parametrize("point", ["generating", "split_files_written"])
def test_interrupted_data_preparation_is_never_used(tmp_path, point):
  """A `download_and_prepare` SIGKILLed half way (while generating examples: killed by us once
  TFDS's `incomplete.*` directory appears; or after all split files are written, before TFDS
  writes dataset_info.json and renames the directory) leaves no prepared dataset, and the next
  open_dataset prepares it again and reads exactly the file's records."""
  lines = [(f"w{i}", f"A{i % 7} B") for i in range(2000)]
  train = tmp_path / "train.tsv"
  train.write_text("".join(f"{w}\t{p}\n" for w, p in lines))
  data_dir = tmp_path / "tfds"
  proc = subprocess.Popen([sys.executable, "-c", _PREPARE, str(data_dir), str(train), point],
                          cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while proc.poll() is None and time.time() < deadline:
    if point == "generating" and list(data_dir.glob("tsv_pairs/*/incomplete.*")):
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.02)
  assert proc.wait(timeout=60) == -signal.SIGKILL
  assert list(data_dir.glob("tsv_pairs/*/incomplete.*"))  # killed mid-way: the half-written copy
  assert not list(data_dir.glob("tsv_pairs/*/1.0.0"))  # ... and nothing TFDS would read
  cd = base.get_config()
  cd.data.update(dataset="tsv_pairs", data_dir=str(data_dir), train_file=str(train))
  ds = builders.open_dataset(from_configdict(cd).data)
  got = [r for s in ds.splits for r in read_records(ds.source(s), ("source", "target"))]
  assert sorted(got) == sorted(lines)
