"""Random search in a sweep file: N points drawn from ranges with a seed (no Ray, no JAX).

  from configs.sweeps import choice, log_uniform, random_search, uniform

  def get_sweep():
    return random_search({"train.learning_rate": log_uniform(1e-4, 3e-3),
                          "train.label_smoothing": uniform(0.0, 0.2),
                          "model.ffn": choice(["relu", "gelu"])}, num_points=16, seed=0)

The same space, `num_points` and seed give the same points; the first N points of a search are
the points of the same search with `num_points=N` (each point is drawn whole, in turn). Floats
keep `digits` significant digits, so that point names stay readable.
"""

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Range:
  """A distribution of one key's values: 'uniform', 'log_uniform', 'int_uniform' or 'choice'."""
  kind: str
  low: float = 0.0
  high: float = 0.0
  values: tuple[Any, ...] = ()

  def check(self, key: str) -> None:
    """Raises ValueError (one line, naming `key`) unless the range can be drawn from."""
    bounds = f"{self.kind}({self.low!r}, {self.high!r})"
    if self.kind == "choice":
      if not self.values:
        raise ValueError(f"random_search: {key}: choice() needs at least one value")
      bad = [v for v in self.values if not isinstance(v, (str, int, float, bool))]
      if bad:
        raise ValueError(f"random_search: {key}: choice value {bad[0]!r} is not a str, int, "
                         "float or bool")
      return
    numbers = all(isinstance(b, (int, float)) and not isinstance(b, bool)
                  and math.isfinite(b) for b in (self.low, self.high))
    if not numbers or not self.low < self.high:
      raise ValueError(f"random_search: {key}: {bounds} needs finite numbers with low < high")
    if self.kind == "log_uniform" and self.low <= 0:
      raise ValueError(f"random_search: {key}: {bounds} needs 0 < low < high")
    if self.kind == "int_uniform" and not all(isinstance(b, int) for b in (self.low, self.high)):
      raise ValueError(f"random_search: {key}: {bounds} needs integer bounds")

  def draw(self, rng: np.random.Generator, digits: int) -> Any:
    """One value, as a plain Python scalar."""
    if self.kind == "choice":
      return self.values[int(rng.integers(len(self.values)))]
    if self.kind == "int_uniform":
      return int(rng.integers(self.low, self.high, endpoint=True))
    if self.kind == "log_uniform":
      value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
    else:
      value = float(rng.uniform(self.low, self.high))
    rounded = float(f"{value:.{digits}g}") if digits > 0 else value
    return min(max(rounded, self.low), self.high)  # rounding never leaves the range


def uniform(low: float, high: float) -> Range:
  """Floats uniform in [low, high]."""
  return Range("uniform", low, high)


def log_uniform(low: float, high: float) -> Range:
  """Floats whose logarithm is uniform in [log low, log high] (0 < low < high)."""
  return Range("log_uniform", low, high)


def int_uniform(low: int, high: int) -> Range:
  """Integers uniform in [low, high], both ends included."""
  return Range("int_uniform", low, high)


def choice(values: Sequence[Any]) -> Range:
  """One of `values`, each equally likely."""
  if isinstance(values, (str, bytes, Mapping)):
    raise TypeError(f"choice: values must be a list, got {values!r:.80}")
  return Range("choice", values=tuple(values))


def random_search(space: Mapping[str, Range], num_points: int, seed: int = 0,
                  digits: int = 4) -> list[dict[str, Any]]:
  """`num_points` override dicts, each key of `space` drawn from its Range (keys in `space`'s
  order); a value drawn twice for every key is drawn again, so that no two points are one run."""
  if not isinstance(space, Mapping) or not space:
    raise ValueError("random_search: the space must be a non-empty dict of key -> range")
  if not isinstance(num_points, int) or isinstance(num_points, bool) or num_points < 1:
    raise ValueError(f"random_search: num_points={num_points!r} must be a positive integer")
  for key, rng_range in space.items():
    if not isinstance(rng_range, Range):
      raise ValueError(f"random_search: {key}: {rng_range!r:.60} is not a range (use uniform, "
                       "log_uniform, int_uniform or choice)")
    rng_range.check(key)
  rng = np.random.default_rng(seed)
  points: list[dict[str, Any]] = []
  seen: set[tuple[Any, ...]] = set()
  tries = 0
  while len(points) < num_points:
    point = {key: r.draw(rng, digits) for key, r in space.items()}
    signature = tuple(point.values())
    tries += 1
    if signature in seen:
      if tries > 100 * num_points:
        raise ValueError(f"random_search: the space has fewer than num_points={num_points} "
                         f"distinct points (found {len(points)})")
      continue
    seen.add(signature)
    points.append(point)
  return points
