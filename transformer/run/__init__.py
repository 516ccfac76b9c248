"""A run's workdir: its lock, checksummed checkpoints, provenance and metric files; and runs read
back side by side (compare, results, the tables shared with the sweep report, learning curves)."""
