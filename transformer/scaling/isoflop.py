"""IsoFLOP sweeps from a base config: for each compute budget, a ladder of model shapes, each
trained for the steps that spend the budget.

Shapes (`Ladder.shape_for`): non-embedding parameters N ~ (4 + 2 r) L d^2 (attention's four d x d
matrices, an FFN of two d x r d matrices, three where choices.FFNS says it is gated) for depth L,
width d, mlp_dim = r d, heads of `head_dim`. For a target N: of the widths that are multiples of
head_dim with d / L within a factor 2 of `aspect_ratio` (or, with a fixed `num_layers`, at that
depth: the ladder µP transfers a learning rate along), the (d, L) whose estimate is nearest N.
Sizes per budget (`sizes_for`): `num_sizes` targets spaced by the factor `spacing`, centred
(geometrically) on N_c = sqrt(C / (6 k)), where a model trained on k = tokens_per_param tokens per
parameter spends C = 6 N D (Chinchilla's k = 20 is a prior, not a fit). Steps (`run_for`): num_steps
= round(C / (FLOPs per token x tokens per step)) with counting.flops_per_token (MFU's count:
attention and the output head included), warmup warmup_fraction of the run, and the schedule
(train.schedule, e.g. warmup_cosine) decays over num_steps, so both scale with the run. Seeds are
points that differ only in `seed`: `sweep.py --pack=N` trains them as members of one program.
"""

import dataclasses
import math
from typing import Any, Sequence

from transformer import choices, config as config_lib
from transformer.scaling import counting
from transformer.sweeps import spec


@dataclasses.dataclass(frozen=True)
class Shape:
  """A model's width, depth, heads and FFN size."""
  d_model: int
  num_layers: int
  num_heads: int
  mlp_dim: int

  def overrides(self, arch: str) -> dict[str, int]:
    """The config overrides that build this shape (decoder and/or encoder layers by arch)."""
    out = {"model.d_model": self.d_model, "model.num_heads": self.num_heads,
           "model.mlp_dim": self.mlp_dim}
    if arch != "encoder_only":
      out["model.num_decoder_layers"] = self.num_layers
    if arch != "decoder_only":
      out["model.num_encoder_layers"] = self.num_layers
    return out


