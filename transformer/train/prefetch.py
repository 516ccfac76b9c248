"""Batches made ahead of the training loop on a thread (data.prefetch), checkpointed as if not:
each queued batch carries the inner iterator's state after it, so `get_state()` is the state after
the last batch the loop took. A thread's error is raised by the `next()` that meets it.
"""

import contextlib
import queue
import threading
from typing import Any, Sequence

import grain

_END = object()  # put by the thread after an error, which it stores in `_error`


class Prefetch(grain.DatasetIterator):
  """An iterator over `inner`'s batches, made `depth` batches ahead on a daemon thread."""

  def __init__(self, inner: Any, depth: int):
    super().__init__()
    if depth < 1:
      raise ValueError(f"prefetch depth must be >= 1, got {depth}")
    self._inner, self._depth = inner, depth
    self._state = inner.get_state()
    self._thread: threading.Thread | None = None
    self._start()

  def _start(self) -> None:
    self._queue: queue.Queue = queue.Queue(self._depth)
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._produce, name="batch-prefetch", daemon=True)
    self._thread.start()

  def _produce(self) -> None:
    stop, q = self._stop, self._queue
    try:
      while not stop.is_set():
        item = (next(self._inner), self._inner.get_state())
        while not stop.is_set():
          with contextlib.suppress(queue.Full):
            q.put(item, timeout=0.1)
            break
    except BaseException as e:  # pylint: disable=broad-except  (re-raised by __next__)
      self._error = e
      q.put(_END)

  def __next__(self) -> dict[str, Any]:
    item = self._queue.get()
    if item is _END:
      raise self._error
    batch, self._state = item
    return batch

  def close(self) -> None:
    """Stops the thread (the batches it made ahead are dropped; the state stays)."""
    if self._thread is None:
      return
    self._stop.set()
    while self._thread.is_alive():
      with contextlib.suppress(queue.Empty):  # unblock a put waiting on a full queue
        self._queue.get_nowait()
      self._thread.join(timeout=0.05)
    self._thread = None

  def get_state(self) -> dict[str, Any]:
    return self._state

  def set_state(self, state: dict[str, Any]) -> None:
    self.close()
    self._inner.set_state(state)
    self._state = self._inner.get_state()
    self._start()

  def set_state_from_hosts(self, states: Sequence[dict[str, Any]]) -> None:
    self.close()
    self._inner.set_state_from_hosts(states)
    self._state = self._inner.get_state()
    self._start()

  def __getattr__(self, name: str) -> Any:  # the inner iterator's hooks (stats, ...)
    if name.startswith("_"):
      raise AttributeError(name)
    return getattr(self._inner, name)
