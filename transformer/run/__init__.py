"""A run's workdir: its lock, checksummed checkpoints, provenance and metric files."""