@dataclasses.dataclass(frozen=True)
class Ladder:
  """The shape rule: fixed aspect ratio d / L (or a fixed depth `num_layers`), heads of head_dim
  (or a fixed `num_heads`, d a multiple of it), mlp_dim = mlp_ratio x d; a `gated` FFN (plan sets
  it from choices.FFNS) has three matrices."""
  aspect_ratio: float = 32.0
  head_dim: int = 16
  mlp_ratio: int = 4
  gated: bool = False
  num_heads: int = 0  # 0: d / head_dim heads
  num_layers: int = 0  # 0: the depth follows the aspect ratio; else every shape has this depth

  def estimate(self, d_model: int, num_layers: int) -> int:
    """Non-embedding parameters of a shape under the rule's estimate (4 + m r) L d^2, m the FFN's
    matrices."""
    return (4 + (3 if self.gated else 2) * self.mlp_ratio) * num_layers * d_model ** 2

  def shape_for(self, params: float) -> Shape:
    """Of the shapes with d a multiple of head_dim (of num_heads, if set) and d / L within a
    factor 2 of the aspect ratio (L = num_layers, if set), the one whose estimated parameters are
    nearest `params` (in ratio; ties: the one nearest the aspect ratio)."""
    if params <= 0:
      raise ValueError(f"a model of {params} parameters has no shape")
    step = self.num_heads or self.head_dim
    candidates = []
    for layers in [self.num_layers] if self.num_layers else range(1, 257):
      d = max(step, round(math.sqrt(params / self.estimate(1, layers)) / step) * step)
      for width in (d - step, d, d + step):
        ratio = width / layers
        if width >= step and (self.num_layers or 0.5 <= ratio / self.aspect_ratio <= 2):
          candidates.append((abs(math.log(self.estimate(width, layers) / params)),
                             abs(math.log(ratio / self.aspect_ratio)), width, layers))
    if not candidates:
      raise ValueError(f"no shape of {params:.3g} parameters has d / L near {self.aspect_ratio}")
    _, _, d, layers = min(candidates)
    return Shape(d, layers, self.num_heads or d // self.head_dim, self.mlp_ratio * d)


def sizes_for(budget: float, num_sizes: int = 5, spacing: float = 2.0,
              tokens_per_param: float = 20.0) -> list[float]:
  """Target non-embedding parameter counts of one budget: `num_sizes` values spaced by `spacing`,
  centred on sqrt(budget / (6 tokens_per_param))."""
  if budget <= 0 or num_sizes < 1 or spacing <= 1 or tokens_per_param <= 0:
    raise ValueError(f"budget {budget:g}, num_sizes {num_sizes}, spacing {spacing}, "
                     f"tokens_per_param {tokens_per_param}: need > 0, >= 1, > 1, > 0")
  centre = math.sqrt(budget / (6 * tokens_per_param))
  return [centre * spacing ** (i - (num_sizes - 1) / 2) for i in range(num_sizes)]


@dataclasses.dataclass(frozen=True)
class Run:
  """One (budget, shape) of an IsoFLOP sweep and what it costs."""
  budget: float
  shape: Shape
  num_steps: int
  warmup_steps: int
  flops_per_token: float
  tokens: int  # num_steps x tokens per step
  flops: float  # tokens x flops_per_token (the budget up to the rounding of steps)

  def overrides(self, arch: str) -> dict[str, Any]:
    """The config overrides of this run (without the seed)."""
    return {**self.shape.overrides(arch), "train.num_steps": self.num_steps,
            "train.warmup_steps": self.warmup_steps}


def run_for(config: Any, budget: float, shape: Shape, warmup_fraction: float = 0.05,
            vocab_size: int = 0) -> Run:
  """The run of `shape` that spends `budget` FLOPs under the ConfigDict `config`; `vocab_size`
  (or the config's model.vocab_size) is the vocabulary the FLOPs are counted with."""
  vocab = vocab_size or config.model.vocab_size
  if vocab <= 0:
    raise ValueError("model.vocab_size is 0: pass vocab_size= (the tokenizer's, as the run's "
                     "config.json will have it) to count FLOPs")
  cd = spec.apply_overrides(config, {**shape.overrides(config.model.arch),
                                     "model.vocab_size": vocab})
  cfg = config_lib.from_configdict(cd)
  per_token, per_step = counting.flops_per_token(cfg), counting.tokens_per_step(cfg)
  steps = max(1, round(budget / (per_token * per_step)))
  warmup = min(steps - 1, round(warmup_fraction * steps)) if steps > 1 else 0
  return Run(budget, shape, steps, warmup, per_token, steps * per_step,
             steps * per_step * per_token)


def plan(config: Any, budgets: Sequence[float], ladder: Ladder = Ladder(), num_sizes: int = 5,
         spacing: float = 2.0, tokens_per_param: float = 20.0, warmup_fraction: float = 0.05,
         vocab_size: int = 0) -> list[Run]:
  """The runs of an IsoFLOP sweep of the ConfigDict `config`, budget-major (`run_for` each
  budget's `sizes_for` shapes)."""
  if not (vocab_size or config.model.vocab_size):
    raise ValueError("model.vocab_size is 0: pass vocab_size= (the tokenizer's, as the run's "
                     "config.json will have it) to count FLOPs")
  ffn = choices.FFNS[config.model.ffn]
  if ffn.mixture:
    raise ValueError("model.ffn=moe: the shape rule sizes dense feed-forwards")
  ladder = dataclasses.replace(ladder, gated=ffn.gated)
  runs = []
  for budget in budgets:
    shapes = [ladder.shape_for(n) for n in sizes_for(budget, num_sizes, spacing, tokens_per_param)]
    if len(set(shapes)) < len(shapes):
      raise ValueError(f"budget {budget:g}: two sizes round to the same shape ({shapes}); "
                       "widen the spacing or lower head_dim")
    runs += [run_for(config, budget, shape, warmup_fraction, vocab_size) for shape in shapes]
  return runs


def sweep_points(config: Any, runs: Sequence[Run], seeds: Sequence[int] = (0, 1)
                 ) -> list[dict[str, Any]]:
  """A sweep file's override dicts: every run once per seed (`--pack` packs the seeds of a
  run)."""
  return [_readable({**run.overrides(config.model.arch), "seed": seed})
          for run in runs for seed in seeds]


def _readable(overrides: dict[str, Any]) -> dict[str, Any]:
  """The same overrides, the keys that name a point (width, depth, steps, seed) first."""
  first = ("model.d_model", "model.num_decoder_layers", "model.num_encoder_layers",
           "train.num_steps", "seed", "train.learning_rate")
  return {k: overrides[k] for k in (*first, *overrides) if k in overrides}
