"""Both fits of one set of runs, side by side: Approach 2 and Approach 3 with bootstrap intervals
(2.5th to 97.5th percentile over resampled runs), and predictions at budgets left out of the fit,
checked against what those budgets' runs reached.

The FLOPs a model of N parameters spends per token, f(N), is fitted to the runs as a power law
(ln f linear in ln N): attention and the output head make it more than 6 N for small models.
Both approaches' D* = C / f(N*), and Approach 3's N*(C) minimises L(N, C / f(N)). A held-out
budget's observed best loss is the lowest mean (over seeds) of its sizes; its observed best size
is its own IsoFLOP parabola's vertex (the best size between the ladder's steps), beside the size
of that lowest loss.
"""

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from transformer.scaling import approach2, approach3, observations
from transformer.scaling.observations import Observations, ScalingError

PERCENTILES = (2.5, 97.5)


def key(budget: float) -> str:
  """A budget as scaling.json's key: '4e+11'. Three digits: a budget's runs spend it up to the
  rounding of their steps (under 0.5% from 100 steps up), so the key is the budget planned."""
  return f"{budget:.3g}"


def flops_relation(obs: Observations) -> tuple[float, float]:
  """(k, e) of f(N) = k N^e fitted to the runs' FLOPs per token."""
  n = np.array([r.params for r in obs.runs], np.float64)
  f = np.array([r.flops_per_token for r in obs.runs], np.float64)
  if len(set(n)) < 2:
    return float(np.mean(f / n)), 1.0
  e, log_k = np.polyfit(np.log(n), np.log(f), 1)
  return float(np.exp(log_k)), float(e)


def interval(values: Sequence[float]) -> list[float] | None:
  """The bootstrap's 95% interval of `values` (None without values)."""
  values = [v for v in values if np.isfinite(v)]
  return [float(np.percentile(values, p)) for p in PERCENTILES] if values else None


def _approach2(data: dict[str, np.ndarray], f: Callable, samples: int, seed: int,
               budgets: Sequence[float]) -> dict[str, Any]:
  base = approach2.fit(data["budget"], data["n"], data["loss"], f)
  kept = np.isin(data["budget"], [p.budget for p in base.profiles])  # the budgets with a vertex
  boots, failed = approach2.bootstrap(data["budget"][kept], data["n"][kept], data["loss"][kept],
                                      samples, seed, f)
  out = {"a": base.a, "b": base.b, "gamma": base.gamma, "k_n": base.k_n, "k_l": base.k_l,
         "profiles": [dataclasses.asdict(p) for p in base.profiles], "dropped": list(base.dropped),
         "intervals": {k: interval([getattr(b, k) for b in boots]) for k in ("a", "b", "gamma")},
         "bootstrap": {"samples": len(boots), "failed": failed}, "predictions": {}}
  for c in budgets:
    n = base.n_opt(c)
    out["predictions"][key(c)] = {
        "n_opt": n, "d_opt": c / f(n), "loss": base.loss_opt(c),
        "intervals": {"n_opt": interval([b.n_opt(c) for b in boots]),
                      "d_opt": interval([c / max(f(b.n_opt(c)), 1e-300) for b in boots]),
                      "loss": interval([b.loss_opt(c) for b in boots])}}
  return out


def _approach3(data: dict[str, np.ndarray], f: Callable, samples: int, seed: int,
               budgets: Sequence[float]) -> dict[str, Any]:
  base = approach3.fit(data["n"], data["d"], data["loss"])
  boots = approach3.bootstrap(data["n"], data["d"], data["loss"], base, samples, seed)
  names = ("E", "A", "B", "alpha", "beta", "a", "b")
  out = {k: getattr(base, k) for k in names} | {
      "objective": base.objective,
      "intervals": {k: interval([getattr(b, k) for b in boots]) for k in names},
      "bootstrap": {"samples": len(boots)}, "predictions": {}}
  for c in budgets:
    n, d, loss = approach3.optimum(base, c, f)
    optima = np.array([approach3.optimum(b, c, f) for b in boots]).reshape(-1, 3)
    out["predictions"][key(c)] = {"n_opt": n, "d_opt": d, "loss": loss, "intervals": {
        k: interval(optima[:, i]) for i, k in enumerate(("n_opt", "d_opt", "loss"))}}
  return out


