"""benchmarks/README.md lists every benchmark script, and each record it names exists."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPO, "benchmarks")


def _readme() -> str:
  with open(os.path.join(BENCHMARKS, "README.md"), encoding="utf-8") as f:
    return f.read()


def test_every_benchmark_script_has_a_row():
  listed = set(re.findall(r"^\| `([\w.]+)` \|", _readme(), re.M))
  scripts = {f for f in os.listdir(BENCHMARKS) if f.endswith((".py", ".sh"))
             and f not in ("commands.py", "trees.py")}  # the shared helpers, told apart
  assert scripts - listed == set(), "benchmarks/README.md lists no row for these"
  assert listed - scripts == set(), "benchmarks/README.md lists scripts that do not exist"


def test_every_named_record_exists():
  records = set(os.listdir(os.path.join(REPO, "docs", "results")))
  for cell in re.findall(r"^\|[^|]+\|[^|]+\| ([^|]+) \|", _readme(), re.M):
    for name in re.findall(r"`([\w*]+)`", cell):
      pattern = re.compile(name.replace("*", r"\w+") + "$")
      assert any(pattern.match(r) for r in records), f"no docs/results/{name}/"
