"""Executes notebooks/explore.ipynb headless (nbclient) on the shared tiny G2P run."""

import os

import jupytext
import nbclient
import nbformat
import pytest

import g2p_mini

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = {"encoder_self.png", "decoder_self.png", "cross.png", "positional.png", "curves.png"}


def test_notebook_is_generated_from_its_jupytext_source():
  """explore.ipynb holds exactly the cells of explore.py (regenerate with jupytext --to notebook)."""
  source = jupytext.read(os.path.join(REPO, "notebooks", "explore.py"))
  notebook = nbformat.read(os.path.join(REPO, "notebooks", "explore.ipynb"), as_version=4)
  cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]  # noqa: E731
  assert cells(source) == cells(notebook)


def test_notebook_runs_headless_and_draws_its_figures(tmp_path_factory, tmp_path, monkeypatch):
  """Started in `notebooks/` of a checkout whose `runs/g2p_tiny` holds a trained run (here the
  mini run), the notebook restores that run without training, decodes with greedy, beam and
  sampling, and produces its five figures: PNG files in FIG_DIR and inline image outputs,
  without any cell error."""
  checkout = tmp_path / "checkout"
  (checkout / "notebooks").mkdir(parents=True)
  (checkout / "runs").mkdir()
  (checkout / "train.py").symlink_to(os.path.join(REPO, "train.py"))
  (checkout / "runs" / "g2p_tiny").symlink_to(g2p_mini.trained_run(tmp_path_factory))
  monkeypatch.delenv("EXPLORE_WORKDIR", raising=False)
  monkeypatch.setenv("EXPLORE_FIG_DIR", str(tmp_path / "figures"))
  monkeypatch.setenv("PYTHONPATH", REPO)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  notebook = nbformat.read(os.path.join(REPO, "notebooks", "explore.ipynb"), as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                   resources={"metadata": {"path": str(checkout / "notebooks")}})
  try:
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f"notebook cell failed: {str(e)[-1500:]}")
  images = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
  assert len(images) >= len(FIGURES)
  written = set(os.listdir(tmp_path / "figures"))
  assert written == FIGURES
  assert all(os.path.getsize(tmp_path / "figures" / f) > 1000 for f in written)
  text = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
  for method in ("greedy", "beam 4", "sample"):
    assert method in text
  assert "train/loss" not in text  # restored, not trained (training prints its final metrics)
  shown = "".join(o.get("data", {}).get("text/plain", "") for c in notebook.cells
                  for o in c.get("outputs", []))
  assert f"Run('{checkout / 'runs' / 'g2p_tiny'}'" in shown
