"""Grain pipelines: tokenized `Examples` -> this host's stream (stream.py) -> fixed-shape batches.

A batch is one vectorized scatter (`assemble`); the iterator state (BatchIterator) resumes exactly,
also on another host count. Modes (rows: this host's rows per batch):
  pack    first-fit of consecutive examples into the rows; one that fits no row is set aside for
          the next batch (at most rows // 4 per batch); segment ids 1, 2, ... per row.
  bucket  BUCKET_WINDOW batches' worth of examples sorted by length bucket, one per row, padded to
          the bucket's length; batch order shuffled.
  pad     one example per row, padded to the maximum lengths.
Features: `inputs`, `targets`, `*_segment_ids`, `*_positions`, `weights` (float32) and, for
decoder-only seq2seq, `prefix_mask` (1 on the prompt, which has weight 0). A `transform`
(denoise.py) maps the examples a batch takes to its features given their (index, epoch).
"""

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from transformer.config import check_value
from transformer.data.stream import remaining_plan, Stream
from transformer.data.tokenizers import EOS_ID

PACK_SKIP_DIVISOR = 4  # packing sets aside at most rows // 4 examples per batch for the next one
BUCKET_WINDOW = 16  # batches of examples sorted together by bucketing
BUCKET_FRACTIONS = (0.25, 0.5, 1.0)  # bucket lengths as fractions of the maximum length
EVAL_EPOCH = 2**31 - 1  # the epoch a transform is told for evaluation batches (one fixed draw)


@dataclasses.dataclass
class Examples:
  """Tokenized examples as flat arrays: per feature, tokens of all examples back to back."""
  tokens: dict[str, np.ndarray]  # feature -> int32 [total]
  starts: dict[str, np.ndarray]  # feature -> int64 [n] offset of each example in `tokens`
  lengths: dict[str, np.ndarray]  # feature -> int64 [n]
  prefix_len: np.ndarray | None = None  # decoder_only seq2seq: prompt (source + EOS) length [n]

  @classmethod
  def from_lists(cls, features: dict[str, Sequence[Sequence[int]]],
                 prefix_len: Sequence[int] | None = None) -> "Examples":
    """Builds the flat arrays from per-example id lists."""
    tokens, starts, lengths = {}, {}, {}
    for name, seqs in features.items():
      lengths[name] = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
      starts[name] = np.cumsum(lengths[name]) - lengths[name]
      tokens[name] = np.fromiter((t for s in seqs for t in s), np.int32, int(lengths[name].sum()))
    return cls(tokens, starts, lengths,
               None if prefix_len is None else np.asarray(prefix_len, np.int64))

  def __len__(self) -> int:
    return len(next(iter(self.lengths.values())))

  def select(self, keep: np.ndarray) -> "Examples":
    """The examples `keep` (indices), in that order."""
    return Examples(self.tokens, {k: v[keep] for k, v in self.starts.items()},
                    {k: v[keep] for k, v in self.lengths.items()},
                    None if self.prefix_len is None else self.prefix_len[keep])

  def shard(self, index: int, count: int) -> "Examples":
    """Examples index, index + count, ... (this host's share)."""
    return self.select(np.arange(index, len(self), count))


def fit(ids: list[int], room: int, too_long: str) -> list[int] | None:
  """`ids` if at most `room` long; else truncated to `room` (too_long 'truncate') or None."""
  if len(ids) <= room:
    return ids
  return ids[:room] if too_long == "truncate" else None


def fit_length(ids: list[int], max_len: int, too_long: str) -> list[int] | None:
  """ids + [EOS] if it fits in max_len; else truncated (keeping EOS last) or None (dropped)."""
  ids = fit(ids, max_len - 1, too_long)
  return None if ids is None else ids + [EOS_ID]


def encode_pairs(pairs: Sequence[tuple[str, str]], source_tok, target_tok, max_source_len: int,
                 max_target_len: int, too_long: str, decoder_only: bool
                 ) -> tuple[Examples, dict[str, int]]:
  """Tokenizes (source, target) pairs -> (Examples, counts of kept/dropped/truncated pairs):
  `inputs` = source + EOS, `targets` = target + EOS; decoder-only, `targets` = prompt (source +
  EOS) + target + EOS with the prompt as the prefix (prefix_lm_examples)."""
  inputs, targets, truncated = [], [], 0
  for source, target in pairs:
    s, t = source_tok.encode(source), target_tok.encode(target)
    fs, ft = fit_length(s, max_source_len, too_long), fit_length(t, max_target_len, too_long)
    if fs is not None and ft is not None:
      truncated += len(fs) <= len(s) or len(ft) <= len(t)
      inputs.append(fs)
      targets.append(ft)
  counts = {"examples": len(targets), "dropped": len(pairs) - len(targets), "truncated": truncated}
  if decoder_only:
    return prefix_lm_examples(inputs, targets), counts
  return Examples.from_lists({"inputs": inputs, "targets": targets}), counts


