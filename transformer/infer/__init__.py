"""Inference: decoding, evaluation, the notebook API (restore, Run), predict, plots, compare."""
