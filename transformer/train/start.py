"""What a training program starts from (loop.py): the config relations the loop needs, the task,
the runs, model, optimizer, mesh and the state's shardings, and the state to start from (the
newest checkpoints that verify, a fresh state, or a fine-tuned run's parameters)."""

import dataclasses
import functools
import importlib.util
import os
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import files
from transformer.config import Config, ConfigError
from transformer.model import scoring
from transformer.model.models import build_model
from transformer.run import provenance, wandb_logging
from transformer.train import finetune, optim, parallel, prefetch, steps
from transformer.train.runs import RunGroup, runs_of


def check_loop_config(cfg: Config) -> None:
  """Relations the loop needs that transformer.config cannot check alone; raises ConfigError."""
  tc = cfg.train
  if cfg.data.batch_size % tc.grad_accum_steps:
    raise ConfigError(f"data.batch_size={cfg.data.batch_size} must be divisible by "
                      f"train.grad_accum_steps={tc.grad_accum_steps}")
  if tc.steps_per_dispatch > 1 and cfg.parallel.mode != "mesh":
    raise ConfigError(f"train.steps_per_dispatch={tc.steps_per_dispatch} needs parallel.mode=mesh "
                      f"(got {cfg.parallel.mode!r})")
  if cfg.model.arch == "encoder_only" and cfg.model.head == "mlm" and cfg.data.objective != "mlm":
    raise ConfigError(f"model.head='mlm' trains on masked inputs: set data.objective='mlm' (got "
                      f"{cfg.data.objective!r})")
  # Before any data loads or the workdir is touched, not at the first log.
  wandb_logging.check_wandb(tc.wandb_project, tc.wandb_mode)
  if cfg.eval.harness_tasks and importlib.util.find_spec("lm_eval") is None:
    raise ConfigError(f"eval.harness_tasks={cfg.eval.harness_tasks!r} needs lm-eval: "
                      "pip install -e '.[eval]'")
  for key, value in (("train.early_stop_metric", tc.early_stop_metric),
                     ("checkpoint.keep_best_by", cfg.checkpoint.keep_best_by)):
    if value and not value.startswith("eval/"):
      raise ConfigError(f"{key}={value!r} must name an evaluation metric such as 'eval/loss'")
    if value:
      scoring.check_in_training_metric(cfg, key, value)


def schedule_warning(cfg: Config) -> str:
  """One line when a decaying schedule's warmup lasts the whole run, else ''."""
  tc = cfg.train
  if tc.schedule != "constant" and 0 < tc.num_steps <= tc.warmup_steps:
    return (f"train.num_steps={tc.num_steps} <= train.warmup_steps={tc.warmup_steps}: the run ends "
            f"inside the warmup, so train.schedule={tc.schedule!r} never decays the learning rate")
  return ""


def fill_vocab_sizes(cfg: Config, task: Any) -> Config:
  """Sets model.vocab_size/source_vocab_size written 0 from the task's tokenizers."""
  m = cfg.model
  vocab = task.target_tokenizer.vocab_size
  source = task.source_tokenizer.vocab_size if task.source_tokenizer is not None else vocab
  classes = vocab if m.arch == "encoder_only" and m.head != "mlm" else 0
  extra = getattr(task, "extra_ids", None)
  if extra is not None:  # [MASK] and sentinels after the text's ids, on both sides
    vocab = source = extra.total_vocab_size
  elif m.arch == "encoder_only":  # the encoder reads source ids; the head predicts classes
    vocab = source
  if m.arch == "decoder_only":  # seq2seq as a prefix-LM: source ids share the one table
    vocab = max(vocab, source)
  vocab = m.vocab_size or vocab
  return dataclasses.replace(cfg, model=dataclasses.replace(
      m, vocab_size=vocab, source_vocab_size=m.source_vocab_size or source,
      num_classes=m.num_classes or classes))


def load_task(cfg: Config, workdir: str, init_from: str) -> Any:
  """transformer.data's task for `cfg` (fine-tuning: the run's tokenizers and converted_from.json
  copied first); a data problem is one ConfigError line."""
  from transformer.data import load_task  # pylint: disable=g-import-not-at-top  (TFDS)
  from transformer.data.task import copy_tokenizers  # pylint: disable=g-import-not-at-top  (TFDS)
  try:
    if init_from and not files.exists(os.path.join(workdir, "tokenizers")):
      copy_tokenizers(init_from, workdir, only_source=cfg.model.arch == "encoder_only",
                      also_target=cfg.data.objective != "none")
    if init_from:
      provenance.carry_converted_from(init_from, workdir)
    return load_task(cfg, workdir)
  except (ValueError, OSError) as e:  # a missing file, an unprepared dataset, a bad size
    line = str(e).strip().splitlines()[0]
    raise ConfigError(line if line.startswith("data.") else f"data: {line}") from e


