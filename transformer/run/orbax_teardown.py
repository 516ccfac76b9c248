"""A failed orbax save's event loop closed only after its writes end: a fix of orbax-checkpoint's
private teardown (finish_writes_first), run only on the versions it was checked on."""

import asyncio
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint._src import asyncio_utils as orbax_asyncio  # private: see finish_writes_first


# Seconds a failed save's loop waits for its other writes before orbax closes it anyway.
_WRITES_IN_FLIGHT_SECONDS = 60.0


async def _with_writes_finished(coro: Any) -> Any:
  """Awaits `coro`, then (even when it raised) the other tasks of its event loop; their errors
  are the failed save's, which `coro` raises, so they are read here and dropped."""
  try:
    return await coro
  finally:
    # all_tasks retries while another thread's loop changes asyncio's task set.
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
      done, _ = await asyncio.wait(others, timeout=_WRITES_IN_FLIGHT_SECONDS)
      for task in done:
        if not task.cancelled():
          task.exception()  # read: asyncio logs no 'Task exception was never retrieved'


ORBAX_CHECKED = "0.12."  # the orbax-checkpoint versions finish_writes_first was checked on


def finish_writes_first() -> None:
  """Lets orbax close a background save's event loop only after the save's writes have ended.

  orbax-checkpoint 0.12.8 runs each background save's coroutine in a fresh event loop
  (asyncio_utils._run_sync_via_new_loop: run_until_complete, then loop.close()). A save writes
  its arrays by `asyncio.gather` over one tensorstore write per fragment
  (serialization.async_serialize_from_host); when one write fails (a full disk, a file size
  limit) gather raises at once and the loop is closed while the other writes are in flight.
  Each of those, ending later, calls loop.call_soon_threadsafe from a tensorstore thread on the
  closed loop, and prints a 'RuntimeError: Event loop is closed' traceback after the save's one
  error. This wraps the coroutine so that the loop first waits for its other tasks; a successful
  save has none left, so it changes nothing there. A restore that fails on a damaged array file
  (tensorstore reads gathered the same way) ends the same way, so readers install it too.
  Idempotent. It wraps a private function, so it runs only on the orbax versions it was checked
  on (ORBAX_CHECKED, the range pyproject.toml pins) and raises on any other: a newer orbax may
  have fixed the teardown upstream (then delete this) or renamed what it wraps."""
  version = getattr(ocp, "__version__", "?")
  run = getattr(orbax_asyncio, "_run_sync_via_new_loop", None)
  if not version.startswith(ORBAX_CHECKED) or run is None:
    raise RuntimeError(
        f"orbax-checkpoint {version}: transformer/run/orbax_teardown.py wraps "
        f"asyncio_utils._run_sync_via_new_loop, checked on {ORBAX_CHECKED}x only; check whether a "
        "failed save still closes its event loop with writes in flight, then update it")
  if getattr(run, "finishes_writes_first", False):
    return

  def run_sync_via_new_loop(coro: Any) -> Any:
    return run(_with_writes_finished(coro))

  run_sync_via_new_loop.finishes_writes_first = True
  orbax_asyncio._run_sync_via_new_loop = run_sync_via_new_loop  # pylint: disable=protected-access
