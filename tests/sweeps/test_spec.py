"""Sweeps planned: expansion and naming, and validation before anything runs."""

import itertools
import os

import pytest

from sweep_fixtures import ROOT, TINY, load_config_file, sweep_cli, write_sweep
from configs import sweeps as helpers
from transformer.config import ConfigError
from transformer.sweeps import spec


def test_product_zip_chain_expand_like_naive_loops():
  """product = every combination with the last factor fastest (as itertools.product), zip pairs
  point i with point i, chain concatenates; a key set twice or unequal zip lengths is an error."""
  a, b = [0.1, 0.2], ["x", "y", "z"]
  got = helpers.product(helpers.sweep("k.a", a), helpers.sweep("k.b", b))
  assert got == [{"k.a": va, "k.b": vb} for va, vb in itertools.product(a, b)]
  assert [list(p) for p in got] == [["k.a", "k.b"]] * 6  # key order = factor order
  assert helpers.zip(helpers.sweep("k.a", a), helpers.sweep("k.c", [1, 2])) == [
      {"k.a": 0.1, "k.c": 1}, {"k.a": 0.2, "k.c": 2}]
  assert helpers.chain(helpers.sweep("k.a", a), [{"k.b": "x"}]) == [
      {"k.a": 0.1}, {"k.a": 0.2}, {"k.b": "x"}]
  with pytest.raises(ValueError, match="different lengths"):
    helpers.zip(helpers.sweep("k.a", a), helpers.sweep("k.b", b))
  with pytest.raises(ValueError, match="'k.a' is set by two"):
    helpers.product(helpers.sweep("k.a", a), helpers.sweep("k.a", [3]))
  with pytest.raises(TypeError, match="values must be a list"):
    helpers.sweep("k.a", "abc")


def test_point_names_are_readable_safe_unique_and_short():
  """Names join label=value in the sweep's key order (short labels, repr floats, lower-case
  bools); unsafe characters become '_'; a name over the limit is cut and ends in a hash, so
  points that differ only after the cut still get different names; shared last parts of two
  keys fall back to the full key."""
  names = spec.point_names(helpers.product(
      helpers.sweep("model.positional", ["rope"]), helpers.sweep("train.learning_rate", [3e-4]),
      helpers.sweep("model.tie_embeddings", [False])))
  assert names == ["positional=rope,lr=0.0003,tie_embeddings=false"]
  assert spec.point_names([{"data.train_file": "a/b c.tsv"}]) == ["train_file=a_b_c.tsv"]
  assert spec.point_names([{}]) == ["baseline"]
  assert spec.point_names([{"data.batch_size": 8, "eval.batch_size": 4}]) == [
      "data.batch_size=8,eval.batch_size=4"]
  long = [{"data.train_file": "x" * 100 + str(i)} for i in range(2)]
  cut = spec.point_names(long)
  assert len(set(cut)) == 2 and all(len(n) <= spec.MAX_NAME_LEN for n in cut)
  assert all(n.startswith("train_file=xxxx") for n in cut)


def test_shipped_sweep_files_expand_and_validate():
  """Every shipped sweep file plans against g2p :small with distinct names and valid configs,
  with the point counts the files promise (6 positional, 3 norm, 4 ffn, 8 regularization, 6 lr,
  2 arch, 3 ema), and the gated FFNs / decoder-only model get matched sizes."""
  config = load_config_file("configs/g2p.py:small")
  counts = {"positional": 6, "norm": 3, "ffn": 4, "regularization": 8, "lr": 6, "arch": 2, "ema": 3}
  plans = {}
  for name, n in counts.items():
    plans[name] = spec.plan(config, "configs/g2p.py:small",
                              os.path.join(ROOT, f"configs/sweeps/{name}.py"), "w")
    assert len(plans[name]) == n and len({p.name for p in plans[name]}) == n
  assert plans["ffn"][2].overrides == {"model.ffn": "swiglu", "model.mlp_dim": 680}  # 1024 * 2/3
  assert plans["arch"][1].overrides["model.num_decoder_layers"] == 7  # 3*12 + 3*16 = 7*12 (d^2)


# ------------------------------------------------------------------ validation before running


def test_unknown_key_is_one_line_error_before_anything_runs(tmp_path):
  """A misspelt key fails in plan() naming the key, the sweep file and a suggestion; the CLI
  prints one line, exits 1 and creates no workdir (so nothing was started)."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.positonal", ["rope"])\n')
  with pytest.raises(spec.SweepError) as e:
    spec.plan(load_config_file(TINY), TINY, path, str(tmp_path / "w"))
  assert "model.positonal" in str(e.value) and path in str(e.value)
  assert "did you mean 'model.positional'" in str(e.value)
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={tmp_path / 'w'}")
  assert out.returncode == 1
  assert out.stderr.strip().count("\n") == 0 and "unknown override key 'model.positonal'" in out.stderr
  assert not (tmp_path / "w").exists()


def test_bad_values_are_config_errors_naming_the_point(tmp_path):
  """A value the validator rejects (unknown choice, wrong type, a broken relation) is a
  ConfigError naming the sweep file, the point and the key; a non-scalar value is a SweepError."""
  config = load_config_file(TINY)
  cases = {'sweep("model.positional", ["rope", "sinus"])': r"point 1 \(positional=sinus\).*model.positional",
           'sweep("model.d_model", ["big"])': "point 0.*model.d_model='big' is of type str; "
           "the key takes int",
           'sweep("train.warmup_steps", [63.7])': "warmup_steps=63.7 is of type float; the key "
           "takes int",
           'sweep("model.num_heads", [5])': "point 0.*model.num_heads=5 must divide"}
  for body, pattern in cases.items():
    path = write_sweep(tmp_path, f"def get_sweep():\n  return {body}\n")
    with pytest.raises(ConfigError, match=pattern):
      spec.plan(config, TINY, path, "w")
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.d_model", [[1, 2]])\n')
  with pytest.raises(spec.SweepError, match="must be a str, int, float or bool"):
    spec.plan(config, TINY, path, "w")


def test_a_sweep_file_of_any_name_is_read_as_python_or_named_in_one_line(tmp_path):
  """A sweep file not ending in .py is Python source all the same; a directory, a missing path
  and null bytes are each one SweepError naming the file."""
  config = load_config_file(TINY)
  (tmp_path / "lr.sweep").write_text("def get_sweep():\n  return [{'train.learning_rate': 0.5}]\n")
  assert spec.load_sweep(str(tmp_path / "lr.sweep"), config) == [{"train.learning_rate": 0.5}]
  (tmp_path / "bin.sweep").write_bytes(b"\x00\xff binary")
  for path, message in ((tmp_path, "is not a file"), (tmp_path / "none.py", "not found"),
                        (tmp_path / "bin.sweep", ": SyntaxError: source code")):
    with pytest.raises(spec.SweepError, match=f"^sweep file {path}.*{message}"):
      spec.load_sweep(str(path), config)
