"""Which source tree a benchmark times, a git revision's tree to compare it with, and what each
compiled to.

A benchmark run with `--tree=DIR` imports the project from DIR (its `--compare` baseline); without,
from this repository. `export_revision` writes a revision's files (`git archive`) into a directory.
`alternate` runs a benchmark script in both trees, turn about, in fresh processes.
`hlo_ops` counts the instructions of a compiled program by kind; `same_work` compares two such
counts: programs with equal counts of every kind (matmuls, fusions, transposes, copies, ...) do
the same work, so a timing ratio away from 1.00 between them is the machine's noise.
"""

import collections
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

import commands  # benchmarks/ is this module's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_from_argv() -> str:
  """--tree=DIR of the command line (absolute), else this repository."""
  for arg in sys.argv[1:]:
    if arg.startswith("--tree="):
      return os.path.abspath(arg.split("=", 1)[1])
  return REPO


def tree_module(*names: str):
  """The first of the dotted module `names` that the tree of this process (tree_from_argv: an
  older revision's under --compare) has as a file, imported: how a benchmark reads trees from
  before and after the package's sub-package layout."""
  tree = tree_from_argv()
  for name in names:
    if os.path.exists(os.path.join(tree, *name.split(".")) + ".py"):
      return importlib.import_module(name)
  raise SystemExit(f"{tree}: none of {', '.join(names)}")


def export_revision(revision: str, directory: str) -> None:
  """The files of git `revision` of this repository, written into `directory`."""
  archive = subprocess.run(["git", "-C", REPO, "archive", revision], check=True,
                           capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)


def alternate(script: str, arg_lists: list[list[str]], revision: str, rounds: int):
  """Yields (who, args, record) for `rounds` rounds of: every `script *args --json --tree=TREE`
  with TREE `revision`'s files ("before"), then with this repository ("after"), each in a fresh
  process; record is the JSON of its last output line. Alternating makes a busy machine slow
  both sides alike."""
  with tempfile.TemporaryDirectory() as old_tree:
    export_revision(revision, old_tree)
    for _ in range(rounds):
      for who, tree in (("before", old_tree), ("after", REPO)):
        for args in arg_lists:
          proc = commands.run([sys.executable, script, *args, "--json", f"--tree={tree}"])
          if proc.returncode:
            raise SystemExit(f"{os.path.basename(script)} in the {who} tree "
                             f"{commands.failure(proc)}")
          yield who, args, json.loads(proc.stdout.strip().splitlines()[-1])


KEY_OPS = ("dot", "fusion", "transpose", "copy", "reduce", "custom-call", "while")


def hlo_ops(compiled_text: str) -> dict[str, int]:
  """Instruction counts by kind in an optimized HLO module (all its computations)."""
  return dict(collections.Counter(re.findall(r" = [^ ]+ ([a-z][a-z-]*)\(", compiled_text)))


def same_work(before: dict[str, int], after: dict[str, int]) -> str:
  """One line: the kinds whose counts differ (before->after), or that all are the same."""
  kinds = sorted(set(before) | set(after))
  diff = [f"{k} {before.get(k, 0)}->{after.get(k, 0)}" for k in kinds
          if before.get(k, 0) != after.get(k, 0)]
  if diff:
    return "instruction counts differ: " + ", ".join(diff)
  return (f"all {sum(after.values())} instructions of {len(kinds)} kinds the same ("
          + ", ".join(f"{k} {after[k]}" for k in KEY_OPS if k in after) + ")")