def prefix_lm_examples(prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
                       ) -> Examples:
  """Decoder-only rows prompt + continuation: `assemble` sets prefix_mask 1 and weight 0 on the
  prompt, weight 1 on the continuation (why the separator is in it: models.decoder_prefix)."""
  rows = [list(p) + list(c) for p, c in zip(prompts, continuations, strict=True)]
  return Examples.from_lists({"targets": rows}, [len(p) for p in prompts])


def encode_stream(texts: Sequence[str], tok, row_len: int) -> Examples:
  """LM rows: every text's ids + EOS, concatenated and cut into rows of row_len (last one short)."""
  stream = np.fromiter((t for text in texts for t in tok.encode(text) + [EOS_ID]), np.int32)
  starts = np.arange(0, len(stream), row_len, dtype=np.int64)
  lengths = np.minimum(row_len, len(stream) - starts)
  return Examples({"targets": stream}, {"targets": starts}, {"targets": lengths})


def assemble(ex: Examples, idx: np.ndarray, row: np.ndarray, offset: dict[str, np.ndarray],
             segment: np.ndarray, row_len: dict[str, int], rows: int) -> dict[str, np.ndarray]:
  """Scatters examples `idx` into a [rows, row_len] batch at (row, offset) with segment ids."""
  out = {}
  for name, length in row_len.items():
    lens = ex.lengths[name][idx]
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    src = np.repeat(ex.starts[name][idx], lens) + within
    dst = np.repeat(row * length + offset[name], lens) + within
    tokens, seg, pos = (np.zeros(rows * length, np.int32) for _ in range(3))
    tokens[dst] = ex.tokens[name][src]
    seg[dst] = np.repeat(segment, lens)
    pos[dst] = within
    out[name] = tokens.reshape(rows, length)
    out[f"{name}_segment_ids"] = seg.reshape(rows, length)
    out[f"{name}_positions"] = pos.reshape(rows, length)
    if name == "targets":
      weights = (tokens != 0).astype(np.float32)
      if ex.prefix_len is not None:  # the prompt is the prefix and carries no loss
        prefix = np.zeros(rows * length, np.int32)
        prefix[dst] = within < np.repeat(ex.prefix_len[idx], lens)
        weights[dst] = 1 - prefix[dst]
        out["prefix_mask"] = prefix.reshape(rows, length)
      out["weights"] = weights.reshape(rows, length)
  return out


def one_per_row(ex: Examples, idx: np.ndarray, row_len: dict[str, int], rows: int
                ) -> dict[str, np.ndarray]:
  """Examples `idx` one per row (row i: idx[i], segment 1, offset 0); further rows are padding."""
  k = len(idx)
  return assemble(ex, idx, np.arange(k), {n: np.zeros(k, np.int64) for n in row_len},
                  np.ones(k, np.int32), row_len, rows)


def first_fit(lens: np.ndarray, rows: int, caps: np.ndarray, max_skipped: int):
  """First-fit of examples with lengths lens [m, F] into `rows` rows of capacity caps [F]; one
  that fits no row is skipped, and filling stops after `max_skipped` of them or when the
  candidates run out. Returns (candidates examined, placed candidate indices [k], row [k],
  offsets [k, F], segment ids [k], skipped indices); the loop only chooses rows."""
  num_features = len(caps)
  free = [np.full(rows, c, np.int64) for c in caps]  # per feature [rows]; 1-D ufuncs are fastest
  fits, tmp = np.empty(rows, bool), np.empty(rows, bool)
  placed, placed_row, skipped = [], [], []
  i, chunk = 0, 4 * rows  # rows of lens as lists, a chunk at a time: a batch examines ~4 per row
  as_lists = (ls for s in range(0, len(lens), chunk) for ls in lens[s:s + chunk].tolist())
  for i, ls in enumerate(as_lists):
    np.greater_equal(free[0], ls[0], out=fits)
    for j in range(1, num_features):
      np.logical_and(fits, np.greater_equal(free[j], ls[j], out=tmp), out=fits)
    r = int(fits.argmax())
    if not fits[r]:
      skipped.append(i)
      if len(skipped) >= max_skipped:
        break
      continue
    placed.append(i)
    placed_row.append(r)
    for j in range(num_features):
      free[j][r] -= ls[j]
  placed, row = np.asarray(placed, np.int64), np.asarray(placed_row, np.int64)
  off, seg = np.zeros((len(placed), num_features), np.int64), np.zeros(len(placed), np.int32)
  if len(placed):
    order = np.argsort(row, kind="stable")  # grouped by row, in placement order within a row
    grouped = np.asarray(lens, np.int64)[placed[order]]
    before = np.cumsum(grouped, axis=0) - grouped  # length placed before, over all rows
    first = np.flatnonzero(np.r_[True, row[order][1:] != row[order][:-1]])  # each row's first
    group = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(placed)]))
    off[order] = before - before[first][group]
    seg[order] = np.arange(len(placed)) - first[group] + 1
  return i + 1, placed, row, off, seg, skipped