def sized_config(cfg: Config, task: Any, init_from: str) -> Config:
  """`cfg` with the vocabulary sizes of `task`'s tokenizers; a fine-tuned model's table must hold
  the tokenizer's ids (an image model has no input tokenizer)."""
  cfg = fill_vocab_sizes(cfg, task)
  input_tok = task.source_tokenizer if cfg.model.arch == "encoder_only" else task.target_tokenizer
  if init_from and input_tok is not None and input_tok.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"--init_from={init_from}: its model.vocab_size={cfg.model.vocab_size} is "
                      f"smaller than the tokenizer's {input_tok.vocab_size}")
  return cfg


@dataclasses.dataclass
class Setup:
  """What set-up gives the rest of the loop: one program training `group`'s runs."""
  cfg: Config
  workdir: str
  task: Any
  main: bool  # this process writes the runs' files
  started: float  # time.time() when train_and_evaluate was called
  group: RunGroup  # each run with its checkpointer (reporters come with _reporters)
  model: nn.Module
  tx: optax.GradientTransformation
  init: Callable[..., steps.TrainState]  # (rng, unbox=True) -> a fresh state of one run
  mesh: jax.sharding.Mesh  # the state's, in both modes (pmap: every device on the data axis)
  shardings: Any  # the group's train state's
  abstract: Any  # one run's state as jax.ShapeDtypeStructs on its shardings: restore's target
  train_iter: Any  # the training batches (a prefetch.Prefetch with data.prefetch)


def setup(cfg: Config, workdir: str, task: Any, main: bool, started: float) -> Setup:
  """The runs, model and optimizer, the mesh, the state's shardings and shapes (checked against
  the memory here), each run's checkpointer and the training batches."""
  group = RunGroup(runs_of(cfg, workdir))
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model)
  example = {k: np.asarray(v)[:1] for k, v in next(iter(task.train_iterator())).items()
             if v is not None}
  init = functools.partial(steps.create_train_state, cfg, model, example_batch=example, tx=tx)
  mesh = parallel.make_mesh(cfg.parallel)
  shardings, abstract = _abstract_state(init, jax.random.key(cfg.seed), mesh, cfg.parallel.mode)
  parallel.check_fits(abstract, cfg.model)
  group.open_checkpoints(cfg.checkpoint)
  train_iter = task.train_iterator()
  if cfg.data.prefetch:  # batches made ahead on a thread; checkpoints hold the loop's position
    train_iter = prefetch.Prefetch(train_iter, cfg.data.prefetch)
  return Setup(cfg, workdir, task, main, started, group, model, tx, init, mesh,
                group.shardings(shardings), abstract, train_iter)


def _abstract_state(init: Callable[..., steps.TrainState], rng: jax.Array,
                    mesh: jax.sharding.Mesh, mode: str) -> tuple[Any, Any]:
  """(shardings, abstract state) of one run's train state, traced without allocating it: on
  `mesh`, sharded by its logical axes (pmap mode: replicated)."""
  # The init traced once: boxed for the shardings, unboxed for the shapes.
  boxed = jax.eval_shape(lambda r: init(r, unbox=False), rng)
  shapes = nn.meta.unbox(boxed)
  shardings = parallel.state_shardings(boxed, mesh, replicated=mode == "pmap")
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          shapes, shardings)
  return shardings, abstract


def initial_state(s: Setup, init_from: str) -> steps.TrainState:
  """The newest checkpoints that verify (with the data position), else a fresh state: each
  member's from its own seed, a plain run's from cfg.seed (fine-tuning: the run's parameters)."""
  state = s.group.restore(s.abstract, s.shardings, s.train_iter)
  if state is not None:
    return state
  state = s.group.fresh_state(s.init, s.shardings)  # a member's is its separate run's
  return _fine_tune_start(s, state, init_from) if init_from else state


def _fine_tune_start(s: Setup, state: steps.TrainState, init_from: str) -> steps.TrainState:
  """`state` with the parameters of the run in `init_from` (finetune.init_params)."""
  logging.info("Fine-tuning: parameters from %s.", init_from)
  fresh = jax.device_get(state.params) if s.cfg.model.arch == "encoder_only" else None
  params = finetune.init_params(init_from, fresh, s.cfg.model.head)
  state = state.replace(params=jax.device_put(params, s.shardings.params))
  if state.ema_params is not None:  # the average starts where training starts; copies:
    # float32 params cast to float32 are the same buffers, which the donating step rejects
    state = state.replace(ema_params=jax.device_put(jax.tree.map(
        lambda p: jnp.array(p, jnp.float32, copy=True), state.params), s.shardings.ema_params))
  return state
