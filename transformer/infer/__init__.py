"""Inference: decoding, whole-split evaluation, the notebook API (restore, Run), predict,
attention and positional plots."""
