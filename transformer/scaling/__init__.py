"""Scaling laws from sweeps: parameter and FLOP counts (counting), IsoFLOP sweep plans from a
base config (isoflop), the runs a fit reads (observations), Approach 2 and Approach 3 fits
(approach2, approach3) side by side with bootstrap intervals and predictions (fits, summary),
their plots (plots) and `python -m transformer.scaling fit RUNS...` (command)."""
