"""Small helpers for sweep files: a sweep is a list of override dicts, one dict per run.

A sweep file defines `get_sweep()` (or `get_sweep(config)`, which receives a copy of the chosen
config, e.g. to scale warmup to `config.train.num_steps`) and returns such a list, using the same
dotted keys as `--config.*` on the command line:

  from configs.sweeps import product, sweep

  def get_sweep():
    return product(sweep("model.positional", ["sinusoidal", "rope"]),
                   sweep("train.learning_rate", [0.5, 1.0]))   # 4 runs

`sweep(key, values)` varies one key; `product(a, b, ...)` is every combination (the last factor
varies fastest); `zip(a, b, ...)` pairs equal-length sweeps point by point; `chain(a, b, ...)`
concatenates them. A plain list of dicts is a sweep too, for options that set several keys at once.
"""

from __future__ import annotations

import builtins
import itertools
from typing import Any, Iterable, Mapping, Sequence

# Random search: `random_search(space, num_points, seed)` draws points from ranges (`uniform`,
# `log_uniform`, `int_uniform`, `choice`), so a random search is one sweep file too.
from transformer.sweeps.search import (  # noqa: F401  pylint: disable=unused-import
    choice, int_uniform, log_uniform, random_search, uniform)

Overrides = dict[str, Any]


def _merge(parts: Iterable[Mapping[str, Any]], where: str) -> Overrides:
  """One override dict from several; a key set by two parts is an error (which would win?)."""
  merged: Overrides = {}
  for part in parts:
    for key, value in part.items():
      if key in merged:
        raise ValueError(f"{where}: key {key!r} is set by two of the combined sweeps")
      merged[key] = value
  return merged


def _points(s: Sequence[Mapping[str, Any]], where: str) -> list[Overrides]:
  if isinstance(s, Mapping) or not all(isinstance(p, Mapping) for p in s):
    raise TypeError(f"{where}: a sweep is a list of dicts, got {s!r:.80}")
  return [dict(p) for p in s]


def sweep(key: str, values: Iterable[Any]) -> list[Overrides]:
  """One run per value of `key`: sweep('model.ffn', ['relu', 'gelu']) -> [{'model.ffn': 'relu'}, ...]."""
  if not isinstance(key, str) or not key:
    raise TypeError(f"sweep: the key must be a dotted config key, got {key!r}")
  if isinstance(values, (str, bytes, Mapping)):
    raise TypeError(f"sweep({key!r}, ...): values must be a list, got {values!r:.80}")
  return [{key: v} for v in values]


def product(*sweeps: Sequence[Mapping[str, Any]]) -> list[Overrides]:
  """Every combination of one point from each sweep (the last sweep varies fastest)."""
  lists = [_points(s, "product") for s in sweeps]
  return [_merge(combo, "product") for combo in itertools.product(*lists)]


def zip(*sweeps: Sequence[Mapping[str, Any]]) -> list[Overrides]:  # pylint: disable=redefined-builtin
  """Point i of every sweep merged into run i; the sweeps must have the same length."""
  lists = [_points(s, "zip") for s in sweeps]
  lengths = sorted({len(s) for s in lists})
  if len(lengths) > 1:
    raise ValueError(f"zip: the sweeps have different lengths {[len(s) for s in lists]}")
  return [_merge(parts, "zip") for parts in builtins.zip(*lists)]


def chain(*sweeps: Sequence[Mapping[str, Any]]) -> list[Overrides]:
  """The runs of every sweep, one after the other."""
  return [p for s in sweeps for p in _points(s, "chain")]
