"""The command-line tools say what comes next and show nothing but their own lines.

Data preparation is one line of ours; a finished or mismatched workdir logs no orbax warnings;
`--help` is one screen that exits 0 and `--help_keys` lists every key; a schedule whose warmup
lasts the whole run warns in one line; the progress bar always shows the loss; predict answers
each stdin line as it arrives; JAX's accelerator guesses stay off a CPU run; the API restores a
run without TFDS's notes. train.py's last lines
(the workdir and the next commands): tests/e2e/test_train.py; eval.py naming the files it wrote:
tests/infer/test_evaluation.py.
"""

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

import g2p_mini
from transformer import cli, keyspec, schema
from transformer.config import from_configdict
from transformer.data import builders
from transformer.run import reporting
from transformer.run.checkpoints import CheckpointError
from transformer.train import loop, start

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
TOOLS = ("train.py", "eval.py", "sweep.py")


def _run(args, **kw):
  return subprocess.run([sys.executable, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=300, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  return g2p_mini.trained_run(tmp_path_factory)


def test_data_preparation_is_one_line_of_ours(tmp_path, capfd):
  """Preparing a dataset prints one `preparing NAME in DIR ...` line on stderr and none of TFDS's
  lines or progress bars; a prepared one prints nothing."""
  train = tmp_path / "train.tsv"
  train.write_text("".join(f"w{i}\tA{i % 7} B\n" for i in range(200)))
  cd = schema.get_config()
  cd.data.update(dataset="tsv_pairs", data_dir=str(tmp_path / "tfds"), train_file=str(train))
  capfd.readouterr()
  ds = builders.open_dataset(from_configdict(cd).data)
  out, err = capfd.readouterr()
  assert out == ""
  assert err.splitlines() == [f"preparing {ds.name}/1.1.0 in {ds.root} (first use, offline) ..."]
  builders.open_dataset(from_configdict(cd).data)
  assert capfd.readouterr() == ("", "")


def test_finished_and_mismatched_workdirs_log_no_orbax_warnings(trained, tmp_path, caplog):
  """Training a finished workdir again trains nothing (FINISHED_BEFORE in its metrics: train.py
  then prints one line) and another model in it is one CheckpointError line; neither logs orbax's
  "read only" warnings. (train.py's own lines: tests/e2e/test_train.py.)"""
  import ml_collections  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "run")
  shutil.copytree(trained, workdir)
  with open(os.path.join(workdir, "config.json")) as f:
    cd = ml_collections.ConfigDict(json.load(f))
  with caplog.at_level(logging.WARNING):
    again = loop.train_and_evaluate(cd, workdir)
    assert again[loop.FINISHED_BEFORE] == 1.0
    cd.model.d_model = 48
    with pytest.raises(CheckpointError, match="model.d_model=32, this config has 48"):
      loop.train_and_evaluate(cd, workdir)
  assert [r.getMessage() for r in caplog.records if "orbax" in r.pathname] == []


@pytest.mark.parametrize("tool", TOOLS)
def test_help_is_one_screen_and_exits_0(tool):
  """--help exits 0 in at most 60 lines: the tool's flags, where every config key is documented
  and how to list them."""
  out = _run([tool, "--help"])
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert len(lines) <= cli.HELP_LINES, len(lines)
  assert "--workdir" in out.stdout and "docs/config.md" in out.stdout
  assert f"python {tool} --help_keys" in out.stdout
  assert out.stderr == ""


def test_the_api_restores_a_run_without_library_notes(trained):
  """`python -c "import transformer; transformer.restore(W)"` (the README's API) prints the run
  and nothing on stderr: no TFDS "Using custom data configuration" note for our builders."""
  out = _run(["-c", f"import transformer; print(transformer.restore({trained!r}))"])
  assert out.returncode == 0 and out.stdout.startswith("Run("), out.stderr[-2000:]
  assert "Using custom data configuration" not in out.stderr, out.stderr


def test_help_keys_lists_every_key_with_its_default():
  """--help_keys prints every config key of configs/base.py, one per line under its section."""
  out = _run(["train.py", "--help_keys"])
  assert out.returncode == 0, out.stderr[-2000:]
  keys, section = {}, None
  for line in out.stdout.splitlines()[1:]:
    if line.startswith("  "):
      name, value = line.strip().split(" = ", 1)
      value, _, meaning = value.partition("  # ")
      assert meaning, line  # each key with its meaning from the schema
      keys[f"{section}.{name}" if section else name] = value
    else:
      section = "" if line == "(top level):" else line.rstrip(":")
  assert keys == {k: repr(v) for k, v in keyspec.flat_items(schema.get_config()).items()}


def test_warmup_longer_than_the_run_warns_in_one_line():
  """num_steps <= warmup_steps with a decaying schedule: one line naming both keys (train.py logs
  it before training); none for a constant schedule or a run longer than its warmup."""
  def warning(**train):
    cfg = from_configdict(schema.get_config())
    return start.schedule_warning(
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train)))
  got = warning(num_steps=100, warmup_steps=100, schedule="warmup_cosine")
  assert "\n" not in got and "train.num_steps=100" in got and "train.warmup_steps=100" in got
  assert "train.num_steps=50" in warning(num_steps=50, warmup_steps=100, schedule="rsqrt")
  assert warning(num_steps=101, warmup_steps=100, schedule="warmup_cosine") == ""
  assert warning(num_steps=100, warmup_steps=100, schedule="constant") == ""


