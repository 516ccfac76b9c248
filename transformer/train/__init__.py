"""Training: optimizers and schedules, the train state and steps, the loop, checkpoint
writing, preemption, parallelism, fine-tuning's start, vmapped members."""
