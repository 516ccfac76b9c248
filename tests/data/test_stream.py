"""Elastic resume: training data iterator states map between process counts (data/stream.py).

The guarantee under test: within every epoch each training example is consumed exactly once across
all hosts, also when a checkpoint written by H hosts resumes on H' hosts; the examples no host had
consumed are what the new hosts consume in the rest of the epoch. And with one process and no
change, the batches are bitwise the recorded ones (MAIN_HASHES).

Example ids are read back from the batch contents (the unit tests give every example a unique
first input token; the 2-process test matches rows to the split's encoded examples), and checked
against the iterator's record of its last batch (`last_batch_examples`), which also gives epochs.
The 2-process test runs `jax.distributed` on 127.0.0.1 in subprocesses, like
tests/train/test_parallel.py.
"""

import collections
import dataclasses
import hashlib
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer.config import from_configdict
from transformer.data import load_task, pipeline
from transformer.data.stream import Stream
from transformer.run import checkpoints

# tests/ (the helpers), also when this file runs as a script: the 2-process test's legs.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import g2p_mini  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from processes import collect, free_port  # noqa: E402  pylint: disable=g-import-not-at-top

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("pack", "bucket", "pad")
ID_OFFSET = 10  # example i's first input token is ID_OFFSET + i
ROW_LEN = {"inputs": 8, "targets": 8}
# sha256 (first 16 hex digits) of the first 40 batches of the g2p_mini task on one process, per
# batching mode: the data order of a single-process pipeline that knows nothing of host counts.
MAIN_HASHES = {"pack": "be8ef3a30c8ad915", "bucket": "a939208a5a1d5a80",
               "pad": "208f0b73dbdcf28b"}


def toy_examples(n: int, seed: int = 0) -> pipeline.Examples:
  """n examples of random lengths (1-6 input, 1-6 target tokens) whose first token names them."""
  rng = np.random.default_rng(seed)
  inputs = [[ID_OFFSET + i] + rng.integers(4, 9, rng.integers(0, 6)).tolist() for i in range(n)]
  targets = [rng.integers(4, 9, rng.integers(1, 7)).tolist() for _ in range(n)]
  return pipeline.Examples.from_lists({"inputs": inputs, "targets": targets})


def host_iterator(ex, mode, host, hosts, global_rows=8):
  return iter(pipeline.BatchDataset(ex, rows=global_rows // hosts, row_len=ROW_LEN, mode=mode,
                                    seed=3, host=host, hosts=hosts))


def last_batch_examples(it):
  """(epoch, example index) of every example in the iterator's last batch."""
  positions = it._last  # pylint: disable=protected-access
  return it._stream.locate(positions)[0], it._stream.ids(positions)  # pylint: disable=protected-access


def take(it, batches):
  """(epoch, example id) of every example in the next `batches` batches, read from the contents
  and checked against the iterator's hook."""
  out = []
  for _ in range(batches):
    b = next(it)
    seen = [int(row[seg == s][0]) - ID_OFFSET for row, seg in
            zip(b["inputs"], b["inputs_segment_ids"]) for s in range(1, seg.max() + 1)]
    epochs, ids = last_batch_examples(it)
    assert sorted(seen) == sorted(ids.tolist())
    out += list(zip(epochs.tolist(), ids.tolist()))
  return out


def via_json(state):
  return json.loads(json.dumps(state))  # what grain's checkpoint handler does


def assert_each_epoch_exactly_once(consumed, n, complete_before):
  """Epochs < complete_before hold every example exactly once; later ones none twice."""
  by_epoch = collections.defaultdict(list)
  for epoch, i in consumed:
    by_epoch[epoch].append(i)
  assert complete_before >= 2, "the test must cover at least two whole epochs"
  for epoch, ids in sorted(by_epoch.items()):
    if epoch < complete_before:
      assert sorted(ids) == list(range(n)), f"epoch {epoch}"
    else:
      assert len(ids) == len(set(ids)), f"epoch {epoch}"


@pytest.mark.parametrize("mode", MODES)
def test_two_then_one_then_two_hosts_consume_every_example_once_per_epoch(mode):
  """2 hosts read 7 batches each; their states (JSON) resume 1 host for 5 batches, whose state
  resumes 2 hosts for 20 batches: every epoch the hosts finished holds each of the 61 examples
  exactly once, the unfinished one none twice. 61 examples in 8-row batches: the hosts cross epoch
  ends at different moments, so the mapping handles hosts in different epochs, set-aside packing
  examples and half-emitted bucket windows."""
  n, ex = 61, toy_examples(61)
  consumed = []
  hosts = [host_iterator(ex, mode, h, 2) for h in range(2)]
  for it in hosts:
    consumed += take(it, 7)
  one = host_iterator(ex, mode, 0, 1)
  one.set_state_from_hosts([via_json(it.get_state()) for it in hosts])
  consumed += take(one, 5)
  state = via_json(one.get_state())
  last_epochs = []
  for h in range(2):
    it = host_iterator(ex, mode, h, 2)
    it.set_state_from_hosts([state])
    part = take(it, 20)
    consumed += part
    last_epochs.append(part[-1][0])
  assert_each_epoch_exactly_once(consumed, n, complete_before=min(last_epochs))


