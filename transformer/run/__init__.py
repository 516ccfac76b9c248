"""What a run keeps in its workdir, for training to write and inference to read: the
writer's lock, checksummed checkpoints read back, provenance and metric files."""
