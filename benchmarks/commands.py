"""What every benchmark script shares: running a command, and what its record says and where.

g2p_flagship.py (train.py and eval.py), g2p_phonetisaurus.py (the Phonetisaurus binaries),
reproduce.py (train.py) and trees.alternate (the --compare runs) run their commands through `run`;
`failure` is the line they report when one exits non-zero: the exit status and the last line the
command printed (stderr first). `git_commit`, `versions`, `cpu_hardware` and `command_line` are
what a record says of the tree, the environment and the machine that measured it and the command
that did; `write_record` writes it (and the run's log) into docs/results/<name>/.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
from typing import Any, Sequence


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


def cpu_hardware(note: str = "") -> str:
  """A record's hardware on a CPU: '<cores>-core <machine> CPU' (e.g. '2-core x86_64 CPU')."""
  return f"{os.cpu_count()}-core {platform.machine()} CPU" + (f" ({note})" if note else "")


def command_line(script: str, argv: Sequence[str]) -> str:
  """The record's command: `python benchmarks/<script> ARGV...`, quoted for a shell."""
  return shlex.join(["python", f"benchmarks/{script}", *argv])


def write_record(directory: str, record: dict[str, Any], log: str | None = None) -> str:
  """Writes `record` as <directory>/record.json (and `log` as log.txt); returns the record's
  path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "record.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
  if log is not None:
    with open(os.path.join(directory, "log.txt"), "w", encoding="utf-8") as f:
      f.write(log)
  return path


def check_study_args(parser: Any, extra: Sequence[str], text_file: str, out: str) -> None:
  """A training study's arguments: only --config.* flags pass on to train.py, `text_file` exists
  and `out` is fresh; otherwise the parser's one-line error."""
  bad = [e for e in extra if not e.startswith("--config.")]
  if bad:
    parser.error(f"unknown arguments {bad} (only --config.* flags pass on to train.py)")
  if not os.path.isfile(text_file):
    parser.error(f"--text_file={text_file}: no such file")
  if os.path.exists(out) and os.listdir(out):
    parser.error(f"--out={out} is not empty; use a fresh directory")
