"""Which source tree a benchmark times, and a git revision's tree to compare it with.

A benchmark run with `--tree=DIR` imports the project from DIR (its `--compare` baseline); without,
from this repository. `export_revision` writes a revision's files (`git archive`) into a directory.
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_from_argv() -> str:
  """--tree=DIR of the command line (absolute), else this repository."""
  for arg in sys.argv[1:]:
    if arg.startswith("--tree="):
      return os.path.abspath(arg.split("=", 1)[1])
  return REPO


def export_revision(revision: str, directory: str) -> None:
  """The files of git `revision` of this repository, written into `directory`."""
  archive = subprocess.run(["git", "-C", REPO, "archive", revision], check=True,
                           capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