@pytest.mark.parametrize("mode", MODES)
def test_one_host_consumes_what_the_two_hosts_would_have(mode):
  """Resumed as 1 host, a 2-host checkpoint's remaining examples of each open epoch are exactly the
  union of what the 2 hosts, continuing unchanged, would have consumed of that epoch."""
  ex = toy_examples(200)
  hosts = [host_iterator(ex, mode, h, 2) for h in range(2)]
  for it in hosts:
    take(it, 9)
  states = [via_json(it.get_state()) for it in hosts]
  one = host_iterator(ex, mode, 0, 1)
  one.set_state_from_hosts(states)
  got = take(one, 30)
  want = [pair for it in hosts for pair in take(it, 30)]
  done = min(e for e, _ in got[-8:])  # epochs every stream has left behind
  open_epochs = {e for e, _ in got}
  assert len(open_epochs) >= 2
  for epoch in sorted(open_epochs):
    if epoch < done:
      mine = sorted(i for e, i in got if e == epoch)
      theirs = sorted(i for e, i in want if e == epoch)
      assert mine == theirs, f"epoch {epoch}"


def test_plan_state_round_trip_and_epoch_lengths():
  """A stream's plan survives JSON; the new hosts' epoch lengths add up to the examples left."""
  skip = {4: np.arange(50) % 3 == 0, 5: np.arange(50) < 7}
  streams = [Stream(50, 1, h, 3, base_epoch=4, skip=skip) for h in range(3)]
  base, back = Stream.plan_from_state(via_json(streams[0].plan_state()), 50)
  assert base == 4 and back.keys() == skip.keys()
  assert all((back[e] == skip[e]).all() for e in skip)
  assert sum(s.epoch_length(4) for s in streams) == 50 - 17
  assert sum(s.epoch_length(5) for s in streams) == 43 and streams[0].epoch_length(6) == 17
  for s in streams:  # positions walk through the epochs in order
    epochs, offsets = s.locate(np.arange(s.epoch_start(7)))
    assert (np.diff(epochs) >= 0).all() and epochs[0] == 4 and epochs[-1] == 6
    assert s.epoch_start(5) == s.epoch_length(4)
  assert Stream(50, 1).plan_state() == {}


def test_single_process_batches_equal_main(tmp_path):
  """With one process the first 40 training batches of every batching mode are bitwise the
  recorded ones (MAIN_HASHES): elastic resume leaves the data order of documented results as is."""
  for mode in MODES:
    cfg = from_configdict(g2p_mini.config(str(tmp_path), **{"data.batching": mode}))
    it = load_task(cfg, process_index=0, process_count=1).train_iterator()
    digest = hashlib.sha256()
    for _ in range(40):
      batch = next(it)
      for key in sorted(batch):
        digest.update(key.encode())
        digest.update(batch[key].tobytes())
    assert digest.hexdigest()[:16] == MAIN_HASHES[mode], mode


def test_states_of_an_older_format_are_refused():
  """A state of an older format (set-aside examples as example ids, no positions, no host count)
  raises a one-line ValueError naming what it lacks, also on the elastic path."""
  it = host_iterator(toy_examples(61), "pack", 0, 1)
  state = it.get_state()
  old = {"pos": state["pos"], "emitted": 0, "deferred": []}
  want = "lacks deferred_pos, host, hosts, rows: it was written by an older version"
  with pytest.raises(ValueError, match=want):
    host_iterator(toy_examples(61), "pack", 0, 1).set_state(old)
  with pytest.raises(ValueError, match=want):
    host_iterator(toy_examples(61), "pack", 0, 1).set_state_from_hosts([old, old])


def test_state_of_another_host_is_refused():
  """set_state with host 1 of 2's state on host 0 of 1 raises a one-line ValueError; the elastic
  path is set_state_from_hosts; fewer examples than hosts is refused up front."""
  ex = toy_examples(20)
  state = host_iterator(ex, "pad", 1, 2).get_state()
  with pytest.raises(ValueError, match="host 1 of 2 cannot resume host 0 of 1"):
    host_iterator(ex, "pad", 0, 1).set_state(state)
  with pytest.raises(ValueError, match="2 examples, fewer than the 4 hosts"):
    host_iterator(toy_examples(2), "pad", 0, 4)


