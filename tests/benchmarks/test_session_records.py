"""benchmarks/session_records.py: the accelerator session's records follow docs/results' schema
and carry the raw outputs' numbers (percent for MFU, WER and PER); a part without output gets no
record; and accelerator.py's levers parse as the session spells them."""

import json

import pytest

from bench_loader import load_benchmark

records = load_benchmark("session_records")
accelerator = load_benchmark("accelerator")

SCHEMA = {"name", "title", "task", "config", "overrides", "command", "commit", "hardware",
          "versions", "wall_clock_s", "rates", "metrics", "seeds", "report"}
DEVICE = "NVIDIA H100 80GB HBM3"


def step_result(size, variant, ms, tokens, mfu, ratio):
  return {"size": size, "dtype": "bfloat16", "attention": "fused", "variant": variant,
          "ms_per_step": ms, "tokens_per_s": tokens, "tflops": 300.0, "mfu": mfu,
          "ratio_to_first": ratio, "temp_bytes": 2**31}


def write_raw(work):
  gpt2s = {"device": DEVICE, "matmul_tflops": {"bfloat16": 760.0}, "results": [
      step_result("gpt2s", "base", 50.0, 327680, 0.276, 1.0),
      step_result("gpt2s", "causal_kernel=True,rows=32", 80.0, 409600, 0.345, 1.25)]}
  (work / "accelerator_gpt2s.json").write_text(json.dumps(gpt2s))
  xla = {"device": DEVICE, "xla_flags": "--xla_gpu_enable_latency_hiding_scheduler=true",
         "results": [step_result("gpt2s", "causal_kernel=True,rows=32", 75.0, 450560, 0.37, 1.0)]}
  (work / "accelerator_xla.json").write_text(json.dumps(xla))
  speed = {"device": DEVICE, "results": [
      {**step_result("g2pfast", "base", 4.0, 1, None, 1.0), "dtype": "float32"}],
           "g2p_train": [{"steps_per_dispatch": 1, "steps_per_s": 82.04},
                         {"steps_per_dispatch": 8, "steps_per_s": 201.26}]}
  (work / "speed.json").write_text(json.dumps(speed))
  (work / "quality").mkdir()
  summary = {"config": "configs/g2p.py:gpu", "extra": [], "seeds": {"0": {
      "seed": 0, "wall_clock_s": 290.5,
      "validation": {"wer": 0.2211, "per": 0.0531}, "test": {"wer": 0.2150, "per": 0.0512}}}}
  (work / "quality" / "summary.json").write_text(json.dumps(summary))


def test_records_follow_the_schema_and_carry_the_raw_numbers(tmp_path, capsys):
  work, out = tmp_path / "work", tmp_path / "results"
  work.mkdir()
  write_raw(work)
  paths = records.main([f"--work={work}", f"--out={out}", "--commit=abc123",
                        f"--device={DEVICE}", '--versions={"jax": "0.11.2"}',
                        "--command=bash benchmarks/accelerator_session.sh OUT_DIR"])
  assert "members: no raw output" in capsys.readouterr().out
  got = {p.split("/")[-2]: json.load(open(p)) for p in paths}
  assert sorted(got) == ["gpu_h100_g2p_gpu", "gpu_h100_g2p_speed", "gpu_h100_mfu"]
  for name, record in got.items():
    assert set(record) == SCHEMA and record["name"] == name
    assert record["hardware"] == f"1x {DEVICE}" and record["commit"] == "abc123"
    assert record["versions"] == {"jax": "0.11.2"}
    assert (out / name / ("summary.json" if name.endswith("gpu") else "raw.json")).exists()
  mfu = got["gpu_h100_mfu"]["metrics"]
  assert mfu["gpt2s_bfloat16_fused_base_mfu_pct"] == 27.6
  assert mfu["gpt2s_bfloat16_fused_causal_kernel_true_rows_32_mfu_pct"] == 34.5
  assert mfu["gpt2s_bfloat16_fused_causal_kernel_true_rows_32_ratio"] == 1.25
  assert mfu["matmul_bfloat16_tflops"] == 760
  assert mfu["xla_gpt2s_bfloat16_fused_causal_kernel_true_rows_32_mfu_pct"] == 37.0
  assert mfu["xla_gpt2s_bfloat16_fused_causal_kernel_true_rows_32_ratio"] == 1.1  # 450560/409600
  assert got["gpu_h100_mfu"]["overrides"] == [
      "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true (xla_* metrics only)"]
  assert got["gpu_h100_mfu"]["rates"] == {"steps_per_s": 12.5, "tokens_per_s": 409600}
  speed = got["gpu_h100_g2p_speed"]
  assert speed["metrics"]["fast_k1_steps_per_s"] == 82.0
  assert speed["metrics"]["fast_k8_steps_per_s"] == 201.3
  assert speed["metrics"]["fast_step_base_steps_per_s"] == 250.0
  assert speed["rates"] == {"steps_per_s": 201.3}
  quality = got["gpu_h100_g2p_gpu"]
  assert quality["config"] == "configs/g2p.py:gpu" and quality["seeds"] == [0]
  assert quality["metrics"] == {"dev_wer": 22.11, "dev_per": 5.31, "test_wer": 21.5,
                                "test_per": 5.12}
  assert quality["wall_clock_s"] == 290.5


