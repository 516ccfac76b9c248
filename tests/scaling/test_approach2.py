"""Approach 2 (IsoFLOP parabolas and power laws through their vertices) on the synthetic surface
of test_approach3: its exponent a against the true beta / (alpha + beta), the bias measured."""

import numpy as np
import pytest

import scaling_surface as synthetic_surface
from transformer.scaling import approach2, approach3

TRUE = synthetic_surface.TRUE


def test_bias_of_approach_2_on_the_noise_free_surface_is_measured_and_small():
  budget, n, _, loss = synthetic_surface.isoflop_runs()
  fit = approach2.fit(budget, n, loss)
  bias = fit.a - TRUE.a  # reported in docs/scaling.md#known-answers
  print(f"Approach 2 on the noise-free surface: a = {fit.a:.4f} (true {TRUE.a:.4f}, bias "
        f"{bias:+.4f}); b = {fit.b:.4f} (true {TRUE.b:.4f})")
  assert abs(bias) < 0.01
  for p in fit.profiles:  # each vertex within 10% of the budget's true optimum
    n_true, _, loss_true = approach3.optimum(TRUE, p.budget)
    assert p.n_opt == pytest.approx(n_true, rel=0.1)
    assert p.loss_opt == pytest.approx(loss_true, rel=0.002)


def test_vertex_of_an_exact_parabola():
  n = np.exp(np.linspace(10, 14, 7))
  loss = 2.0 + 0.05 * (np.log(n) - 12.0) ** 2
  p = approach2.profile(1e15, n, loss)
  assert p.n_opt == pytest.approx(np.exp(12.0), rel=1e-6) and p.loss_opt == pytest.approx(2.0)


def test_robust_parabola_shrugs_off_one_bad_run():
  n = np.exp(np.linspace(10, 14, 9))
  loss = 2.0 + 0.05 * (np.log(n) - 12.0) ** 2
  loss[2] += 0.5  # a diverged-ish run
  assert approach2.profile(1e15, n, loss).n_opt == pytest.approx(np.exp(12.0), rel=0.05)


def test_a_parabola_without_minimum_names_its_budget():
  n = np.array([1e4, 2e4, 4e4, 8e4])
  with pytest.raises(ValueError, match="budget 1e\\+12: the loss parabola opens downward"):
    approach2.profile(1e12, n, 3.0 - 0.01 * np.log(n) ** 2)


def test_power_laws_through_exact_vertices():
  budgets = [1e15, 1e16, 1e17]
  rows = []
  for c in budgets:
    centre = 0.1 * c ** 0.5
    for k in range(-2, 3):
      n = centre * 2.0 ** k
      rows.append((c, n, 3.0 * c ** -0.05 + 0.02 * np.log(n / centre) ** 2))
  budget, n, loss = (np.array(v) for v in zip(*rows))
  fit = approach2.fit(budget, n, loss)
  assert fit.a == pytest.approx(0.5, abs=1e-4) and fit.gamma == pytest.approx(0.05, abs=1e-4)
  assert fit.n_opt(1e18) == pytest.approx(0.1 * 1e9, rel=1e-3)
  assert fit.loss_opt(1e18) == pytest.approx(3.0 * 1e18 ** -0.05, rel=1e-4)


def test_a_budget_without_a_vertex_is_dropped_and_named():
  budget, n, _, loss = synthetic_surface.isoflop_runs()
  top = budget == budget.max()
  loss = np.where(top, 3.0 - 0.01 * np.log(n) ** 2, loss)  # no minimum at the top budget
  fit = approach2.fit(budget, n, loss)
  assert len(fit.profiles) == 3 and len(fit.dropped) == 1
  assert fit.dropped[0].startswith("budget 1e+21: the loss parabola opens downward")
  with pytest.raises(ValueError, match="opens downward"):
    approach2.fit(budget, n, loss, drop=False)


def test_a_vertex_outside_the_sizes_is_no_vertex():
  n = np.exp(np.linspace(10, 12, 5))
  loss = 2.0 + 0.05 * (np.log(n) - 9.0) ** 2  # the minimum at ln N = 9, below the sizes
  with pytest.raises(ValueError, match="vertex .* lies outside its sizes"):
    approach2.profile(1e15, n, loss)
