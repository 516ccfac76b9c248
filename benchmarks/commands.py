"""Running a command for a benchmark script: its output captured, its failure told in one line.

g2p_flagship.py (train.py and eval.py), g2p_phonetisaurus.py (the Phonetisaurus binaries),
reproduce.py (train.py) and trees.alternate (the --compare runs) run their commands through `run`;
`failure` is the line they report when one exits non-zero: the exit status and the last line the
command printed (stderr first). `git_commit` and `versions` are what a record says of the tree and
the environment that measured it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess


def run(cmd: list[str], cwd: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  """`cmd` run to its end with stdout and stderr captured as text; never raises on its status."""
  return subprocess.run(cmd, cwd=cwd, env=env, check=False, capture_output=True, text=True)


def failure(proc: subprocess.CompletedProcess) -> str:
  """'exited N: <the last line of stderr, else of stdout>' for a finished command."""
  tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
  return f"exited {proc.returncode}: {tail[0]}"


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit(repo: str = REPO) -> str | None:
  """The checkout's HEAD commit; outside a git checkout $COMMIT (the device session sets it: its
  copy of the tree has no .git), else None."""
  try:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    out = ""
  return out or os.environ.get("COMMIT") or None


def versions(*packages: str) -> dict[str, str | None]:
  """{package: its installed version, or None}."""
  out: dict[str, str | None] = {}
  for name in packages:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out
