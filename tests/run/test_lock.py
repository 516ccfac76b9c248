"""One writer per workdir (transformer/run/lock.py): a second train.py on a workdir being trained
refuses in one line and leaves the first run's checkpoints and metrics whole; a lock left by a dead
process is taken over; the lock goes at every exit; a directory holding files but no run is
refused."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import synthetic_task
from transformer.run import digests, lock
from transformer.train import loop

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")
ENV = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{TESTS}", JAX_PLATFORMS="cpu")

_HELD_TRAINER = textwrap.dedent("""
    import os, sys, time
    import synthetic_task
    from transformer.train import loop

    class Held(synthetic_task.ReverseTask):  # waits at batch 12 until the file sys.argv[2] exists
      def _train_batch(self, index):
        while index == 12 and not os.path.exists(sys.argv[2]):
          time.sleep(0.05)
        return super()._train_batch(index)

    cd = synthetic_task.config(**{"train.num_steps": 30, "checkpoint.every_steps": 10})
    loop.train_and_evaluate(cd, sys.argv[1], task=Held())
    """)


@pytest.mark.slow  # two processes importing JAX and a training run: ~70 s on 2 cores
def test_a_second_writer_refuses_and_the_first_run_stays_whole(tmp_path):
  """train.py on a workdir that a live process trains: exit 1, one line naming that process, and
  the first run ends with its own checkpoints and metrics (one row per step, none lost)."""
  run, go = str(tmp_path / "run"), str(tmp_path / "go")
  first = subprocess.Popen([sys.executable, "-c", _HELD_TRAINER, run, go], cwd=REPO, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 240
    while not os.path.isdir(os.path.join(run, "checkpoints", "10")):
      assert first.poll() is None and time.time() < deadline, first.stderr.read()[-3000:]
      time.sleep(0.2)
    holder = json.load(open(os.path.join(run, lock.LOCK_FILE)))
    assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
    second = subprocess.run([sys.executable, "train.py", "--config=configs/g2p.py:tiny",
                             f"--workdir={run}"], cwd=REPO, env=ENV, capture_output=True,
                            text=True, timeout=240)
    assert first.poll() is None, "the first run ended before the second one started"
  finally:
    open(go, "w").close()
    err = first.communicate(timeout=300)[1]
  assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr[-3000:]
  last = second.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and f"being trained by process {first.pid}" in last, last
  assert first.returncode == 0, err[-3000:]
  rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
  steps = [r["step"] for r in rows]
  assert steps == sorted(steps) and steps[-1] == 30  # one writer: no row twice, none lost
  assert [r["step"] for r in rows if "train/loss" in r] == [10, 20, 30]
  assert digests.verify_step(os.path.join(run, "checkpoints", "30")) is None
  assert open(os.path.join(run, lock.LOCK_FILE)).read() == ""  # released at exit


def _dead_pid():
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def test_a_stale_lock_is_taken_over_and_released_at_every_exit(tmp_path, caplog):
  path = tmp_path / lock.LOCK_FILE
  path.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(),
                              "started": "2026-01-01T00:00:00+00:00", "argv": ["train.py"]}))
  with caplog.at_level("WARNING"):
    with lock.writer_lock(str(tmp_path)):
      assert json.loads(path.read_text())["pid"] == os.getpid()
  assert any("took over the stale lock" in r.getMessage() for r in caplog.records)
  assert path.read_text() == ""
  with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C, an exception: released as well
    with lock.writer_lock(str(tmp_path)):
      raise KeyboardInterrupt
  assert path.read_text() == ""


def test_a_workdir_the_lock_created_is_removed_when_the_run_fails_at_once(tmp_path):
  """A body that raises before writing anything (a bad data path) leaves no workdir it created,
  nor a train.lock; a workdir that existed, or one written to, stays."""
  new = tmp_path / "new"
  with pytest.raises(ValueError):
    with lock.writer_lock(str(new)):
      raise ValueError("data.text_file: no such file")
  assert not new.exists()
  existing = tmp_path / "existing"
  existing.mkdir()
  with pytest.raises(ValueError):
    with lock.writer_lock(str(existing)):
      raise ValueError("bad")
  assert (existing / lock.LOCK_FILE).read_text() == ""
  with pytest.raises(ValueError):
    with lock.writer_lock(str(new)):
      (new / "config.json").write_text("{}")
      raise ValueError("bad")
  assert sorted(os.listdir(new)) == ["config.json", lock.LOCK_FILE]


def test_a_live_holder_and_another_hosts_lock_are_refused(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
      import sys, time
      from transformer.run import lock
      with lock.writer_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
      """), str(tmp_path)], cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(lock.WorkdirError, match=f"being trained by process {holder.pid} ") as e:
      with lock.writer_lock(str(tmp_path)):
        pass
    assert e.value.__context__ is None  # no OSError behind it for the entry points to name
  finally:
    holder.kill()
    holder.wait()
  other = tmp_path / "other"
  other.mkdir()
  (other / lock.LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1}))
  with pytest.raises(lock.WorkdirError, match="on elsewhere .*cannot be checked from this host"):
    with lock.writer_lock(str(other)):
      pass


def test_a_directory_with_files_but_no_run_is_refused(tmp_path):
  (tmp_path / "config.json").write_text('{"unrelated": true}')  # someone else's, no checkpoints
  (tmp_path / "notes.txt").write_text("mine")
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("mine")
  cd = synthetic_task.config(**{"train.num_steps": 10})
  for directory, names in ((tmp_path, "config.json, notes.txt, other"), (other, "notes.txt")):
    with pytest.raises(lock.WorkdirError, match=f"--workdir={directory} holds files but no run "
                       rf"\({names}\); give a new or empty directory"):
      loop.train_and_evaluate(cd, str(directory), task=synthetic_task.ReverseTask())
  assert os.listdir(other) == ["notes.txt"]
  assert (tmp_path / "config.json").read_text() == '{"unrelated": true}'
  assert sorted(os.listdir(tmp_path)) == ["config.json", "notes.txt", "other"]