def test_members_record_is_the_wall_clock_ratio(tmp_path):
  """8 members in 120 s after one in 100 s: ratio 1.2."""
  (tmp_path / "members.json").write_text(
      json.dumps({"members": 8, "start": 1000.0, "one_done": 1100.0, "all_done": 1220.0}))
  (path,) = records.main([f"--work={tmp_path}", f"--out={tmp_path / 'out'}",
                          "--device=NVIDIA H200"])
  record = json.load(open(path))
  assert record["name"] == "gpu_h200_members" and set(record) == SCHEMA
  assert record["metrics"] == {"members_wall_clock_ratio": 1.2} and record["wall_clock_s"] == 120.0


def test_no_raw_output_no_record(tmp_path):
  assert records.main([f"--work={tmp_path}", f"--out={tmp_path / 'out'}"]) == []
  assert not (tmp_path / "out").exists()


def test_device_names():
  assert records.device_slug("NVIDIA H200") == "gpu_h200"
  assert records.device_slug("NVIDIA H100 80GB HBM3") == "gpu_h100"
  assert records.device_slug("cpu") == "cpu"


def test_the_sessions_levers_parse():
  """accelerator.py --variants as the session writes them: booleans, numbers, names; a lever
  that is no key is a one-line exit."""
  assert accelerator.parse_variants("base|causal_kernel=true,loss_chunk_tokens=8192|"
                                    "remat=dots_no_batch,rows=32") == [
      {}, {"causal_kernel": True, "loss_chunk_tokens": 8192},
      {"remat": "dots_no_batch", "rows": 32}]
  cd, shapes = accelerator.size_config("lmtiny")
  shapes, k = accelerator.apply_levers(cd, shapes, {"rows": 8, "steps_per_dispatch": 4,
                                                    "causal_kernel": True,
                                                    "train.loss_chunk_tokens": 64})
  assert shapes == {"targets": (8, 64)} and k == 4
  assert cd.model.causal_kernel and cd.train.loss_chunk_tokens == 64
  with pytest.raises(SystemExit, match="unknown lever 'bogus'"):
    accelerator.apply_levers(cd, shapes, {"bogus": 1})


def test_quality_record_of_members_and_their_ensemble(tmp_path):
  """QUALITY_SEEDS: the record keeps the first seed's numbers and adds the largest ensemble's,
  whose wall clock (one members program + its test evaluation) is the record's."""
  (tmp_path / "quality").mkdir()
  seed = lambda k, wer: {"seed": k, "wall_clock_s": 300.0, "validation": {"wer": wer, "per": 0.05},
                         "test": {"wer": wer, "per": 0.05}}
  summary = {"config": "configs/g2p.py:gpu", "extra": [], "members": True,
             "seeds": {"0": seed(0, 0.24), "1": seed(1, 0.25)},
             "ensembles": {"0,1": {"seeds": [0, 1], "wall_clock_s": 310.0,
                                   "validation": {"wer": 0.2213}, "test": {"wer": 0.2150,
                                                                          "per": 0.0512}}}}
  (tmp_path / "quality" / "summary.json").write_text(json.dumps(summary))
  (path,) = records.main([f"--work={tmp_path}", f"--out={tmp_path / 'out'}", f"--device={DEVICE}"])
  record = json.load(open(path))
  assert record["seeds"] == [0, 1] and record["wall_clock_s"] == 310.0
  assert record["metrics"] == {"dev_wer": 24.0, "dev_per": 5.0, "test_wer": 24.0, "test_per": 5.0,
                               "dev_wer_ensemble": 22.13, "test_wer_ensemble": 21.5,
                               "test_per_ensemble": 5.12, "ensemble_size": 2}