def _save_as_two_processes(tmp_path, ex):
  """A checkpoint whose data item holds the states of 2 simulated hosts (process_i-of-2.json),
  as a 2-process run writes it; returns (Checkpointer, state, the 2 host iterators)."""
  hosts = [host_iterator(ex, "pack", h, 2) for h in range(2)]
  for it in hosts:
    next(it)
  state = {"w": jnp.arange(4.0)}
  ckpt_cfg = dataclasses.replace(from_configdict(base.get_config()).checkpoint, every_steps=1,
                                 async_save=False)
  ckpt = checkpoints.Checkpointer(str(tmp_path), ckpt_cfg)
  ckpt.save(1, state, data_iterator=hosts[0], force=True)
  data = os.path.join(ckpt.directory, "1", "data")
  os.remove(os.path.join(data, "process_0-of-1.json"))
  for h, it in enumerate(hosts):
    with open(os.path.join(data, f"process_{h}-of-2.json"), "w") as f:
      json.dump(it.get_state(), f)
  return ckpt, state, hosts


def test_checkpointer_reshards_a_two_process_checkpoint(tmp_path):
  """Checkpointer.restore of a checkpoint written by 2 processes into this 1-process run restores
  the state and maps both hosts' iterator states (the next batches are the 2 hosts' remainder);
  a missing host file or an iterator that cannot reshard is a one-line CheckpointError."""
  ex = toy_examples(61)
  ckpt, state, hosts = _save_as_two_processes(tmp_path, ex)
  one = host_iterator(ex, "pack", 0, 1)
  restored = ckpt.restore(1, checkpoints.abstract_of(state), data_iterator=one)
  np.testing.assert_array_equal(restored["w"], state["w"])
  want = host_iterator(ex, "pack", 0, 1)
  want.set_state_from_hosts([via_json(it.get_state()) for it in hosts])
  np.testing.assert_array_equal(next(one)["inputs"], next(want)["inputs"])

  class Plain:  # an iterator without set_state_from_hosts
    pass
  with pytest.raises(checkpoints.CheckpointError, match=r"written by 2 processes, this run has 1"):
    ckpt.restore(1, checkpoints.abstract_of(state), data_iterator=Plain())
  os.remove(os.path.join(ckpt.directory, "1", "data", "process_1-of-2.json"))
  with pytest.raises(checkpoints.CheckpointError, match=r"iterator states of every process") as e:
    ckpt.restore(1, checkpoints.abstract_of(state), data_iterator=one)
  assert "\n" not in str(e.value)
  ckpt.close()


# ---------------------------------------------------------------- 2 -> 1 -> 2 real processes

LEGS = ((2, 10), (1, 18), (2, 30))  # (processes, train.num_steps): 27 steps make one epoch
GLOBAL_ROWS = 16


def leg_config(data_root: str, num_steps: int, processes: int, process_id: int, port: int):
  """The g2p_mini run in pad mode (one example per row), 16 rows, checkpoint at the leg's end."""
  cd = g2p_mini.config(data_root, num_steps=num_steps, **{
      "data.batching": "pad", "data.batch_size": GLOBAL_ROWS, "eval.num_batches": 1,
      "eval.num_decode_examples": 4, "checkpoint.keep_best_by": ""})
  if processes > 1:
    cd.parallel.update(distributed="on", coordinator_address=f"127.0.0.1:{port}",
                       num_processes=processes, process_id=process_id)
  else:
    cd.parallel.distributed = "off"
  return cd


def scenario_leg(root: str, num_steps: int, processes: int, process_id: int, port: int) -> dict:
  """One process of one leg in root/run on the data of root/data: trains to num_steps and returns,
  per training batch, the examples (epoch, id) by the iterator's hook and the rows' tokens."""
  import fcntl  # pylint: disable=g-import-not-at-top
  from transformer.train import loop, parallel  # pylint: disable=g-import-not-at-top
  workdir, data_root = os.path.join(root, "run"), os.path.join(root, "data")
  cd = leg_config(data_root, num_steps, processes, process_id, port)
  parallel.initialize_distributed(from_configdict(cd).parallel)
  with open(os.path.join(data_root, "lock"), "w") as lock:  # config() rewrites the split files
    fcntl.flock(lock, fcntl.LOCK_EX)
    cd = leg_config(data_root, num_steps, processes, process_id, port)
    task = load_task(from_configdict(cd), process_index=process_id, process_count=processes)
  made = []

  class Recording(pipeline.BatchIterator):
    def __next__(self):
      batch = super().__next__()
      epochs, ids = last_batch_examples(self)
      self.log.append(dict(epochs=epochs.tolist(), ids=ids.tolist(), rows=[
          row_key(i, t) for i, t in zip(batch["inputs"], batch["targets"])]))
      return batch

  def recording_iterator(make=task.train_iterator):
    it = make()
    it.__class__, it.log = Recording, []
    made.append(it)
    return it

  task.train_iterator = recording_iterator
  final = loop.train_and_evaluate(cd, workdir, task=task)
  # The loop's last iterator is the one it trained from (the first gave an example batch).
  return dict(step=final["step"], batches=made[-1].log)


