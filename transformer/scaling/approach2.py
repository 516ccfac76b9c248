"""Approach 2 of Hoffmann et al. (2022): IsoFLOP profiles. Per budget, a robust parabola of final
loss against log N; its vertex is that budget's compute-optimal size N* and loss L*; then power
laws across budgets: N*(C) = k_N C^a, D*(C) = C / f(N*) (f: the FLOPs-per-token relation, 6 N
unless given), L*(C) = k_L C^-gamma (a pure power law: with 4 or 5 budgets an irreducible term is
not identified). The parabola is fitted by least squares with scipy's soft-L1 loss (residuals
beyond 0.01 in loss count linearly), so one badly trained run bends it little.
"""

import dataclasses
from typing import Callable, Sequence

import numpy as np
from scipy import optimize


@dataclasses.dataclass(frozen=True)
class Profile:
  """One budget's parabola loss = c0 + c1 x + c2 x^2 in x = ln N and its vertex."""
  budget: float
  coefficients: tuple[float, float, float]
  n_opt: float
  loss_opt: float
  runs: int


@dataclasses.dataclass(frozen=True)
class Fit:
  """The budgets' profiles and the power laws through their vertices."""
  profiles: tuple[Profile, ...]
  dropped: tuple[str, ...]  # budgets without a vertex, and why
  a: float  # N* ~ C^a
  k_n: float
  gamma: float  # L* ~ C^-gamma
  k_l: float
  b: float  # D* ~ C^b (= 1 - a under C = 6 N D)

  def n_opt(self, budget: float) -> float:
    """Compute-optimal parameters at `budget` FLOPs."""
    return float(np.exp(np.log(self.k_n) + self.a * np.log(budget)))  # inf, not OverflowError

  def loss_opt(self, budget: float) -> float:
    """Loss of the compute-optimal model at `budget` FLOPs."""
    return float(np.exp(np.log(self.k_l) - self.gamma * np.log(budget)))


def parabola(log_n: np.ndarray, loss: np.ndarray) -> tuple[float, float, float]:
  """Robust quadratic fit of loss in log N: soft-L1 least squares (f_scale 0.01 in loss) from
  the ordinary least squares fit."""
  start = np.polyfit(log_n, loss, 2)[::-1]
  result = optimize.least_squares(
      lambda c: c[0] + c[1] * log_n + c[2] * log_n ** 2 - loss, start, loss="soft_l1",
      f_scale=0.01)
  return tuple(float(c) for c in result.x)


def profile(budget: float, n: np.ndarray, loss: np.ndarray) -> Profile:
  """One budget's parabola and vertex; ValueError if it opens downward, its vertex lies outside
  the sizes, or it has < 3 sizes."""
  if len(set(np.round(n))) < 3:
    raise ValueError(f"budget {budget:.3g}: {len(set(np.round(n)))} model sizes; a parabola "
                     "needs 3 or more")
  c0, c1, c2 = parabola(np.log(n), loss)
  if c2 <= 0:
    raise ValueError(f"budget {budget:.3g}: the loss parabola opens downward (no minimum "
                     "among these sizes)")
  x = -c1 / (2 * c2)
  if not np.log(n.min()) <= x <= np.log(n.max()):
    raise ValueError(f"budget {budget:.3g}: the parabola's vertex (N {np.exp(x):.3g}) lies "
                     f"outside its sizes ({n.min():.3g} to {n.max():.3g})")
  return Profile(budget, (c0, c1, c2), float(np.exp(x)), float(c0 + c1 * x + c2 * x * x), len(n))


def fit(budget: Sequence[float], n: Sequence[float], loss: Sequence[float],
        flops_per_token: Callable[[float], float] = lambda n: 6 * n, drop: bool = True) -> Fit:
  """Approach 2 over runs labelled by their budget (equal labels: one IsoFLOP profile); a budget
  without a vertex is dropped and named (`drop`), else its ValueError raised."""
  budget, n, loss = (np.asarray(v, np.float64) for v in (budget, n, loss))
  profiles, dropped = [], []
  for c in np.unique(budget):
    try:
      profiles.append(profile(c, n[budget == c], loss[budget == c]))
    except ValueError as e:
      if not drop:
        raise
      dropped.append(str(e))
  if len(profiles) < 2:
    raise ValueError(f"Approach 2 needs 2 or more budgets with a vertex, got {len(profiles)}"
                     + (f" ({'; '.join(dropped)})" if dropped else ""))
  c = np.log([p.budget for p in profiles])
  a, log_k_n = np.polyfit(c, np.log([p.n_opt for p in profiles]), 1)
  slope_l, log_k_l = np.polyfit(c, np.log([p.loss_opt for p in profiles]), 1)
  d_opt = [p.budget / flops_per_token(p.n_opt) for p in profiles]
  b, _ = np.polyfit(c, np.log(d_opt), 1)
  return Fit(tuple(profiles), tuple(dropped), float(a), float(np.exp(log_k_n)), float(-slope_l),
             float(np.exp(log_k_l)), float(b))


def bootstrap(budget: Sequence[float], n: Sequence[float], loss: Sequence[float],
              samples: int = 200, seed: int = 0,
              flops_per_token: Callable[[float], float] = lambda n: 6 * n
              ) -> tuple[list[Fit], int]:
  """Fits to `samples` resamples of the runs within each budget; and how many resamples gave no
  fit (a budget's parabola without a minimum, or fewer than 3 sizes)."""
  budget, n, loss = (np.asarray(v, np.float64) for v in (budget, n, loss))
  rng = np.random.default_rng(seed)
  groups = [np.flatnonzero(budget == c) for c in np.unique(budget)]
  fits, failed = [], 0
  for _ in range(samples):
    i = np.concatenate([rng.choice(g, len(g)) for g in groups])
    try:
      fits.append(fit(budget[i], n[i], loss[i], flops_per_token, drop=False))
    except ValueError:
      failed += 1
  return fits, failed
