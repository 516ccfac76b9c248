"""Every choice discoverable, every --help ours, every command quiet when its output pipe closes.

`--help_keys` lists each choice key's allowed values (transformer/choices.py's names included) and each
range; a wrong value of a choice key gets "did you mean"; predict's and convert's --help are our
own short screens (absl's list under --helpfull); predict with no input says what it expects
(status 2) and prompts on a terminal; a closed output pipe (`... | head -1`) ends train.py,
eval.py, sweep.py, predict and convert with status 141 and no traceback.
"""

import fcntl
import io
import os
import pty
import subprocess
import sys

import pytest

import g2p_mini
from transformer import cli, keyspec, schema
from transformer.infer import predict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
PREDICT = ("-m", "transformer.infer.predict")
CONVERT = ("-m", "transformer.convert")
NOISE = ("Traceback", "BrokenPipeError", "Exception ignored")


def _run(args, **kw):
  return subprocess.run([sys.executable, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=300, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  return g2p_mini.trained_run(tmp_path_factory)


def _key_lines(stdout: str) -> dict[str, str]:
  """{dotted key: its line} of --help_keys' output."""
  keys, section = {}, ""
  for line in stdout.splitlines()[1:]:
    if line.startswith("  "):
      name = line.strip().split(" = ", 1)[0]
      keys[f"{section}.{name}" if section else name] = line
    else:
      section = "" if line == "(top level):" else line.rstrip(":")
  return keys


def test_help_keys_lists_every_choice_and_range():
  """Each choice key's line ends with its allowed values (a named choice's: transformer/choices.py's
  names, e.g. model.ffn's swiglu), each ranged key's with its range."""
  out = _run(["train.py", "--help_keys"])
  assert out.returncode == 0, out.stderr[-2000:]
  lines = _key_lines(out.stdout)
  assert "|swiglu|" in lines["model.ffn"] and "|rope|" in lines["model.positional"]
  for k in schema.SCHEMA:
    if k.choices():
      shown = "|".join(str(c) if c != "" else repr(c) for c in k.choices())
      # listed once: by the meaning ("min | max") or after it
      assert lines[k.name].count(" | ") == 0 or "(one of" not in lines[k.name], lines[k.name]
      assert lines[k.name].endswith(f"(one of {shown})") or all(
          str(c) in lines[k.name] for c in k.choices()), lines[k.name]
    elif k.range:
      assert lines[k.name].endswith(f"({k.range})"), lines[k.name]
  assert lines["model.ffn"].endswith("|squared_relu)")  # choices.FFNS' names
  assert lines["train.early_stop_mode"].endswith("# min | max"), lines["train.early_stop_mode"]


def test_help_keys_shows_the_config_files_values():
  """--help_keys --config=FILE:ARG shows that config's values (:tiny's batch of 64, not the
  default 128); a missing file is one line."""
  out = _run(["train.py", "--help_keys", "--config=configs/g2p.py:tiny"])
  assert out.returncode == 0, out.stderr[-2000:]
  assert "configs/g2p.py:tiny" in out.stdout.splitlines()[0]
  assert _key_lines(out.stdout)["data.batch_size"].startswith("  batch_size = 64  #")
  out = _run(["train.py", "--help_keys", "--config=configs/nope.py"])
  assert (out.returncode, out.stderr) == (1, "error: --config file configs/nope.py not found\n")


@pytest.mark.parametrize("override, hint", [
    ("model.ffn=swiglo", "did you mean 'swiglu'?"),  # a key of choices.py's names
    ("model.norm_position=pree", "did you mean 'pre'?"),  # a key of literal choices
])
def test_a_wrong_choice_gets_a_suggestion(override, hint, tmp_path):
  out = _run(["train.py", "--config=configs/g2p.py:tiny", f"--workdir={tmp_path / 'w'}",
              f"--config.{override}"])
  assert out.returncode == 1
  key, value = override.split("=")
  assert out.stderr == f"error: {key}={value!r} is not one of " + out.stderr.split(
      " is not one of ", 1)[1]
  assert out.stderr.rstrip("\n").endswith(hint) and out.stderr.count("\n") == 1, out.stderr


def test_a_far_value_gets_no_suggestion():
  assert str(keyspec.not_one_of("model.ffn", "xyz", ("relu", "gelu"))) == (
      "model.ffn='xyz' is not one of relu|gelu")
  assert str(keyspec.not_one_of("model.norm_position", "psot", ("post", "pre"))).endswith(
      "; did you mean 'post'?")


@pytest.mark.parametrize("command", [PREDICT, CONVERT])
def test_own_commands_print_our_short_help(command):
  """--help: a usage line, what it does with an example, the flags; no absl internals, which
  --helpfull lists."""
  out = _run([*command, "--help"])
  assert out.returncode == 0 and out.stderr == "", out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith(f"usage: python {' '.join(command)} ") and len(lines) <= cli.HELP_LINES
  assert any(line.startswith(f"  python {' '.join(command)} --") for line in lines)  # an example
  assert "  --workdir: " in out.stdout and "--helpfull" in out.stdout
  assert "flagfile" not in out.stdout and "undefok" not in out.stdout
  full = _run([*command, "--helpfull"])
  assert full.returncode == 0 and "--flagfile" in full.stdout and "--workdir" in full.stdout


def test_entry_points_keep_helpfull():
  out = _run(["eval.py", "--helpfull"])
  assert out.returncode == 0 and "--flagfile" in out.stdout and "--split" in out.stdout


def test_predict_without_input_says_what_it_expects(trained):
  """No arguments and empty stdin: one line naming both ways to give inputs, status 2 (at once
  for stdin already at its end, after the restore for a stream that ends empty)."""
  out = _run([*PREDICT, "--workdir=/nonexistent"], stdin=subprocess.DEVNULL)
  assert out.returncode == 2 and out.stdout == ""
  assert out.stderr == f"error: {predict.NO_INPUT.format(prog=predict.PROG)}\n"
  assert "arguments" in out.stderr and "one per line on standard input" in out.stderr
  assert predict.main([f"--workdir={trained}"], stdin=io.StringIO("")) == 2


def test_predict_prompts_on_a_terminal(trained):
  """stdin a terminal: a prompt on stderr before each line read; the answers on stdout."""
  controller, terminal = pty.openpty()
  proc = subprocess.Popen([sys.executable, *PREDICT, f"--workdir={trained}"], cwd=REPO, env=ENV,
                          stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  os.close(terminal)
  try:
    os.write(controller, b"cat\n\x04")  # a word, then Ctrl-D
    out, err = proc.communicate(timeout=300)
  finally:
    proc.kill()
    os.close(controller)
  assert proc.returncode == 0, err
  assert out.split("\t")[0] == "cat" and out.count("\n") == 1
  assert err.count(predict.PROMPT) == 2 and "Ctrl-D" in err, err  # before "cat" and before the end


def _closed_early(args, read_first_line: bool) -> tuple[int, bytes, bytes]:
  """(status, the bytes read, stderr) of `python args` whose stdout, a 4 KiB pipe, is closed at
  once or after its first line."""
  read_end, write_end = os.pipe()
  fcntl.fcntl(read_end, 1031, 4096)  # F_SETPIPE_SZ: a longer output blocks until read
  proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=ENV, stdin=subprocess.DEVNULL,
                          stdout=write_end, stderr=subprocess.PIPE)
  os.close(write_end)
  got = b""
  while read_first_line and b"\n" not in got and (chunk := os.read(read_end, 1)):
    got += chunk
  os.close(read_end)
  _, err = proc.communicate(timeout=300)
  return proc.returncode, got, err


@pytest.mark.parametrize("args", [
    ("train.py", "--help"), ("eval.py", "--help"), ("sweep.py", "--help"), (*PREDICT, "--help"),
    (*CONVERT, "--help"), ("eval.py", "--help_keys"),
    ("sweep.py", "--config=configs/g2p.py:tiny", "--sweep=configs/sweeps/positional.py",
     "--workdir=/tmp/never_written", "--dry_run"),
])
def test_a_closed_output_pipe_ends_quietly(args):
  status, _, err = _closed_early(args, read_first_line=False)
  assert status == cli.CLOSED_PIPE_STATUS and not any(n.encode() in err for n in NOISE), err


def test_help_keys_piped_into_head_ends_quietly():
  """`train.py --help_keys | head -1`: the first line arrives, then the pipe closes."""
  status, got, err = _closed_early(("train.py", "--help_keys"), read_first_line=True)
  assert got.startswith(b"Every config key")
  assert status == cli.CLOSED_PIPE_STATUS and not any(n.encode() in err for n in NOISE), err


def test_predict_piped_into_head_ends_quietly(trained):
  status, got, err = _closed_early((*PREDICT, f"--workdir={trained}", "cat", "dog"),
                                   read_first_line=True)
  assert got.startswith(b"cat\t") or got == b""
  assert status in (0, cli.CLOSED_PIPE_STATUS) and not any(n.encode() in err for n in NOISE), err
  status, _, err = _closed_early((*PREDICT, f"--workdir={trained}", "cat"), read_first_line=False)
  assert status == cli.CLOSED_PIPE_STATUS and not any(n.encode() in err for n in NOISE), err
