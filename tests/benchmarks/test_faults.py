"""The fault campaign of benchmarks/faults.py: its kill plan, and a short campaign (slow)."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import faults  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import g2p_mini  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def test_kill_plan_spreads_phases_and_steps():
  """20 kills over 100 steps: phases balanced (7/7/6), target steps in order, save kills at
  checkpoint steps before the last one, eval kills at evaluation steps; the seed decides."""
  plan = faults.plan_kills(20, 0, 100, 10, 25)
  counts = {p: sum(k.phase == p for k in plan) for p in faults.PHASES}
  assert sorted(counts.values()) == [6, 7, 7]
  steps = [k.step for k in plan]
  assert steps == sorted(steps) and 1 <= steps[0] and steps[-1] <= 100
  assert all(k.step % 10 == 0 and k.step < 100 for k in plan if k.phase == "save")
  assert all(k.step % 25 == 0 for k in plan if k.phase == "eval")
  assert {k.variant for k in plan if k.phase == "save"} == {0, 1}
  assert faults.plan_kills(20, 1, 100, 10, 25) != plan


def test_bitwise_equal_sees_one_flipped_bit_and_dtype():
  """The final comparison is bitwise: one flipped mantissa bit, or a different dtype, differs."""
  a = {"w": np.arange(6, dtype=np.float32), "s": np.int32(3) * np.ones(())}
  flipped = a["w"].copy()
  flipped.view(np.uint32)[2] ^= 1
  assert faults.bitwise_equal(a, {k: v.copy() for k, v in a.items()})
  assert not faults.bitwise_equal(a, {**a, "w": flipped})
  assert not faults.bitwise_equal(a, {**a, "w": a["w"].astype(np.float64)})
  assert not faults.bitwise_equal(a, {"w": a["w"]})


@pytest.mark.slow  # a reference run plus 4 restarts of the :tiny model: minutes on 2 cores
def test_short_campaign_survives_and_ends_bitwise_equal(tmp_path):
  """3 SIGKILLs (one in a step, one in an evaluation, one during an async checkpoint write) of a
  40-step :tiny run on the mini CMUdict files, each followed by a resume: all resumes succeed and
  the final train state equals the uninterrupted run's bit for bit."""
  files = g2p_mini.write_files(str(tmp_path / "data"))
  args = faults.parse_args([
      "--kills=3", "--seed=0", "--config=configs/g2p.py:tiny", f"--workdir={tmp_path / 'run'}",
      f"--data_dir={tmp_path / 'data' / 'tfds'}", "--override=train.num_steps=40",
      "--override=eval.every_steps=20", "--override=eval.num_decode_examples=8",
      *[f"--override=data.{k}={v}" for k, v in files.items()]])
  result = faults.campaign(args)
  assert result["kills"] == 3 and result["survived"] == 3 and result["equal"]
  phases = " ".join(result["log"])
  assert all(f"phase={p}" in phases for p in faults.PHASES)
