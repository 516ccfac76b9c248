"""benchmarks/step_profile.py: the FLOPs it counts per matmul thunk and the times it sums per kind,
on a small hand-written HLO module and trace (the numbers below are worked out by hand)."""

import gzip
import json
import sys

import pytest

from bench_loader import load_benchmark
from record_schema import REQUIRED

step_profile = load_benchmark("step_profile")

HLO = """HloModule jit_step, entry_computation_layout={()->()}

%fused_computation.1 (param_0.1: f32[8,4], param_1.2: f32[4,6]) -> f32[8,6] {
  %param_0.1 = f32[8,4]{1,0} parameter(0)
  %param_1.2 = f32[4,6]{1,0} parameter(1)
  ROOT %dot.3 = f32[8,6]{1,0} dot(%param_0.1, %param_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="x"}
}

%fused_computation.2 (param_0.2: f32[8,6]) -> f32[8,6] {
  %param_0.2 = f32[8,6]{1,0} parameter(0)
  ROOT %exponential.1 = f32[8,6]{1,0} exponential(%param_0.2)
}

ENTRY %main.10 (a: f32[8,4], b: f32[4,6], c: f32[2,8,4], d: f32[2,4,5]) -> (f32[8,6], f32[2,8,5]) {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[4,6]{1,0} parameter(1)
  %c = f32[2,8,4]{2,1,0} parameter(2)
  %d = f32[2,4,5]{2,1,0} parameter(3)
  %ynn_fusion.7 = f32[8,6]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_computation.1
  %exponential_fusion.8 = f32[8,6]{1,0} fusion(%ynn_fusion.7), kind=kLoop, calls=%fused_computation.2
  %dot.9 = f32[2,8,5]{2,1,0} dot(%c, %d), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %tuple.11 = (f32[8,6]{1,0}, f32[2,8,5]{2,1,0}) tuple(%exponential_fusion.8, %dot.9)
}
"""


def test_matmul_flops_counts_fused_and_top_level_dots():
  """2 x output elements x contracted size: the fusion's [8,4]x[4,6] dot is 2*8*6*4 = 384 FLOPs,
  the batched top-level dot [2,8,4]x[2,4,5] 2*(2*8*5)*4 = 640; the elementwise fusion has none."""
  flops = step_profile.matmul_flops(HLO)
  assert flops["ynn_fusion.7"] == (384.0, "8,4 x 4,6 -> 8,6")
  assert flops["dot.9"] == (640.0, "2,8,4 x 2,4,5 -> 2,8,5")
  assert "exponential_fusion.8" not in flops
  assert "dot.3" not in flops  # inside the fusion: counted in ynn_fusion.7, not a thunk of its own


def test_thunk_times_leave_out_runtime_spans_and_average_over_steps():
  events = [
      {"ph": "X", "name": "ynn_fusion.7", "dur": 30.0},
      {"ph": "X", "name": "ynn_fusion.7", "dur": 50.0},
      {"ph": "X", "name": "dot.9", "dur": 20.0},
      {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 1000.0},
      {"ph": "X", "name": "$train_step.py:179 run", "dur": 1000.0},
      {"ph": "X", "name": "PjitFunction(jit(train_step))", "dur": 1000.0},
      {"ph": "i", "name": "copy.1", "dur": 5.0},  # not a complete event
  ]
  assert step_profile.thunk_times(events, steps=2) == {"ynn_fusion.7": 40.0, "dot.9": 10.0}


def test_report_groups_by_kind_and_gives_matmul_rates():
  """A kind is the name without its numeric suffixes; GFLOP/s = FLOPs / microseconds / 1e3."""
  assert step_profile.kind("ynn_fusion.332") == "ynn_fusion"
  assert step_profile.kind("copy") == "copy"
  times = {"ynn_fusion.7": 2.0, "dot.9": 1.0, "copy.3": 1.0}
  lines = step_profile.report(times, step_profile.matmul_flops(HLO), top=10)
  text = "\n".join(lines)
  assert "thunks 0.0 ms per step in all" in lines[0]
  assert "50.0%      1 x ynn_fusion" in text  # 2 of 4 microseconds
  assert "matmul thunks 0.0 ms (75%), 0.00 GFLOP" in text
  assert "0.2 GFLOP/s  8,4 x 4,6 -> 8,6" in text  # 384 FLOPs in 2 us
  assert "0.6 GFLOP/s  2,8,4 x 2,4,5 -> 2,8,5" in text  # 640 FLOPs in 1 us


def test_an_unknown_size_is_one_line(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["step_profile.py", "--sizes=huge"])
  with pytest.raises(SystemExit):
    step_profile.main()
  assert "unknown size 'huge'" in capsys.readouterr().err


