r"""Trains a transformer: `python train.py --config=configs/g2p.py:tiny --workdir=runs/g2p_tiny`.

Any config key can be overridden on the command line, e.g. `--config.model.positional=rope
--config.train.num_steps=2000`. Rerunning the same command in the same workdir resumes from the
latest checkpoint (a finished run is not retrained). The last lines name the workdir and the
commands that evaluate the run, decode with it and show its curves. `--init_from=RUN` fine-tunes:
the model, tokenizers and parameters come from RUN's workdir (a training run, or one written by
`python -m transformer.convert`). A bad config, an incompatible workdir or a diverged run prints
one line and exits 1.

Stopping: SIGTERM (preemption) saves a checkpoint at the current step, prints one line naming it
and the command that resumes, and exits 0. Ctrl-C (SIGINT) does the same, then ends the way an
interrupted program does, killed by SIGINT (status 130 in a shell), so that a calling shell stops
its `&&` chain or loop instead of going on. A second Ctrl-C ends the process at once, without
saving; committed checkpoints stay intact and the run resumes from the latest one.
"""

import os
import shlex
import shutil
import signal
import sys

from absl import flags
from ml_collections import config_flags

from transformer import cli

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/g2p.py:tiny.",
                                 lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
flags.DEFINE_string("init_from", None, "Fine-tune: start from this run's (or converted "
                    "checkpoint's, transformer/convert/) model, tokenizers and parameters.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv  # cli.parse_flags rejects positional arguments
  cli.quiet_logging()
  # Imported here so that --help and flag errors do not pay for importing JAX.
  from transformer.train import loop, runs  # pylint: disable=g-import-not-at-top
  from transformer.run.checkpoints import CheckpointError  # pylint: disable=g-import-not-at-top
  from transformer.config import ConfigError, from_configdict  # pylint: disable=g-import-not-at-top
  from transformer.run.provenance import DataMismatchError  # pylint: disable=g-import-not-at-top
  workdir = flags.FLAGS.workdir
  try:
    with cli.one_line_errors(ConfigError, CheckpointError, DataMismatchError,
                             loop.TrainingDiverged,
                             model_config=lambda: from_configdict(flags.FLAGS.config).model):
      metrics = loop.train_and_evaluate(flags.FLAGS.config, workdir,
                                            init_from=flags.FLAGS.init_from or "")
  except KeyboardInterrupt:  # a second Ctrl-C, or one before training started: out at once
    print(f"interrupted: stopped without saving; resume from the latest checkpoint in {workdir} "
          f"with: {resume_command()}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Not a normal exit: it would wait for a save in flight. Committed checkpoints stay intact.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  stopped = next((k for k in ("interrupted", "preempted") if metrics.get(k)), None)
  if stopped:
    step = metrics.get("step")
    where = os.path.join(workdir, "checkpoints", str(step))
    if len(runs.member_workdirs(flags.FLAGS.config, workdir)) > 1:
      where = f"each member's, in {os.path.join(workdir, '<member>', 'checkpoints', str(step))}"
    print(f"{stopped}: saved a checkpoint at step {step} ({where}); resume with: "
          f"{resume_command()}", file=sys.stderr, flush=True)
    if stopped == "interrupted":
      # An unhandled KeyboardInterrupt makes Python clean up (threads, jax.distributed) and then
      # kill itself with SIGINT; the hook keeps its traceback out (the line above says it all).
      sys.excepthook = lambda *_: None
      raise KeyboardInterrupt
    return
  if metrics.get(loop.FINISHED_BEFORE):
    print(f"{workdir} holds a finished run (step {metrics.get('step')}): nothing to train")
  else:
    summary = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k != "step")
    print(f"done: step={metrics.get('step')} {summary}")
  workdirs = runs.member_workdirs(flags.FLAGS.config, workdir)
  if len(workdirs) > 1:  # train.members: each member's workdir is a run of its own
    print("\n".join(f"member workdir: {w}" for w in workdirs))
  images = from_configdict(flags.FLAGS.config).model.image_size > 0
  print("\n".join(next_steps(workdirs[0], images)), flush=True)


def python_command() -> str:
  """How to call this Python: `python` when that is us, else its full path."""
  python = os.path.basename(sys.executable)
  return python if shutil.which(python) == sys.executable else sys.executable


def resume_command() -> str:
  """The command line of this process, which resumes the run (`python ...` when that is us)."""
  return shlex.join([python_command(), *sys.argv])


def next_steps(workdir: str, images: bool = False) -> list[str]:
  """The lines that end a run: its workdir, and the commands that evaluate it, use it (decode
  text read line by line; an image classifier from Python) and show its curves."""
  python, w = python_command(), shlex.quote(workdir)
  eval_py = shlex.quote(os.path.join(os.path.dirname(sys.argv[0]), "eval.py"))
  evaluated = "the confusion matrix" if images else "predictions"
  use = (f"  in Python: transformer.restore({workdir!r}).classify(pixels)   # [n, H, W, C] in "
         "[0, 1]" if images else
         f"  {python} -m transformer.infer.predict --workdir={w}   # then one input per line")
  return [f"workdir: {workdir} (checkpoints, metrics.jsonl, TensorBoard events)",
          "next:",
          f"  {python} {eval_py} --workdir={w} --split=test   # metrics.test.json, {evaluated}",
          use, f"  tensorboard --logdir={w}"]


if __name__ == "__main__":
  cli.run(main)
