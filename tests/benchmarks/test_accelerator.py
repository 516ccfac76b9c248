"""benchmarks/accelerator.py: its GPT-2-sized configs are the widths it names, its FLOP count agrees
with a hand count, and one variant runs end to end on the CPU with a consistent record (the
numbers of docs/performance.md's "GPU train step" come from this script on an H200)."""

import json
import sys

import pytest

from bench_loader import load_benchmark
from transformer.config import from_configdict

accelerator = load_benchmark("accelerator")


def test_gpt2_sizes_are_the_named_widths_and_their_flops_the_hand_count():
  """gpt2s: 12 layers of d 768 (12 heads of 64, mlp 3072), vocabulary 50,304, 16 x 1024 tokens.
  Hand count (nanoGPT's and PaLM's): 6 x (weights of every matmul, the output projection
  included) x tokens + 12 x layers x length x d_model x tokens."""
  for name, (layers, d, batch) in {"gpt2s": (12, 768, 16), "gpt2m": (24, 1024, 8)}.items():
    cd, shapes = accelerator.size_config(name)
    cfg = from_configdict(cd)
    m = cfg.model
    assert (m.num_decoder_layers, m.d_model, m.head_dim, m.mlp_dim, m.vocab_size) == (
        layers, d, 64, 4 * d, 50304)
    assert shapes == {"targets": (batch, 1024)}
    tokens = batch * 1024
    weights = layers * (4 * d * d + 2 * d * 4 * d) + d * 50304
    hand = 6 * weights * tokens + 12 * layers * 1024 * d * tokens
    assert accelerator.train_step.train_flops(cfg, shapes) == hand


@pytest.mark.slow  # ~27 s on 2 cores (a compiled train step); the FLOP count above stays in the default run
def test_one_variant_runs_on_the_cpu_and_its_record_adds_up(capsys, monkeypatch):
  """The last line is the JSON record: tokens/s and TFLOP/s follow from its ms and counts, a CPU
  has no datasheet peak (MFU None) and no cuDNN calls, and the first variant is 1.00x itself."""
  monkeypatch.setattr(sys, "argv", ["accelerator.py", "--sizes=g2pfast", "--dtypes=float32",
                                    "--attention=einsum", "--steps=1", "--rounds=1",
                                    "--matmul_n=128"])
  accelerator.main()
  record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert record["peak"] is None and record["device"]
  (r,) = record["results"]
  assert (r["size"], r["dtype"], r["attention"]) == ("g2pfast", "float32", "einsum")
  assert r["mfu"] is None and r["cudnn_calls"] == 0 and r["ratio_to_first"] == 1.0
  assert r["tokens"] == 128 * (32 + 30)
  assert abs(r["tokens_per_s"] - r["tokens"] / r["ms"] * 1e3) < 1e-6 * r["tokens_per_s"]
  assert abs(r["tflops"] - r["flops"] / r["ms"] / 1e9) < 1e-9 * r["flops"]
