"""Approach 3 refitted to Chinchilla's points as Besiroglu et al. (2024) extracted them from
Hoffmann et al.'s Figure 4: their refit found alpha = 0.348 and beta = 0.366 (Huber delta 1e-3 on
log loss, D = FLOP / (6 N), the 5 points of highest loss left out). The file's repository states
no licence, so it is not copied here: the test reads it from ../shared/data/ and skips, naming
it, where it is absent."""

import csv
import hashlib
import os

import numpy as np
import pytest

from transformer.scaling import approach3

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSV = os.path.join(REPO, "..", "shared", "data", "chinchilla_svg_extracted_data.csv")
SHA256 = "193478df4e90f040016431996c45682659306840ecdadf83cfb9cd5ca0aa1b30"


def points() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(N, D, loss) of the CSV's points but the 5 of highest loss (as Epoch's refit)."""
  if not os.path.isfile(CSV):
    pytest.skip(f"{os.path.normpath(CSV)} is absent (epoch-research/analyzing-chinchilla's "
                "data/svg_extracted_data.csv)")
  with open(CSV, "rb") as f:
    assert hashlib.sha256(f.read()).hexdigest() == SHA256, f"{CSV}: not the pinned file"
  with open(CSV, newline="") as f:
    rows = list(csv.DictReader(f))
  n = np.array([float(r["Model Size"]) for r in rows])
  c = np.array([float(r["Training FLOP"]) for r in rows])
  loss = np.array([float(r["loss"]) for r in rows])
  keep = loss < np.sort(loss)[-5]
  return n[keep], c[keep] / (6 * n[keep]), loss[keep]


def test_refit_lands_on_epochs_exponents():
  n, d, loss = points()
  assert len(n) == 240
  fit = approach3.fit(n, d, loss)
  assert abs(fit.alpha - 0.348) < 0.02 and abs(fit.beta - 0.366) < 0.02
  assert fit.E == pytest.approx(1.82, abs=0.05)
