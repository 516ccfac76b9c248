"""Approach 3 (variable projection, Huber on log loss) against known answers: a noise-free
synthetic surface, and the Huber objective's own minimum."""

import numpy as np
import pytest

import scaling_surface as synthetic_surface
from transformer.scaling import approach3

TRUE = synthetic_surface.TRUE


def test_recovers_a_noise_free_surface_with_alpha_not_beta():
  _, n, d, loss = synthetic_surface.isoflop_runs()
  fit = approach3.fit(n, d, loss)
  assert abs(fit.alpha - TRUE.alpha) < 0.005 and abs(fit.beta - TRUE.beta) < 0.005
  for name in ("E", "A", "B"):
    assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=0.01), name
  assert fit.a == pytest.approx(TRUE.beta / (TRUE.alpha + TRUE.beta), abs=0.002)


def test_inner_solve_minimises_the_huber_objective_at_fixed_exponents():
  rng = np.random.default_rng(1)
  _, n, d, loss = synthetic_surface.isoflop_runs()
  noisy = loss * np.exp(rng.normal(0, 0.01, loss.shape))
  w, value = approach3.inner(n, d, noisy, 0.3, 0.4)
  assert np.all(w >= 0)
  x = np.stack([np.ones_like(n), n ** -0.3, d ** -0.4], axis=1)
  objective = lambda v: approach3.huber(np.log(x @ v) - np.log(noisy)).sum()  # noqa: E731
  assert value == pytest.approx(objective(w), rel=1e-9)
  for _ in range(200):  # no nearby nonnegative (E, A, B) does better
    trial = np.maximum(w * np.exp(rng.normal(0, 0.01, 3)), 0)
    assert objective(trial) >= value - 1e-12


def test_optimum_has_the_closed_form_under_six_n_d():
  c = 1e21
  n, d, _ = approach3.optimum(TRUE, c)
  g = (TRUE.alpha * TRUE.A / (TRUE.beta * TRUE.B)) ** (1 / (TRUE.alpha + TRUE.beta))
  assert n == pytest.approx(g * (c / 6) ** TRUE.a, rel=1e-5)
  assert d == pytest.approx((c / 6) ** TRUE.b / g, rel=1e-5)


def test_bootstrap_intervals_hold_the_truth_on_noisy_data():
  rng = np.random.default_rng(2)
  _, n, d, loss = synthetic_surface.isoflop_runs()
  noisy = loss * np.exp(rng.normal(0, 0.003, loss.shape))
  base = approach3.fit(n, d, noisy)
  fits = approach3.bootstrap(n, d, noisy, base, samples=10, seed=0)
  alphas = [f.alpha for f in fits]
  assert len(fits) == 10 and np.std(alphas) > 0
  assert min(alphas) - 0.05 < TRUE.alpha < max(alphas) + 0.05


def test_too_few_runs_is_a_clear_error():
  with pytest.raises(ValueError, match="needs >= 5 runs"):
    approach3.fit([1e6, 2e6], [1e8, 1e8], [3.0, 2.9])
