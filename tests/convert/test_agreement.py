"""`python -m transformer.convert --workdir=RUN --check=HF_DIR` (convert/agreement.py): the
largest log-probability difference per position between a decoder-only workdir and a Hugging
Face directory, on test_llama.py's tiny offline Llama 2.

A converted workdir scores like its source (below 1e-4 everywhere). A fine-tuned workdir (every
parameter new) and its export differ, as docs/hf_conversion.md says, only through the start
token: ours reads its own (trained) row where the export reads <s>'s; with the start row set to
<s>'s the two agree again.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformer import convert  # noqa: E402
from transformer.convert import agreement  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
import test_llama  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(HF directory, converted workdir, restored Run) of test_llama's tiny Llama 2."""
  directory, _, _, workdir, run = test_llama.conversions(
      tmp_path_factory.mktemp("check"), test_llama.hf_model)("llama2")
  return directory, workdir, run


def test_cli_scores_a_converted_workdir_against_its_source(converted, tmp_path):
  """The command prints a heading, one line per position and the largest difference, below 1e-4
  for a converted workdir; its texts are --text_file's first lines."""
  directory, workdir, _ = converted
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(test_llama.bench.corpus()[:3]) + "\n")
  done = subprocess.run(
      [sys.executable, "-m", "transformer.convert", f"--workdir={workdir}", f"--check={directory}",
       f"--text_file={corpus}"], cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.strip().splitlines()
  assert lines[0].startswith(f"{workdir} vs {directory}, 3 texts: largest |log p(ours)")
  assert all(line.startswith("position ") for line in lines[1:-1]) and len(lines) > 4
  assert lines[-1].startswith("largest: ") and float(lines[-1].split()[1]) < 1e-4, lines


def test_a_fine_tuned_export_scores_as_its_workdir(converted, tmp_path):
  """New parameters (as after fine-tuning, the start token's row trained apart from <s>'s),
  exported: --check of the export against the workdir finds differences below 1e-4 (the untied
  export's <s> embedding row is our start token's; it used to be <s>'s own, hundredths apart)."""
  directory, workdir, run = converted
  with open(os.path.join(workdir, convert.CONVERTED_FROM)) as f:
    source = json.load(f)
  target = tokenizers.load(os.path.join(workdir, "tokenizers", "target"))
  params = test_llama._perturbed(run.params)  # pylint: disable=protected-access
  ours, exported = str(tmp_path / "tuned"), str(tmp_path / "tuned_hf")
  convert.write_workdir(run.config, params, target, ours, source)
  convert.to_hf(ours, exported)
  gaps = agreement.position_differences(ours, exported, agreement.TEXTS)
  assert gaps.max() < 1e-4, gaps


def test_a_directory_without_a_model_is_a_one_line_error(converted, tmp_path, capsys):
  """--check of a directory without config.json: exit 1, one line naming it."""
  (tmp_path / "hf").mkdir()
  assert convert.main([f"--workdir={converted[1]}", f"--check={tmp_path / 'hf'}"]) == 1
  assert capsys.readouterr().err == (f"error: --check={tmp_path / 'hf'}: no config.json (a Hugging "
                                     "Face model directory?)\n")
