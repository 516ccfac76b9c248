"""IsoFLOP sweep plans (transformer/scaling/isoflop.py) and configs/sweeps/isoflop.py through
sweep.py's planning and packing: every run spends its budget, sizes are spaced as asked, seeds
pack together."""

import math

import pytest

from configs import lm
from configs.sweeps import isoflop as isoflop_sweep
from transformer.config import from_configdict
from transformer.scaling import counting, isoflop
from transformer.sweeps import packing, spec


def test_shapes_follow_the_rule_and_hit_their_targets():
  ladder = isoflop.Ladder(aspect_ratio=16, head_dim=8, mlp_ratio=4)
  for target in (1e4, 3e4, 1e5, 1e6):
    shape = ladder.shape_for(target)
    assert shape.d_model % 8 == 0 and shape.num_heads * 8 == shape.d_model
    assert shape.mlp_dim == 4 * shape.d_model
    assert 8 <= shape.d_model / shape.num_layers <= 32
    assert abs(math.log(ladder.estimate(shape.d_model, shape.num_layers) / target)) < math.log(1.3)


def test_sizes_are_spaced_around_the_tokens_per_parameter_centre():
  sizes = isoflop.sizes_for(6e12, num_sizes=5, spacing=2.0, tokens_per_param=20.0)
  assert sizes[2] == pytest.approx(math.sqrt(6e12 / 120))
  assert [b / a for a, b in zip(sizes, sizes[1:])] == pytest.approx([2.0] * 4)


def test_every_run_spends_its_budget_with_scaled_warmup():
  config = lm.get_config("isoflop")
  runs = isoflop_sweep.runs(config)
  assert len(runs) == 4 * 7 and {r.budget for r in runs} == set(isoflop_sweep.BUDGETS)
  for run in runs:
    cd = spec.apply_overrides(config, {**run.overrides("decoder_only"),
                                       "model.vocab_size": isoflop_sweep.VOCAB_SIZE})
    cfg = from_configdict(cd)
    spent = run.num_steps * counting.tokens_per_step(cfg) * counting.flops_per_token(cfg)
    assert spent == pytest.approx(run.budget, rel=0.5 / run.num_steps + 1e-9)
    assert run.warmup_steps == round(0.05 * run.num_steps)


def test_sweep_file_plans_and_packs_seeds_together(tmp_path):
  config = lm.get_config("isoflop")
  points = spec.plan(config, "configs/lm.py:isoflop", "configs/sweeps/isoflop.py", str(tmp_path))
  assert len(points) == 4 * 7 * 2
  flat = [dict(spec.flat_items(spec.apply_overrides(config, p.overrides))) for p in points]
  groups = packing.group(flat, [None] * len(flat), 2)
  assert len(groups) == 28
  for g in groups:  # the two seeds of one run
    assert sorted(points[i].overrides["seed"] for i in g) == [0, 1]
    assert len({points[i].num_steps for i in g}) == 1


def test_no_vocabulary_is_a_clear_error():
  config = lm.get_config("isoflop")
  with pytest.raises(ValueError, match="model.vocab_size is 0"):
    isoflop.plan(config, [1e10])


def test_fixed_heads_give_widths_in_steps_of_the_heads():
  ladder = isoflop.Ladder(aspect_ratio=16, mlp_ratio=4, num_heads=4)
  shapes = [ladder.shape_for(n) for n in (7e3, 1.2e4, 2e4, 3.5e4, 6e4)]
  assert all(s.num_heads == 4 and s.d_model % 4 == 0 for s in shapes)
  estimates = [ladder.estimate(s.d_model, s.num_layers) for s in shapes]
  assert all(abs(math.log(e / n)) < math.log(1.12) for e, n in zip(estimates, (7e3, 1.2e4, 2e4,
                                                                                3.5e4, 6e4)))


def test_fixed_depth_ladder_varies_width_only():
  ladder = isoflop.Ladder(num_layers=2, mlp_ratio=4, num_heads=2)
  targets = (1.5e3, 5e3, 2e4, 5e4, 1e6)
  shapes = [ladder.shape_for(n) for n in targets]
  assert all(s.num_layers == 2 and s.num_heads == 2 and s.d_model % 2 == 0 for s in shapes)
  for shape, target in zip(shapes, targets):  # the even width nearest the target
    nearest = min(range(2, 1000, 2), key=lambda d: abs(math.log(24 * d * d / target)))
    assert shape.d_model == nearest
