"""The training example stream of one host, and how it is re-split when the host count changes.
Epoch e has one global order, `perm_e`, a seeded permutation of the split's n examples; host h of
H reads `perm_e[h::H]`. A host's stream is its epochs back to back; a position indexes into it.
After a change in host count (elastic resume) the new hosts start at the oldest epoch some old host
had not finished (`base_epoch`); for it and later epochs an old host had started, `skip` marks the
examples already consumed, and the rest of `perm_e` is split over the new hosts. So within every
epoch each example is consumed exactly once, whatever the host counts were.
"""

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

_CACHED_EPOCHS = 3  # per-epoch orders kept; a batch never spans more than two epochs


class Stream:
  """Host `host` of `hosts`: positions -> (epoch, example index), per-epoch orders cached."""

  def __init__(self, num_examples: int, seed: int, host: int = 0, hosts: int = 1,
               base_epoch: int = 0, skip: dict[int, np.ndarray] | None = None):
    if num_examples < hosts:
      raise ValueError(f"the training split has {num_examples} examples, fewer than the {hosts} "
                       "hosts that share it")
    self.n, self.seed, self.host, self.hosts = num_examples, seed, host, hosts
    self.base_epoch = base_epoch
    self.skip = dict(skip or {})  # epoch -> bool [n]: consumed before the host count changed
    self.last_planned = max(self.skip, default=base_epoch - 1)  # epochs after it are plain
    planned = range(base_epoch, self.last_planned + 1)
    # The stream positions where the planned epochs start, then where the last one ends.
    self._bounds = np.cumsum([0] + [self.epoch_length(e) for e in planned], dtype=np.int64)
    self._orders: dict[int, np.ndarray] = {}

  def epoch_length(self, epoch: int) -> int:
    """How many examples this host reads in `epoch`."""
    skipped = int(self.skip[epoch].sum()) if epoch in self.skip else 0
    return len(range(self.host, self.n - skipped, self.hosts))

  def order(self, epoch: int) -> np.ndarray:
    """This host's examples of `epoch`, in reading order."""
    if epoch not in self._orders:
      if len(self._orders) >= _CACHED_EPOCHS:
        self._orders.pop(min(self._orders))
      perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
      if epoch in self.skip:
        perm = perm[~self.skip[epoch][perm]]
      self._orders[epoch] = perm[self.host::self.hosts]
    return self._orders[epoch]

  def epoch_start(self, epoch: int) -> int:
    """The stream position of `epoch`'s first example (epoch >= base_epoch)."""
    if epoch - self.base_epoch < len(self._bounds):
      return int(self._bounds[epoch - self.base_epoch])
    plain = epoch - self.last_planned - 1
    return int(self._bounds[-1]) + plain * self.epoch_length(self.last_planned + 1)

  def locate(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
    """(epoch, offset within this host's epoch) of every stream position."""
    p = np.asarray(positions, np.int64)
    later = p - self._bounds[-1]
    length = self.epoch_length(self.last_planned + 1)
    epochs, offsets = self.last_planned + 1 + later // length, later % length
    inside = later < 0
    if inside.any():  # side='right' skips epochs this host has no examples of (length 0)
      k = np.searchsorted(self._bounds, p[inside], side="right") - 1
      epochs[inside], offsets[inside] = self.base_epoch + k, p[inside] - self._bounds[k]
    return epochs, offsets

  def ids(self, positions: Any) -> np.ndarray:
    """The example index at every stream position."""
    epochs, offsets = self.locate(positions)
    out = np.empty(len(epochs), np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      out[sel] = self.order(int(e))[offsets[sel]]
    return out

  def plan_state(self) -> dict[str, Any]:
    """The epoch plan as JSON-able values ({} for a stream that never changed host count)."""
    if not self.base_epoch and not self.skip:
      return {}
    return {"base_epoch": self.base_epoch,
            "skip": {str(e): base64.b64encode(np.packbits(m).tobytes()).decode("ascii")
                     for e, m in sorted(self.skip.items())}}

  @staticmethod
  def plan_from_state(state: dict[str, Any], num_examples: int
                      ) -> tuple[int, dict[int, np.ndarray]]:
    """(base_epoch, skip) from `plan_state()`'s values (missing: a plain stream)."""
    skip = {}
    for e, text in state.get("skip", {}).items():
      bits = np.frombuffer(base64.b64decode(text), np.uint8)
      skip[int(e)] = np.unpackbits(bits, count=num_examples).astype(bool)
    return int(state.get("base_epoch", 0)), skip


def remaining_plan(streams: Sequence[Stream], ends: Sequence[int],
                   pending: Sequence[np.ndarray]) -> tuple[int, dict[int, np.ndarray]]:
  """The plan (base_epoch, skip) for new hosts taking over from the hosts of `streams`: old host h
  consumed its positions before `ends[h]` except `pending[h]` (read, not yet in a batch)."""
  first = streams[0]
  if any((s.n, s.seed, s.hosts, s.base_epoch) != (first.n, first.seed, len(streams),
                                                  first.base_epoch)
         or s.skip.keys() != first.skip.keys()
         or any((s.skip[e] != first.skip[e]).any() for e in s.skip) for s in streams):
    raise ValueError("the saved iterator states are not those of one run's hosts")
  oldest = [int(s.locate([min([end, *p.tolist()])])[0][0]) for s, end, p in
            zip(streams, ends, pending)]
  base = min(oldest)
  latest = max([first.last_planned] + [int(s.locate([end - 1])[0][0])
                                      for s, end in zip(streams, ends) if end > 0])
  counts = np.zeros((max(latest - base + 1, 1), first.n), np.int64)
  for e in range(base, latest + 1):
    if e in first.skip:
      counts[e - base] += first.skip[e]
  for s, end, p in zip(streams, ends, pending):
    positions = np.setdiff1d(np.arange(s.epoch_start(base), end), p)
    epochs = s.locate(positions)[0]
    np.add.at(counts, (epochs - base, s.ids(positions)), 1)
  if (counts > 1).any():
    raise ValueError("the saved iterator states consumed an example twice in one epoch")
  return base, {base + k: c.astype(bool) for k, c in enumerate(counts) if c.any()}