GPU_HLO = """HloModule jit_step, entry_computation_layout={()->()}

%fused_transpose (param_0.3: bf16[4,8]) -> bf16[8,4] {
  %param_0.3 = bf16[4,8]{1,0} parameter(0)
  ROOT %transpose.2 = bf16[8,4]{1,0} transpose(%param_0.3), dimensions={1,0}
}

%fused_scatter (param_0.4: f32[16,8], param_1.4: s32[4,1], param_2.4: f32[4,8]) -> f32[16,8] {
  %param_0.4 = f32[16,8]{1,0} parameter(0)
  %param_1.4 = s32[4,1]{1,0} parameter(1)
  %param_2.4 = f32[4,8]{1,0} parameter(2)
  ROOT %scatter.1 = f32[16,8]{1,0} scatter(%param_0.4, %param_1.4, %param_2.4), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%x, %y)
}

ENTRY %main (q: bf16[2,16,4,8], k: bf16[2,32,4,8], t: bf16[4,8], e: f32[16,8], i: s32[4,1], u: f32[4,8]) -> f32[16,8] {
  %q = bf16[2,16,4,8]{3,2,1,0} parameter(0)
  %k = bf16[2,32,4,8]{3,2,1,0} parameter(1)
  %t = bf16[4,8]{1,0} parameter(2)
  %e = f32[16,8]{1,0} parameter(3)
  %i = s32[4,1]{1,0} parameter(4)
  %u = f32[4,8]{1,0} parameter(5)
  %custom-call.1 = (bf16[2,16,4,8]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %k), custom_call_target="__cudnn$fmhaSoftmax"
  %custom-call.2 = (bf16[2,16,4,8]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %k), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  %transpose_fusion.3 = bf16[8,4]{1,0} fusion(%t), kind=kLoop, calls=%fused_transpose
  %scatter_fusion.4 = f32[16,8]{1,0} fusion(%e, %i, %u), kind=kLoop, calls=%fused_scatter
  %all-reduce-start.5 = f32[16,8]{1,0} all-reduce-start(%scatter_fusion.4), to_apply=%add
  %all-reduce-done.6 = f32[16,8]{1,0} all-reduce-done(%all-reduce-start.5)
  ROOT %copy.7 = f32[16,8]{1,0} copy(%all-reduce-done.6)
}
"""


def test_op_table_counts_bytes_and_flops_of_each_thunk():
  """Bytes = operands read + result written (f32: 4 bytes an element), by hand: the fusion's
  [8,4]x[4,6] matmul reads 128 + 96 and writes 192 bytes; the elementwise fusion reads and writes
  192; the batched dot reads 256 + 160 and writes 320. Parameters, the tuple and the instructions
  inside fusions are not thunks."""
  table = step_profile.op_table(HLO)
  assert set(table) == {"ynn_fusion.7", "exponential_fusion.8", "dot.9"}
  assert table["ynn_fusion.7"] == {"opcode": "fusion", "flops": 384.0, "bytes": 416.0,
                                   "category": "matmul"}
  assert table["exponential_fusion.8"] == {"opcode": "fusion", "flops": 0.0, "bytes": 384.0,
                                           "category": "loop fusion"}
  assert table["dot.9"]["bytes"] == 736.0 and table["dot.9"]["category"] == "matmul"


def test_op_table_categories_and_attention_flops():
  """cuDNN attention: 4 x |q| x key length forward (q 2x16x4x8 = 1024 elements, 32 keys), 2.5x
  that backward; a fusion that only moves data is a copy, one holding a scatter a scatter; the
  reducer computation is not a thunk."""
  table = step_profile.op_table(GPU_HLO)
  assert table["custom-call.1"]["category"] == "attention"
  assert table["custom-call.1"]["flops"] == 4 * 1024 * 32
  assert table["custom-call.2"]["flops"] == 2.5 * 4 * 1024 * 32
  # the tuple result (2 bytes x 1024 + 0) and three operands (q 2048, k 4096 twice)
  assert table["custom-call.1"]["bytes"] == 2048 + 2048 + 4096 + 4096
  assert table["transpose_fusion.3"]["category"] == "copy/transpose"
  assert table["scatter_fusion.4"]["category"] == "gather/scatter"
  assert table["all-reduce-start.5"]["category"] == "collective"
  assert table["all-reduce-done.6"]["category"] == "collective"
  assert table["copy.7"]["category"] == "copy/transpose"
  assert "add.9" not in table