class BatchDataset(grain.IterDataset):
  """Endless training batches of host `host` of `hosts` (`rows` per batch) over `Examples`."""

  def __init__(self, examples: Examples, *, rows: int, row_len: dict[str, int], mode: str,
               seed: int, host: int = 0, hosts: int = 1, transform: Any = None):
    super().__init__()
    check_value("data.batching", mode)
    self.examples, self.rows, self.row_len, self.mode, self.seed = (
        examples, rows, dict(row_len), mode, seed)
    self.host, self.hosts, self.transform = host, hosts, transform
    self.lengths = transform.lengths(examples) if transform is not None else examples.lengths
    Stream(len(examples), seed, host, hosts)  # fails now, not at the first batch, if n < hosts

  def __iter__(self) -> "BatchIterator":
    return BatchIterator(self)

  def __str__(self) -> str:
    return f"BatchDataset(mode={self.mode}, rows={self.rows}, row_len={self.row_len})"


class BatchIterator(grain.DatasetIterator):
  """State: {'pos': stream position, 'emitted': batches already taken from the bucket window,
  'deferred_pos': stream positions packing set aside for the next batch, 'rows', 'host', 'hosts'
  and, after a change in host count, the epoch plan of stream.py ('base_epoch', 'skip')}."""

  def __init__(self, ds: BatchDataset):
    super().__init__()
    self._ds = ds
    self._names = list(ds.row_len)
    self._caps = np.array([ds.row_len[n] for n in self._names], np.int64)
    self._stream = Stream(len(ds.examples), ds.seed, ds.host, ds.hosts)
    self._pos, self._emitted, self._window, self._deferred = 0, 0, None, []
    self._last = np.zeros(0, np.int64)  # stream positions of the last batch's examples

  def _lens(self, idx: np.ndarray) -> np.ndarray:
    return np.stack([self._ds.lengths[n][idx] for n in self._names], axis=1)  # [m, F]

  def _materialize(self, positions: np.ndarray) -> tuple[Examples, np.ndarray]:
    """(examples, their indices) of the examples at stream `positions`: the split's own, or
    the transform's output for them (which knows each example's index and epoch)."""
    idx = self._stream.ids(positions)
    if self._ds.transform is None:
      return self._ds.examples, idx
    epochs = self._stream.locate(positions)[0]
    return self._ds.transform(self._ds.examples, idx, epochs), np.arange(len(idx))

  def _next_pack(self) -> dict[str, np.ndarray]:
    rows = self._ds.rows
    lookahead = rows * int(self._caps.max())  # more examples than could ever fit
    positions = np.concatenate([np.asarray(self._deferred, np.int64),
                                np.arange(self._pos, self._pos + lookahead)])
    idx = self._stream.ids(positions)
    seen, placed, row, off, seg, skipped = first_fit(self._lens(idx), rows, self._caps,
                                                     max_skipped=max(1, rows // PACK_SKIP_DIVISOR))
    self._pos += max(0, seen - len(self._deferred))
    self._deferred = [int(positions[j]) for j in skipped]
    self._last = positions[placed]
    return assemble(*self._materialize(self._last), row,
                    {n: off[:, j] for j, n in enumerate(self._names)}, seg, self._ds.row_len, rows)

  def _bucket_window(self) -> list[tuple[np.ndarray, dict[str, int]]]:
    """The batches (stream positions, row lengths) of the window starting at self._pos."""
    rows = self._ds.rows
    positions = np.arange(self._pos, self._pos + rows * BUCKET_WINDOW)
    idx = self._stream.ids(positions)
    bounds = np.array([[max(1, int(np.ceil(c * f))) for f in BUCKET_FRACTIONS] for c in self._caps])
    lens = self._lens(idx)  # [m, F]
    bucket = np.max([np.searchsorted(bounds[j], lens[:, j]) for j in range(len(self._names))],
                    axis=0)
    order = np.argsort(bucket, kind="stable")
    batches = []
    for start in range(0, len(idx), rows):
      chunk = order[start:start + rows]
      b = int(bucket[chunk].max())
      batches.append((positions[chunk], {n: int(bounds[j][b]) for j, n in enumerate(self._names)}))
    perm = np.random.default_rng([self._ds.seed, self._pos, 1]).permutation(len(batches))
    return [batches[i] for i in perm]

  def __next__(self) -> dict[str, np.ndarray]:
    ds = self._ds
    if ds.mode == "pack":
      return self._next_pack()
    if ds.mode == "pad":
      self._last, row_len = np.arange(self._pos, self._pos + ds.rows), ds.row_len
      self._pos += ds.rows
    else:
      if self._window is None:
        self._window = self._bucket_window()
      self._last, row_len = self._window[self._emitted]
      self._emitted += 1
      if self._emitted == len(self._window):
        self._pos += ds.rows * BUCKET_WINDOW
        self._emitted, self._window = 0, None
    return one_per_row(*self._materialize(self._last), row_len, ds.rows)

  def get_state(self) -> dict[str, Any]:
    return {"pos": int(self._pos), "emitted": int(self._emitted),
            "deferred_pos": list(self._deferred), "rows": self._ds.rows,
            "host": self._ds.host, "hosts": self._ds.hosts, **self._stream.plan_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    ds = self._ds
    missing = sorted({"deferred_pos", "rows", "host", "hosts"} - state.keys())
    if missing:
      raise ValueError(f"the iterator state lacks {', '.join(missing)}: it was written by an "
                       "older version of this codebase, which this one cannot resume")
    saved = (int(state["host"]), int(state["hosts"]))
    if saved != (ds.host, ds.hosts):
      raise ValueError(f"the iterator state of host {saved[0]} of {saved[1]} cannot resume host "
                       f"{ds.host} of {ds.hosts} (use set_state_from_hosts with every host's state)")
    base, skip = Stream.plan_from_state(state, len(ds.examples))
    self._stream = Stream(len(ds.examples), ds.seed, ds.host, ds.hosts, base, skip)
    self._pos, self._emitted, self._window = int(state["pos"]), int(state["emitted"]), None
    self._deferred = [int(p) for p in state["deferred_pos"]]
    if ds.mode == "bucket" and self._emitted:
      self._window = self._bucket_window()

  def set_state_from_hosts(self, states: Sequence[dict[str, Any]]) -> None:
    """Resumes this host from the states of all hosts of a run with another host count: what
    they had not consumed of their epochs is split over the new hosts (stream.py)."""
    ds, count = self._ds, len(states)
    old = []
    for h, state in enumerate(states):
      rows = int(state.get("rows", ds.rows))  # a state without rows fails in set_state
      it = BatchIterator(BatchDataset(ds.examples, rows=rows, row_len=ds.row_len, mode=ds.mode,
                                      seed=ds.seed, host=h, hosts=count,
                                      transform=ds.transform))
      it.set_state(state)
      old.append(it)
    ends, pending = zip(*(it._progress() for it in old))
    streams = [it._stream for it in old]
    base, skip = remaining_plan(streams, ends, pending)
    self._stream = Stream(len(ds.examples), ds.seed, ds.host, ds.hosts, base, skip)
    self._pos, self._emitted, self._window, self._deferred = 0, 0, None, []

  def _progress(self) -> tuple[int, np.ndarray]:
    """(first stream position not yet read, positions read but not yet in an emitted batch)."""
    pending = [np.asarray(self._deferred, np.int64)]
    if self._window is None:
      return self._pos, pending[0]
    pending += [positions for positions, _ in self._window[self._emitted:]]
    return self._pos + self._ds.rows * BUCKET_WINDOW, np.concatenate(pending)


def eval_batches(examples: Examples, rows: int, row_len: dict[str, int], num_batches: int,
                 transform: Any = None) -> Iterator[dict[str, np.ndarray]]:
  """Examples in order, one per row; the last batches are padded with zero-weight rows. A
  transform sees every example at EVAL_EPOCH: each evaluation scores the same draw."""
  for b in range(num_batches):
    idx = np.arange(b * rows, min((b + 1) * rows, len(examples)))
    ex = examples
    if transform is not None:
      ex, idx = transform(examples, idx, np.full(len(idx), EVAL_EPOCH)), np.arange(len(idx))
    yield one_per_row(ex, idx, row_len, rows)
