"""transformer/run/guard.py, the one guard every writer goes through: a run's workdir and what
lies inside it are written only by that run's own commands; a file is replaced only when the
command wrote it itself. Its writers: train.py's workdir, eval.py --out, sweep.py's workdir,
compare --plot."""

import json
import os

import pytest

from tests.run.test_compare import make_run
from transformer.infer import evaluation
from transformer.run import compare
from transformer.run import guard
from transformer.run.restore import EvaluationError


def _run(path):
  os.makedirs(path / "checkpoints")
  (path / "config.json").write_text("{}")
  (path / "tokenizers").mkdir()
  return str(path)


def test_a_runs_workdir_is_written_only_by_its_own_commands(tmp_path):
  run = _run(tmp_path / "run")
  guard.check(run, "--workdir", ["metrics.test.json"], own=run)  # its own root: any of its files
  for target, own in ((run, None), (os.path.join(run, "tokenizers"), run),
                      (os.path.join(run, "new", "deeper"), None)):
    with pytest.raises(guard.WriteRefused) as e:
      guard.check(target, "--out", own=own)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"--out={target} is ")
    assert run in str(e.value)
  with pytest.raises(guard.WriteRefused, match=r"is inside the run .*run: only that run's own"):
    guard.check(os.path.join(run, "curves.png"), "--plot", is_file=True)


def test_a_file_is_replaced_only_when_the_command_wrote_it(tmp_path):
  """A user's file of a name the command writes is refused (unless overwrite); what the command
  wrote is recorded and replaced by the next write; edited since, it is the user's again."""
  out = tmp_path / "out"
  out.mkdir()
  (out / "metrics.test.json").write_text("the user's")
  (out / "notes.txt").write_text("kept")
  with pytest.raises(guard.WriteRefused, match=rf"^--out={out}: {out}/metrics.test.json exists "
                     r"and was not written here by this command; give a new directory$"):
    guard.check(str(out), "--out", ["metrics.test.json", "predictions.test.jsonl"])
  guard.check(str(out), "--out", ["metrics.test.json"], overwrite=True)
  guard.check(str(out), "--out", ["notes2.txt"])  # other files of the directory: no matter
  fresh = tmp_path / "fresh"
  guard.write_bytes(str(fresh), "metrics.test.json", b"{}")
  guard.check(str(fresh), "--out", ["metrics.test.json"])  # its own: replaced
  assert json.loads((fresh / guard.RECORD).read_text()).keys() == {"metrics.test.json"}
  (fresh / "metrics.test.json").write_text("edited by hand")
  with pytest.raises(guard.WriteRefused):
    guard.check(str(fresh), "--out", ["metrics.test.json"])
  (tmp_path / "afile").write_text("x")
  with pytest.raises(guard.WriteRefused, match=r"is a file, not a directory"):
    guard.check(str(tmp_path / "afile"), "--out", ["m.json"])
  with pytest.raises(guard.WriteRefused, match=r"is a directory: name a file"):
    guard.check(str(out), "--plot", is_file=True)


def test_eval_out_is_guarded(tmp_path):
  """eval.py --out: never inside a run (its own only at its root), never over a user's file."""
  run = _run(tmp_path / "run")
  evaluation._check_out_dir([run], run, "test")  # pylint: disable=protected-access
  user = tmp_path / "user"
  user.mkdir()
  (user / "predictions.test.jsonl").write_text("mine\n")
  for out in (str(user), os.path.join(run, "tokenizers")):
    with pytest.raises(EvaluationError, match=f"^--out={out}"):
      evaluation._check_out_dir([run], out, "test")  # pylint: disable=protected-access
  evaluation._check_out_dir([run], str(user), "validation")  # pylint: disable=protected-access


def test_compare_plot_never_writes_into_a_run_or_over_a_users_file(tmp_path, capsys):
  a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", seed=1)
  users = tmp_path / "curves.png"
  users.write_bytes(b"the user's picture")
  for plot in (str(users), os.path.join(a, "curves.png")):
    assert compare.main([a, b, f"--plot={plot}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --plot={plot}")
  assert users.read_bytes() == b"the user's picture" and not os.path.exists(f"{a}/curves.png")
  ours = tmp_path / "plots" / "curves.png"
  for _ in range(2):  # the second run replaces what the first wrote
    assert compare.main([a, b, f"--plot={ours}"]) == 0
    assert ours.read_bytes()[:4] == b"\x89PNG"
