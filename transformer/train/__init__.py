"""Training: optimizers and schedules, the train state and steps, the loop and its runs, checkpoint
writing, preemption, parallelism, fine-tuning's start, vmapped members."""
