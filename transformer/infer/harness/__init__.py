"""The lm-evaluation-harness on our runs (the `eval` extra: lm-eval is imported in this package
only): `RunLM` (lm.py) answers the harness's requests; tasks.py runs tasks for eval.py and
training. See docs/evaluation.md."""