def test_progress_bar_always_shows_the_loss(tmp_path):
  """Once a loss is known (the first step's, then each logged one), every later step's bar shows
  it, also after a throughput window has given tokens/s."""
  rep = reporting.Reporter(str(tmp_path), {}, True, total_steps=10, show_progress=True)
  rep.progress(1, 3.5)
  assert "loss=3.5000" in str(rep._bar.postfix)
  rep.add_tokens(100, 60)
  rep.write_scalars(2, {"train/loss": 2.25} | rep.throughput())
  for step in (3, 4):
    rep.progress(step)
    assert "loss=2.2500" in str(rep._bar.postfix) and "tok/s" in str(rep._bar.postfix)
  rep.close()


def test_predict_answers_each_line_as_it_arrives(trained):
  """Over a pipe, predict prints a line's answer before its stdin is closed."""
  proc = subprocess.Popen([sys.executable, "-m", "transformer.infer.predict", f"--workdir={trained}"],
                          cwd=REPO, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    answers = []
    for word in ("cat", "dog"):
      proc.stdin.write(word + "\n")
      proc.stdin.flush()
      deadline = time.time() + 120
      import select  # pylint: disable=g-import-not-at-top
      ready = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))[0]
      assert ready, "no answer before stdin was closed"
      answers.append(proc.stdout.readline())
    assert [a.split("\t")[0] for a in answers] == ["cat", "dog"]
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
  finally:
    proc.kill()


def test_jax_accelerator_guesses_are_muted(monkeypatch):
  """On a CPU, JAX's "An NVIDIA GPU may be present ..." is dropped by the filter the tools
  install; JAX's other backend warnings are kept."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import hardware_utils, xla_bridge  # pylint: disable=g-import-not-at-top
  jax.devices()
  seen = []

  class Keep(logging.Handler):
    def emit(self, record):
      seen.append(record.getMessage())

  logger = logging.getLogger("jax._src.xla_bridge")
  logger.removeFilter(cli.not_backend_guess)  # an earlier in-process tool may have installed it
  handler = Keep()
  logger.addHandler(handler)
  monkeypatch.setattr(hardware_utils, "has_visible_nvidia_gpu", lambda: True)
  try:
    xla_bridge._suggest_missing_backends()
    assert any("NVIDIA GPU may be present" in m for m in seen)  # JAX does say it
    seen.clear()
    cli.quiet_backends()
    xla_bridge._suggest_missing_backends()
    logger.warning("CUDA backend failed to initialize: x")
    assert seen == ["CUDA backend failed to initialize: x"]
  finally:
    logger.removeHandler(handler)
    logger.removeFilter(cli.not_backend_guess)
