"""The schema of a result's record (docs/results/**/record.json): each key and the types its value
may have (None: JSON null). tests/docs/test_records.py checks every record against it; the tests of
the benchmarks that write records check what they write."""

REQUIRED = {
    "name": (str,), "title": (str,), "task": (str,), "config": (str, type(None)),
    "overrides": (list,), "command": (str,), "commit": (str, type(None)), "hardware": (str,),
    "versions": (dict, type(None)), "wall_clock_s": (int, float, type(None)), "rates": (dict,),
    "metrics": (dict,), "seeds": (list,), "report": (str,),
}
# goals: {goal: {"bound": ..., "test": str, <approach>: {"met": bool, ...}}}; refused: {<approach>:
# {"reason": str, ...}} (a fit that could not be made, recorded instead of dropped)
OPTIONAL = {"spread": (dict,), "goals": (dict,), "refused": (dict,)}
