"""benchmarks/step_profile.py: the FLOPs it counts per matmul thunk and the times it sums per kind,
on a small hand-written HLO module and trace (the numbers below are worked out by hand)."""

import sys

import pytest

from bench_loader import load_benchmark

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