def row_key(inputs, targets) -> str:
  """An example's tokens as text: 'inputs|targets' without padding."""
  return ",".join(map(str, inputs[inputs != 0])) + "|" + ",".join(map(str, targets[targets != 0]))


def _spawn_leg(out_dir, args):
  """`python tests/data/test_stream.py leg *args` with root out_dir; output to files as
  processes.collect wants."""
  import subprocess  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, JAX_PLATFORMS="cpu", ELASTIC_TEST_ROOT=str(out_dir),
             JAX_COMPILATION_CACHE_DIR=str(out_dir / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
  name = "_".join(args)
  with open(out_dir / f"{name}.out", "w") as out, open(out_dir / f"{name}.err", "w") as err:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=REPO, env=env, text=True,
                            stdout=out, stderr=err)


@pytest.mark.slow  # three legs of real training processes: minutes on 2 shared cores
def test_two_processes_resume_as_one_then_two(tmp_path):
  """A real 2-process jax.distributed run (loopback, 1 CPU device each) trains 10 steps of 16 rows,
  resumes as 1 process to step 18, then as 2 processes to step 30 (one epoch is 27 steps).

  Proves: every leg resumed where the last stopped; over the three legs each of the 432 training
  examples was consumed exactly once in epoch 0 and none twice in epoch 1 (ids from the rows'
  tokens, matching the hook's); and the 1-process leg plus the last leg's epoch-0 part consumed
  exactly what the 2 processes, continuing unchanged from step 10, would have in that epoch.
  """
  data_root = str(tmp_path / "data")
  cfg = from_configdict(leg_config(data_root, 1, 1, 0, 0))
  examples, _ = load_task(cfg, process_index=0, process_count=1)._examples("train", "drop")  # pylint: disable=protected-access
  keys = [row_key(np.asarray(examples.tokens["inputs"][s:s + n]),
                  np.asarray(examples.tokens["targets"][t:t + m]))
          for s, n, t, m in zip(examples.starts["inputs"], examples.lengths["inputs"],
                                examples.starts["targets"], examples.lengths["targets"])]
  n = len(keys)
  assert n == 27 * GLOBAL_ROWS
  legs, step10_states = [], None
  for processes, steps in LEGS:
    port = free_port()
    procs = [_spawn_leg(tmp_path, ["leg", str(steps), str(processes), str(i), str(port)])
             for i in range(processes)]
    legs.append(collect(procs, tmp_path, timeout=240))
    if steps == 10:
      data = tmp_path / "run" / "checkpoints" / "10" / "data"
      step10_states = [json.loads((data / f"process_{h}-of-2.json").read_text())
                       for h in range(2)]
  consumed, first_epoch_rows = {0: [], 1: []}, []
  start = 0
  for (processes, steps), results in zip(LEGS, legs):
    for r in results:
      assert r["step"] == steps and len(r["batches"]) == steps - start
      for step, b in enumerate(r["batches"], start=start + 1):
        assert collections.Counter(b["rows"]) == collections.Counter(keys[i] for i in b["ids"])
        first_epoch_rows += b["rows"] if step <= 27 else []
        for e, i in zip(b["epochs"], b["ids"]):
          consumed[e].append(i)
    start = steps
  # By step numbers and row contents alone: steps 1-27 hold every example once.
  assert collections.Counter(first_epoch_rows) == collections.Counter(keys)
  assert sorted(consumed[0]) == list(range(n))
  assert len(consumed[1]) == len(set(consumed[1])) == 3 * GLOBAL_ROWS
  later = {i for r in legs[1] + legs[2] for b in r["batches"] for e, i in zip(b["epochs"], b["ids"])
           if e == 0}
  would = set()
  for h in range(2):
    it = load_task(cfg, process_index=h, process_count=2).train_iterator()
    it.set_state(step10_states[h])
    for _ in range(27 - 10):
      next(it)
      would |= set(last_batch_examples(it)[1].tolist())
  assert later == would


if __name__ == "__main__":
  jax.config.update("jax_num_cpu_devices", 1)
  print(json.dumps(scenario_leg(os.environ["ELASTIC_TEST_ROOT"], *map(int, sys.argv[2:]))))
