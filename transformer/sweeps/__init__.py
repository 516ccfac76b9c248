"""Sweeps: sweep files (spec), the resumable runner, the report (tables and plots)."""
