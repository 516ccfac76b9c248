"""Approach 3 of Hoffmann et al. (2022): L(N, D) = E + A / N^alpha + B / D^beta fitted to every
run, by variable projection.

The objective is Hoffmann et al.'s: the Huber loss (delta 1e-3) of log predicted minus log
observed loss, summed over runs. For fixed exponents (alpha, beta) the prediction is linear in
(E, A, B) >= 0, so the exponents are the only nonlinear unknowns:
  inner(alpha, beta): nonnegative least squares of the relative residuals (E + A x + B y - L) / L
    (x = N^-alpha, y = D^-beta; the first-order expansion of log pred - log L), then iteratively
    reweighted least squares on the Huber-of-log objective from there (Gauss-Newton steps on log
    pred, Huber's weights, each step a nonnegative least squares, halved until it descends);
  outer: the profiled objective on a grid of (alpha, beta), then Nelder-Mead from its best node.
Noise-free data of the model is fitted exactly: the inner least squares is then exact at the
true exponents (tests/scaling/test_approach3.py). The compute-optimal frontier under C = 6 N D is
N*(C) = G (C/6)^a, D*(C) = (C/6)^b / G with a = beta / (alpha + beta), b = alpha / (alpha + beta),
G = (alpha A / (beta B))^(1 / (alpha + beta)); `optimum` solves it for any FLOPs-per-token
relation C = f(N) D.
"""

import dataclasses
import itertools
from typing import Callable, Sequence

import numpy as np
from scipy import optimize

HUBER_DELTA = 1e-3
ALPHA_GRID = tuple(np.round(np.arange(0.05, 1.5, 0.1), 2))  # the outer grid of alpha and beta


@dataclasses.dataclass(frozen=True)
class Fit:
  """A fitted L(N, D) = E + A / N^alpha + B / D^beta and its objective value."""
  E: float
  A: float
  B: float
  alpha: float
  beta: float
  objective: float

  @property
  def a(self) -> float:
    """N*'s exponent in C: beta / (alpha + beta)."""
    return self.beta / (self.alpha + self.beta)

  @property
  def b(self) -> float:
    """D*'s exponent in C: alpha / (alpha + beta)."""
    return self.alpha / (self.alpha + self.beta)

  def loss(self, n: np.ndarray | float, d: np.ndarray | float) -> np.ndarray:
    """The fitted loss of models of n parameters trained on d tokens."""
    return self.E + self.A * np.power(n, -self.alpha) + self.B * np.power(d, -self.beta)


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
  """Huber's loss of residuals r: r^2 / 2 within delta, linear beyond."""
  a = np.abs(r)
  return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _design(n: np.ndarray, d: np.ndarray, alpha: float, beta: float) -> np.ndarray:
  return np.stack([np.ones_like(n), np.power(n, -alpha), np.power(d, -beta)], axis=1)


def _huber_log(w: np.ndarray, x: np.ndarray, log_loss: np.ndarray, delta: float) -> float:
  """The Huber-of-log objective of coefficients w = (E, A, B)."""
  pred = np.maximum(x @ w, 1e-300)
  return float(huber(np.log(pred) - log_loss, delta).sum())


def inner(n: np.ndarray, d: np.ndarray, loss: np.ndarray, alpha: float, beta: float,
          delta: float = HUBER_DELTA, iterations: int = 50) -> tuple[np.ndarray, float]:
  """(E, A, B) >= 0 minimising the Huber-of-log objective at fixed exponents, and its value."""
  x = _design(n, d, alpha, beta)
  log_loss = np.log(loss)
  w, _ = optimize.nnls(x / loss[:, None], np.ones_like(loss))
  if not np.any(w > 0):
    w = np.array([loss.min(), 0.0, 0.0])
  value = _huber_log(w, x, log_loss, delta)
  for _ in range(iterations):
    w_next = _irls_step(w, x, log_loss, delta)
    step = 1.0
    while (next_value := _huber_log(w + step * (w_next - w), x, log_loss, delta)) > value:
      step /= 2
      if step < 1e-6:
        return w, value
    w, previous, value = w + step * (w_next - w), value, next_value
    if previous - value <= 1e-14 * max(previous, 1e-300):
      break
  return w, value


