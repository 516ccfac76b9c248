"""benchmarks/trees.alternate: the --compare loop of train_step.py, decode.py and input_pipeline.py.
It must run the script in the revision's exported tree and in this repository, turn about, with
every argument list, and hand back each run's last JSON line."""

import pytest

from bench_loader import REPO, load_benchmark

trees = load_benchmark("trees")


def test_alternate_runs_both_trees_in_turn_with_every_argument_list(tmp_path):
  """Rounds of (before: every arg list, after: every arg list); 'before' runs in an export of
  HEAD (a directory holding its tracked files, not this repository), 'after' here."""
  script = tmp_path / "probe.py"
  script.write_text(
      "import json, os, sys\n"
      "tree = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--tree='))\n"
      "print('noise')\n"
      "print(json.dumps({'tree': tree, 'args': sys.argv[1:],\n"
      "                  'has_readme': os.path.exists(os.path.join(tree, 'README.md'))}))\n")
  runs = list(trees.alternate(str(script), [["--x=1"], ["--x=2"]], "HEAD", rounds=2))
  assert [(who, args) for who, args, _ in runs] == [
      ("before", ["--x=1"]), ("before", ["--x=2"]), ("after", ["--x=1"]), ("after", ["--x=2"])] * 2
  befores = {r["tree"] for who, _, r in runs if who == "before"}
  assert len(befores) == 1 and befores != {REPO}
  assert all(r["tree"] == REPO for who, _, r in runs if who == "after")
  assert all(r["has_readme"] and r["args"][-2] == "--json" for _, _, r in runs)
  assert [r["args"][0] for _, _, r in runs] == ["--x=1", "--x=2"] * 4


def test_a_failing_run_is_one_line_naming_the_script_and_tree(tmp_path):
  """A run that exits non-zero stops the loop with the script, the tree and its last line."""
  script = tmp_path / "broken.py"
  script.write_text("import sys\nprint('working')\nsys.exit('broken: no such size')\n")
  with pytest.raises(SystemExit, match=r"^broken\.py in the before tree exited 1: broken: no such size$"):
    list(trees.alternate(str(script), [[]], "HEAD", rounds=1))
