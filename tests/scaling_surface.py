"""A noise-free loss surface L = E + A / N^alpha + B / D^beta with alpha != beta, sampled as an
IsoFLOP study would sample it: budgets 1e18..1e21 FLOPs, 9 sizes per budget around its optimum,
D = C / (6 N)."""

import numpy as np

from transformer.scaling import approach3

TRUE = approach3.Fit(E=1.7, A=400.0, B=1200.0, alpha=0.30, beta=0.40, objective=0.0)
BUDGETS = (1e18, 1e19, 1e20, 1e21)


def isoflop_runs(surface: approach3.Fit = TRUE, budgets=BUDGETS, sizes: int = 9,
                 spacing: float = 1.6) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(budget, N, D, loss) of `sizes` models per budget spaced `spacing` apart in N, centred on
  the surface's own optimum."""
  rows = []
  for c in budgets:
    centre, _, _ = approach3.optimum(surface, c)
    for i in range(sizes):
      n = centre * spacing ** (i - (sizes - 1) / 2)
      rows.append((c, n, c / (6 * n)))
  budget, n, d = (np.array(v) for v in zip(*rows))
  return budget, n, d, surface.loss(n, d)