def _irls_step(w: np.ndarray, x: np.ndarray, log_loss: np.ndarray, delta: float) -> np.ndarray:
  """One Gauss-Newton step of iteratively reweighted least squares for the Huber objective: log
  pred linearised around w, Huber's weights min(1, delta / |r|), the coefficients kept >= 0."""
  pred = np.maximum(x @ w, 1e-300)
  r = np.log(pred) - log_loss
  jac = x / pred[:, None]
  root = np.sqrt(np.minimum(1.0, delta / np.maximum(np.abs(r), 1e-300)))[:, None]
  target = jac @ w - r
  w_next, _ = optimize.nnls(root * jac, root[:, 0] * target)
  return w_next


def fit(n: Sequence[float], d: Sequence[float], loss: Sequence[float],
        delta: float = HUBER_DELTA, grid: Sequence[float] = ALPHA_GRID,
        start: tuple[float, float] | None = None) -> Fit:
  """The Approach 3 fit of runs of n parameters, d tokens and final loss (arrays of one length);
  `start` (alpha, beta) skips the grid (a bootstrap resample starts from the full fit)."""
  n, d, loss = (np.asarray(v, np.float64) for v in (n, d, loss))
  if len(n) < 5 or np.any(~np.isfinite(loss)) or np.any(loss <= 0):
    raise ValueError(f"Approach 3 needs >= 5 runs of finite positive loss, got {len(n)}")
  profile = lambda ab: inner(n, d, loss, *ab, delta)[1]  # noqa: E731
  if start is None:
    start = min(itertools.product(grid, grid), key=profile)
  result = optimize.minimize(lambda ab: profile(np.clip(ab, 1e-3, 5.0)), np.asarray(start),
                             method="Nelder-Mead",
                             options=dict(xatol=1e-7, fatol=1e-16, maxiter=2000))
  alpha, beta = np.clip(result.x, 1e-3, 5.0)
  (e, a, b), value = inner(n, d, loss, alpha, beta, delta)
  return Fit(float(e), float(a), float(b), float(alpha), float(beta), float(value))


def optimum(f: Fit, budget: float, flops_per_token: Callable[[float], float] = lambda n: 6 * n
            ) -> tuple[float, float, float]:
  """(N*, D*, L*) minimising the fitted loss at `budget` FLOPs, where a model of N parameters
  spends flops_per_token(N) per token (6 N: the closed form above)."""
  def loss_at(log_n: float) -> float:
    n = np.exp(log_n)
    return float(f.loss(n, budget / flops_per_token(n)))
  # the closed form under 6 N D (in logs: extreme fits overflow floats) brackets the search
  log_g = (np.log(f.alpha * max(f.A, 1e-300)) - np.log(f.beta * max(f.B, 1e-300))) / (
      f.alpha + f.beta)
  guess = float(np.clip(log_g + f.a * np.log(budget / 6), -20.0, 60.0))
  result = optimize.minimize_scalar(loss_at, bounds=(guess - 15, guess + 15), method="bounded",
                                    options=dict(xatol=1e-10))
  n = float(np.exp(result.x))
  return n, budget / flops_per_token(n), float(f.loss(n, budget / flops_per_token(n)))


def bootstrap(n: Sequence[float], d: Sequence[float], loss: Sequence[float], base: Fit,
              samples: int = 200, seed: int = 0, delta: float = HUBER_DELTA) -> list[Fit]:
  """Fits to `samples` resamples of the runs (with replacement), each started at `base`'s
  exponents."""
  n, d, loss = (np.asarray(v, np.float64) for v in (n, d, loss))
  rng = np.random.default_rng(seed)
  fits = []
  for _ in range(samples):
    i = rng.integers(0, len(n), len(n))
    if len(set(zip(n[i], d[i]))) < 5:
      continue
    fits.append(fit(n[i], d[i], loss[i], delta, start=(base.alpha, base.beta)))
  return fits
