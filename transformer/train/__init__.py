"""Training: optimizers, steps, the loop and its runs, preemption, parallelism, fine-tuning."""