def observed(obs: Observations, budget: float) -> dict[str, Any]:
  """What a budget's runs reached: lowest mean loss over seeds and its size, its vertex."""
  data = obs.arrays([budget])
  sizes = sorted(set(data["n"]))
  means = [float(np.mean(data["loss"][data["n"] == n])) for n in sizes]
  best = int(np.argmin(means))
  try:
    vertex = approach2.profile(budget, data["n"], data["loss"]).n_opt
  except ValueError:
    vertex = None
  return {"best_loss": means[best], "best_loss_params": sizes[best], "vertex_params": vertex,
          "runs": len(data["n"]), "sizes": sizes, "mean_losses": means}


def check(prediction: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any]:
  """A prediction's relative loss error and size ratio (>= 1) against what was observed."""
  size = seen["vertex_params"] or seen["best_loss_params"]
  ratio = prediction["n_opt"] / size
  return {"loss_error": prediction["loss"] / seen["best_loss"] - 1,
          "size_ratio": max(ratio, 1 / ratio),
          "loss_within_2pct": abs(prediction["loss"] / seen["best_loss"] - 1) <= 0.02,
          "size_within_1.5x": max(ratio, 1 / ratio) <= 1.5}


def analyse(obs: Observations, holdout: float = 0.0, predict: Sequence[float] = (),
            samples: int = 100, seed: int = 0, refusals: bool = False) -> dict[str, Any]:
  """scaling.json's content: both fits on the budgets below `holdout` (all if 0), predictions
  at the held-out budgets and at `predict`, each held-out prediction checked. An approach that
  cannot be fitted raises its ValueError, or with `refusals` is {"refused": why, "budgets": the
  fitted ones} and its held-out checks are left out."""
  held = [b for b in obs.budgets if holdout and b >= holdout / 1.1]
  fitted = [b for b in obs.budgets if b not in held]
  if len(fitted) < 2:
    raise ScalingError(f"{len(fitted)} budget(s) to fit ({', '.join(f'{b:.3g}' for b in fitted)})"
                       "; both approaches need 2 or more")
  k, e = flops_relation(obs)
  f = lambda n: k * n ** e  # noqa: E731
  data = obs.arrays(fitted)
  budgets = sorted(set(held) | set(predict))
  result = {
      "metric": obs.metric, "fitted_budgets": fitted, "held_out_budgets": held,
      "flops_per_token": {"k": k, "e": e},
      "runs": [dataclasses.asdict(r) for r in obs.runs], "left_out": list(obs.left_out),
      "held_out": {}}
  for name, approach in (("approach2", _approach2), ("approach3", _approach3)):
    try:
      result[name] = approach(data, f, samples, seed, budgets)
    except ValueError as error:
      if not refusals:
        raise
      result[name] = {"refused": str(error).splitlines()[0], "budgets": fitted}
  for c in held:
    seen = observed(obs, c)
    result["held_out"][key(c)] = {"observed": seen} | {
        name: check(result[name]["predictions"][key(c)], seen)
        for name in ("approach2", "approach3") if "refused" not in result[name]}
  return result


def fit_runs(paths: Sequence[str] | str, holdout: float = 0.0, predict: Sequence[float] = (),
             samples: int = 100, metric: str = "eval/loss", params: str = "non_embedding"
             ) -> dict[str, Any]:
  """Both fits of the runs under `paths` (workdirs, globs or a sweep's workdir): what
  `python -m transformer.scaling fit` writes to scaling.json; plots.plot(result, path) draws it."""
  obs = observations.read([paths] if isinstance(paths, str) else list(paths), metric, params)
  return analyse(obs, holdout, predict, samples) | {"params": params}