def _gpu_trace() -> list[dict]:
  """Two steps: a host process, the GPU's stream line and its derived 'XLA Ops' line."""
  events = [
      {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
      {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "name": "thread_name", "pid": 2, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
      {"ph": "M", "name": "thread_name", "pid": 2, "tid": 8, "args": {"name": "XLA Ops"}},
      {"ph": "X", "pid": 1, "tid": 1, "name": "ynn_fusion.7", "ts": 0, "dur": 500},
  ]
  for step, t0 in enumerate((0, 100)):
    events += [
        {"ph": "X", "pid": 2, "tid": 7, "name": "sm90_xmma_gemm", "ts": t0, "dur": 10,
         "args": {"hlo_op": "ynn_fusion.7"}},
        {"ph": "X", "pid": 2, "tid": 7, "name": "loop_exponential_fusion", "ts": t0 + 8,
         "dur": 6, "args": {"hlo_op": "exponential_fusion.8"}},  # overlaps the gemm by 2
        {"ph": "X", "pid": 2, "tid": 7, "name": "MemcpyDtoH", "ts": t0 + 30, "dur": 4},
        {"ph": "X", "pid": 2, "tid": 8, "name": "ynn_fusion.7", "ts": t0, "dur": 50},
    ]
  return events


def test_op_times_on_a_gpu_trace_use_stream_kernels_and_find_the_idle_gaps():
  """Kernels count under their hlo_op, a memcpy as a host transfer; the derived 'XLA Ops' line
  and the host's events are left out. Busy per step: [0, 14] and [30, 34] = 18 us; the traced
  span is 0 to 134 (two steps), so idle = (134 - 36) / 2 = 49 us a step."""
  times, idle = step_profile.op_times(_gpu_trace(), steps=2)
  assert times == {"ynn_fusion.7": 10.0, "exponential_fusion.8": 6.0, "host transfer": 4.0}
  assert idle == 49.0


def test_op_report_floors_and_time_over_floor():
  """Floor = max(FLOPs / matmul ceiling, bytes / copy ceiling): at 384 MFLOP/s and 104 MB/s the
  matmul fusion's floor is max(1, 4) = 4 us, the elementwise one's max(0, 3.69) us; the step's
  time over the floor sums busy and idle time."""
  times, idle = step_profile.op_times(_gpu_trace(), steps=2)
  ops = step_profile.op_report(times, idle, step_profile.op_table(HLO), 384e6, 104e6)
  rows = {r["op"]: r for r in ops["ops"]}
  assert rows["ynn_fusion.7"]["floor_us"] == pytest.approx(4.0)
  assert rows["exponential_fusion.8"]["floor_us"] == pytest.approx(384 / 104)
  assert rows["host transfer"]["category"] == "host transfer"
  assert ops["floor_us"] == pytest.approx(4.0 + 384 / 104)
  assert ops["over_floor"] == pytest.approx((20.0 + 49.0) / (4.0 + 384 / 104))
  assert ops["categories"]["idle"]["us"] == 49.0
  assert ops["categories"]["matmul"]["count"] == 1
  text = "\n".join(step_profile.op_lines(ops, top=2))
  assert "time over floor 8.97x" in text and "ynn_fusion.7" in text


def test_a_cpu_trace_has_no_device_lines():
  """On a CPU trace the op times are the thunk times (completion markers left out), no idle."""
  events = [{"ph": "X", "name": "dot.9", "dur": 20.0}, {"ph": "X", "name": "end: dot", "dur": 1.0}]
  assert step_profile.op_times(events, steps=2) == ({"dot.9": 10.0}, 0.0)


def test_out_needs_ops_and_one_size(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["step_profile.py", "--sizes=baby,g2pfast", "--out=/tmp/x"])
  with pytest.raises(SystemExit):
    step_profile.main()
  assert "--out: needs --ops and exactly one size" in capsys.readouterr().err


def test_write_record_follows_the_results_schema(tmp_path):
  """--out writes a record docs/results accepts, the whole table and the HLO, compressed."""
  times, idle = step_profile.op_times(_gpu_trace(), steps=2)
  ops = step_profile.op_report(times, idle, step_profile.op_table(HLO), 384e6, 104e6)
  ops.update(size="gpt2s", ms_per_step=0.069, model_flops=1e6, tokens=64,
             overrides={"dtype": "bfloat16"})
  out = tmp_path / "gpu_profile_gpt2s"
  step_profile.write_record(str(out), ops, HLO)
  record = json.loads((out / "record.json").read_text())
  for key, types in REQUIRED.items():
    assert isinstance(record[key], types), key
  assert record["name"] == "gpu_profile_gpt2s" and record["overrides"] == ["dtype=bfloat16"]
  assert record["metrics"]["idle_ms"] == 0.049 and record["metrics"]["matmul_ms"] == 0.01
  assert record["rates"]["tokens_per_s"] == round(64 / 0.069 * 1e3)
  assert json.loads((out / "ops.json").read_text())["ops"][0]["op"] == "ynn_fusion.7"
  with gzip.open(out / "hlo.txt.gz", "rt") as f:
    assert f.read() == HLO
