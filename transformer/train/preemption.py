"""Preemption and Ctrl-C: a signal becomes a stop the training loop polls at every step, saving
a checkpoint at the step where `should_stop(step)` first returns True."""

import contextlib
import os
import signal

from absl import logging
import jax


class PreemptionHandler:
  """Turns SIGTERM (preemption) and SIGINT (Ctrl-C) into a stop `should_stop(step)` reports; a
  second SIGINT raises KeyboardInterrupt. Many processes agree on the step through jax's
  preemption service (SIGINT sends this process SIGTERM); without it nothing is installed, since
  one host saving while the others train would deadlock."""

  def __init__(self):
    self.requested = False  # stop at this step (on every host)
    self.signum = None  # the first signal received here
    self._previous = {}
    self._sync = jax.distributed.is_initialized() and bool(jax.config.jax_enable_preemption_service)
    if jax.process_count() > 1 and not self._sync:
      return
    for sig in (signal.SIGINT,) if self._sync else (signal.SIGTERM, signal.SIGINT):
      with contextlib.suppress(ValueError):  # not the main thread (some notebook kernels)
        self._previous[sig] = signal.signal(sig, self._handle)

  @property
  def reason(self) -> str:
    """'interrupted' (SIGINT here), 'preempted' (SIGTERM, or a stop agreed with other hosts)."""
    return "interrupted" if self.signum == signal.SIGINT else "preempted"

  def _handle(self, signum, _frame):
    if signum == signal.SIGINT and self.signum is not None:
      raise KeyboardInterrupt  # the second signal: out at once, without saving
    if self.signum is None:
      self.signum = signum
    if signum != signal.SIGINT:
      self.requested = True
      return
    logging.warning("Ctrl-C: saving a checkpoint at the end of this step, then stopping "
                    "(Ctrl-C again stops at once, without saving).")
    if self._sync:  # jax's SIGTERM listener tells every host; should_stop learns the step
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self.requested = True

  def should_stop(self, step: int) -> bool:
    """True once a stop was requested (all hosts agree on the step when multi-host)."""
    if self._sync and not self.requested:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      with contextlib.suppress(RuntimeError):  # the preemption service is off after all
        self.requested = bool(multihost_utils.reached_preemption_sync_point(step))
    return self.requested

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}


install_preemption_handler = PreemptionHandler  # the loop checks `.should_stop(step)` every step
