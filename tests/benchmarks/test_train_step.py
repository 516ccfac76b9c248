"""benchmarks/train_step.py --variants: how the flag is read, and that a bad key or value is one
line naming it before anything compiles."""

import types

import pytest

from bench_loader import load_benchmark

train_step = load_benchmark("train_step")


def test_variants_are_read_as_model_overrides_with_python_values():
  """'|' separates variants and ',' their keys; values are Python literals where they parse
  (ints, floats, booleans), else strings; an empty variant is the config as it is."""
  assert train_step.parse_variants("dropout_bits=32|dropout_bits=8,dropout_rate=0.0|") == [
      {"dropout_bits": 32}, {"dropout_bits": 8, "dropout_rate": 0.0}, {}]
  assert train_step.parse_variants("ffn=swiglu,use_bias=False") == [
      {"ffn": "swiglu", "use_bias": False}]
  with pytest.raises(SystemExit, match="'dropout_bits' is not KEY=VALUE"):
    train_step.parse_variants("dropout_bits")


@pytest.mark.parametrize("text, message", [
    ("dropout_bitz=8", "'dropout_bitz' is not a model config key"),
    ("dropout_bits=16", r"model\.dropout_bits=16 is not one of 8\|32"),
    ("rows=0", "rows=0 is not a positive number of rows"),
    ("rows=many", "rows='many' is not a positive number of rows"),
    ("rows=True", "rows=True is not a positive number of rows"),
])
def test_a_bad_variant_is_one_line_naming_it(text, message, monkeypatch):
  """An unknown key is refused before anything is built; a value the config rejects gives the
  config's own one-line error (nothing reaches jit: build is stopped at the config)."""
  monkeypatch.setattr(train_step, "optim", types.SimpleNamespace(make_optimizer=None))
  args = types.SimpleNamespace(variants=text, rounds=1, steps=1)
  with pytest.raises(SystemExit, match=message):
    train_step.variants(args, ["g2pfast"])


# ~14 s: builds and runs the benchmark's g2p train step twice. What the default suite keeps: the
# flag's parsing and its errors above; the train step itself in tests/train/test_steps.py.
@pytest.mark.slow
def test_rows_resizes_the_batch_and_nothing_else():
  """rows=N times the size's step on N rows of the same lengths: the tokens and FLOPs scale by
  N / rows, the model is the same (its parameter count in the FLOPs), and the step runs."""
  _, shapes = train_step.size_config("g2p")
  (rows, src), (_, tgt) = shapes["inputs"], shapes["targets"]
  run, record = train_step.build("g2p", rows=8)
  _, base = train_step.build("g2p")
  assert record["tokens"] == 8 * (src + tgt) and base["tokens"] == rows * (src + tgt)
  assert record["flops"] * rows == pytest.approx(base["flops"] * 8)
  run()
  run()
