"""The distribution: an Apache-2.0 LICENSE, and a wheel that installs the `transformer` package only.

configs/, benchmarks/ and the scripts stay in the checkout (config files load by path); a wheel
that also installed them would put a generic top-level `configs` package into site-packages.
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_license_is_the_apache_2_text_the_metadata_declares():
  """LICENSE holds the Apache License 2.0 with the project's copyright line, and pyproject.toml
  declares that SPDX identifier and ships that file."""
  with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
    text = f.read()
  assert text.startswith("Copyright 2026 The transformer authors\n")
  for phrase in ("Apache License", "Version 2.0, January 2004",
                 "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
                 "END OF TERMS AND CONDITIONS"):
    assert phrase in text, phrase
  with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as f:
    pyproject = f.read()
  assert re.search(r'^license = "Apache-2\.0"$', pyproject, re.MULTILINE)
  assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, re.MULTILINE)


def test_wheel_holds_the_transformer_package_and_the_license_only(tmp_path):
  """A wheel built from a copy of the checkout's packaging inputs (configs/ included, so that its
  absence is a real exclusion) holds `transformer/` with its subpackages and the dist-info with
  LICENSE, and no other top-level entry. Built with the installed setuptools (a few seconds)."""
  setuptools = pytest.importorskip("setuptools")
  if int(setuptools.__version__.split(".")[0]) < 77:
    pytest.skip(f"setuptools {setuptools.__version__} < 77 (pyproject.toml's build requirement)")
  src = tmp_path / "src"
  src.mkdir()
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(os.path.join(REPO, name), src / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("transformer", "configs"):
    shutil.copytree(os.path.join(REPO, name), src / name, ignore=ignore)
  out = tmp_path / "wheel"
  proc = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
       "--no-index", "-q", "-w", str(out)],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  (wheel,) = out.iterdir()
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
  dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
  assert {n.split("/")[0] for n in names} == {"transformer", dist_info}
  for path in ("transformer/__init__.py", "transformer/data/__init__.py",
               "transformer/convert/__init__.py", f"{dist_info}/licenses/LICENSE"):
    assert path in names, path
