"""The data layer: TFDS builders read through Grain, tokenizers, and the pipelines.

  from transformer.data import load_task
  task = load_task(cfg, workdir)       # prepares cmudict_g2p offline on first use
  batch = next(task.train_iterator())  # packed numpy batch (see pipeline.py for the features)
"""

from transformer.data.task import load_task, Task
from transformer.data.tokenizers import Tokenizer

__all__ = ["Task", "load_task", "Tokenizer"]
