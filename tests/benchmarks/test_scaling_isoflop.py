"""benchmarks/scaling_isoflop.py: the learning rate it picks from the scan and the record's flat
metrics from a fit's scaling.json."""

import pytest

from bench_loader import load_benchmark

scaling_isoflop = load_benchmark("scaling_isoflop")


def test_rate_of_least_mean_regret_over_the_shapes_it_ran_at():
  rows = [{"d_model": d, "layers": 1, "learning_rate": lr, "loss": loss}
          for d, lr, loss in ((32, 1e-3, 2.6), (32, 4e-3, 2.4), (32, 1.6e-2, 2.5),
                              (64, 1e-3, 2.3), (64, 4e-3, 2.2))]
  rate, regrets = scaling_isoflop.best_rate(rows)
  assert rate == 4e-3
  assert regrets == pytest.approx({"0.001": 0.15, "0.004": 0.0, "0.016": 0.1})


def test_metrics_flatten_the_fit_and_the_held_out_check():
  prediction = {"n_opt": 5e4, "d_opt": 4e5, "loss": 1.99,
                "intervals": {"n_opt": [4e4, 6e4], "loss": [1.95, 2.02], "d_opt": [3e5, 5e5]}}
  result = {
      "runs": [{}] * 40, "fitted_budgets": [1.0, 2.0, 3.0], "held_out_budgets": [4.0],
      "approach2": {"a": 0.5, "b": 0.5, "predictions": {"2e+11": prediction}},
      "approach3": {"a": 0.55, "b": 0.45, "alpha": 0.3, "beta": 0.36, "E": 1.2,
                    "predictions": {"2e+11": prediction}},
      "held_out": {"2e+11": {
          "observed": {"best_loss": 2.0, "vertex_params": 5.5e4, "best_loss_params": 6e4},
          "approach2": {"loss_error": -0.005, "size_ratio": 1.1},
          "approach3": {"loss_error": -0.005, "size_ratio": 1.1}}}}
  m = scaling_isoflop.metrics(result, 8e-3, [0.1, 2.5])
  assert m["held_out_budget_flops"] == 2e11 and m["budgets"] == 4 and m["runs"] == 40
  assert m["a3_loss_error_pct"] == pytest.approx(-0.5) and m["a2_size_ratio"] == 1.1
  assert m["observed_best_params"] == 5.5e4 and m["epochs_max"] == 2.5
  assert (m["a3_pred_loss_lo"], m["a3_pred_loss_hi"]) == (1.95, 2.02)
  assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in m.values())


def test_a_refused_approach_is_recorded_and_meets_no_goal():
  """Approach 2 without a vertex: no a2 metrics, the goals false for it, Approach 3's checked."""
  prediction = {"n_opt": 1.5e3, "d_opt": 1e7, "loss": 1.94,
                "intervals": {"n_opt": [1e3, 4e3], "loss": [1.2, 2.02], "d_opt": None}}
  result = {
      "runs": [{"budget": 2e11, "params": 12480, "loss": v, "seed": s}
               for s, v in ((0, 1.99), (1, 2.01))], "fitted_budgets": [1.0, 2.0, 3.0],
      "held_out_budgets": [2e11],
      "approach2": {"refused": "Approach 2 needs 2 or more budgets with a vertex, got 0",
                    "budgets": [1.0, 2.0, 3.0]},
      "approach3": {"a": 0.16, "b": 0.84, "alpha": 0.48, "beta": 0.09, "E": 0.0,
                    "intervals": {"alpha": [0.1, 5.0], "E": None},
                    "predictions": {"2e+11": prediction}},
      "held_out": {"2e+11": {
          "observed": {"best_loss": 2.0, "vertex_params": None, "best_loss_params": 12480},
          "approach3": {"loss_error": -0.03, "size_ratio": 8.3, "loss_within_2pct": False,
                        "size_within_1.5x": False}}}}
  m = scaling_isoflop.metrics(result, 1.6e-2, [0.05, 2.85])
  assert not any(k.startswith("a2_") for k in m)
  assert m["a3_alpha_hi"] == 5.0 and "a3_E_lo" not in m and m["a3_size_ratio"] == 8.3
  goals = scaling_isoflop.goals(result)
  assert goals["loss_within_2pct"]["approach2"] == {"met": False, "refused": True}
  assert goals["size_within_1.5x"]["approach3"] == {"value": 8.3, "met": False}
  assert scaling_isoflop.seed_spread(result) == {"observed_best_loss": [1.99, 2.01]}
