"""transformer.convert's export directory: never overwritten without --overwrite, never a run's own
workdir, each file replaced whole, files it does not write kept, a failed export leaving the old
files as they were; --from_hf never replaces a run or a user's file, never writes inside a run,
and names a config.json that is no JSON object or is one of our runs'."""

import errno
import json
import os

import numpy as np
import pytest

pytest.importorskip("safetensors")

from transformer import convert, files  # noqa: E402

HF = {"model_type": "gpt2", "n_embd": 4}
STATE = {"wte.weight": np.arange(8, dtype=np.float32).reshape(2, 4)}


def _user_dir(tmp_path):
  """A directory holding a user's config.json, an earlier model.safetensors and notes.txt."""
  out = tmp_path / "hf"
  out.mkdir()
  (out / "config.json").write_text('{"mine": true}')
  (out / "model.safetensors").write_bytes(b"earlier weights")
  (out / "notes.txt").write_text("keep me")
  return out


def _contents(directory):
  return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_export_into_a_non_empty_directory_is_refused_naming_it_and_its_files(tmp_path, capsys):
  """--to_hf into a directory holding files exits 1 with one line naming the directory and its
  files, before reading the run (the workdir here does not exist) and before writing anything."""
  out = _user_dir(tmp_path)
  before = _contents(out)
  status = convert.main([f"--workdir={tmp_path / 'no_run'}", f"--to_hf={out}"])
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 1 and len(err) == 1, err
  assert (f"--to_hf={out} is not empty (config.json, model.safetensors, notes.txt)" in err[0]
          and "--overwrite" in err[0]), err
  assert _contents(out) == before
  with pytest.raises(convert.ConvertError, match="is not empty"):
    convert.write_hf(str(out), HF, STATE)
  assert _contents(out) == before


def test_export_into_the_runs_own_workdir_is_refused_even_with_overwrite(tmp_path):
  """--overwrite never lets an export replace the run's own config.json."""
  run = _user_dir(tmp_path)
  before = _contents(run)
  with pytest.raises(convert.ConvertError, match="the run's own workdir"):
    convert.to_hf(str(run), str(run) + "/", overwrite=True)
  assert _contents(run) == before


def test_export_inside_any_runs_workdir_is_refused_even_with_overwrite(tmp_path):
  """--to_hf=RUN/tokenizers (or any folder inside a run) with --overwrite would replace the run's
  own files: refused in one line naming the run, nothing written."""
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "tokenizers").mkdir()
  (run / "tokenizers" / "config.json").write_text('{"the run": true}')
  before = _contents(run / "tokenizers")
  with pytest.raises(convert.ConvertError, match=f"is inside the run {run}"):
    convert.check_export_dir(str(run / "tokenizers"), overwrite=True)
  with pytest.raises(convert.ConvertError, match="is the workdir of a run"):
    convert.write_hf(str(run), HF, STATE, overwrite=True)
  assert _contents(run / "tokenizers") == before and not (run / "model.safetensors").exists()


def test_overwrite_replaces_only_the_files_the_export_writes(tmp_path):
  """With overwrite, config.json and model.safetensors are the export's, notes.txt is kept and
  no temporary file is left."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  out = _user_dir(tmp_path)
  convert.write_hf(str(out), HF, STATE, overwrite=True)
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "notes.txt"]
  assert json.loads((out / "config.json").read_text()) == HF
  np.testing.assert_array_equal(load_file(str(out / "model.safetensors"))["wte.weight"],
                                STATE["wte.weight"])
  assert (out / "notes.txt").read_text() == "keep me"


def test_a_failed_export_leaves_the_old_files_as_they_were(tmp_path, monkeypatch):
  """A disk that fills while the export writes its second file leaves every old file intact (no
  new config.json beside old weights) and no temporary file behind."""
  out = _user_dir(tmp_path)
  before = _contents(out)
  real, calls = files.write_bytes_atomic, []

  def fills_up(path, data):
    calls.append(path)
    if len(calls) == 2:
      raise OSError(errno.ENOSPC, "No space left on device", path)
    real(path, data)

  monkeypatch.setattr(files, "write_bytes_atomic", fills_up)
  with pytest.raises(OSError):
    convert.write_hf(str(out), HF, STATE, overwrite=True)
  assert _contents(out) == before


def test_from_hf_into_a_workdir_holding_a_run_is_refused_before_reading(tmp_path, capsys):
  """--from_hf into a workdir with a run's config.json exits 1 naming it and leaves it as it was
  (the Hugging Face directory here does not exist: the refusal comes first)."""
  run = _user_dir(tmp_path)
  before = _contents(run)
  status = convert.main([f"--from_hf={tmp_path / 'no_hf'}", f"--workdir={run}"])
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 1 and err == [f"error: --workdir={run} already holds config.json; give a "
                                 "new directory"], err
  assert _contents(run) == before
  (run / "provenance.json").write_text("{}")  # now a run's files
  assert convert.main([f"--from_hf={tmp_path / 'no_hf'}", f"--workdir={run}"]) == 1
  assert "already holds a run;" in capsys.readouterr().err


def _refused(argv, capsys) -> str:
  """The one error line of convert.main(argv), which must exit 1."""
  status = convert.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 1 and len(err) == 1, err
  return err[0]


def test_from_hf_refuses_a_users_file_and_a_folder_inside_a_run(tmp_path, capsys):
  """--workdir naming a file, or a folder inside a run's workdir (it used to convert into
  RUN/checkpoints/x), is refused before the Hugging Face directory is read; nothing written."""
  (tmp_path / "notes.txt").write_text("mine")
  err = _refused([f"--from_hf={tmp_path / 'no_hf'}", f"--workdir={tmp_path / 'notes.txt'}"],
                 capsys)
  assert "notes.txt is a file, not a directory" in err, err
  assert (tmp_path / "notes.txt").read_text() == "mine"
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  inside = run / "checkpoints" / "converted"
  err = _refused([f"--from_hf={tmp_path / 'no_hf'}", f"--workdir={inside}"], capsys)
  assert f"is inside the run {run}" in err and not inside.exists(), err


@pytest.mark.parametrize("text,named", [
    ('{"model_type": "gpt2",\n', "config.json:2: not valid JSON"),
    ("[1, 2]", "config.json: holds a JSON list, not an object"),
    (b"\xff\xfe{}", "config.json: not UTF-8 text"),
    ('{"model": {"arch": "decoder_only"}, "data": {}}', "is a run's workdir, not a Hugging Face "
     "directory (export it: --workdir="),
])
def test_a_config_json_that_is_no_hugging_face_config_is_named(tmp_path, capsys, text, named):
  """config.json that is not JSON, not an object, not text, or our own run's: one line naming the
  file (these were a bare JSON message, a traceback, or 'model_type=None is not supported')."""
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
  err = _refused([f"--from_hf={hf}", f"--workdir={tmp_path / 'out'}"], capsys)
  assert named in err, err
  assert not (tmp_path / "out").exists()
