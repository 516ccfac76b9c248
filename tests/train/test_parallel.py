"""Tests of transformer/train/parallel.py: meshes, shardings, mesh vs pmap vs one device, two processes.

JAX fixes the number of fake CPU devices when it first creates its backend, and under pytest (and
`pytest -n 2`) another test module may already have done that with one device. So every test that
needs several devices runs its body in a fresh subprocess: `python tests/train/test_parallel.py
SCENARIO ...` calls `jax.config.update('jax_num_cpu_devices', N)` before any device is touched,
runs the scenario function below and prints its results as one JSON line; the pytest process then
asserts on them. Each scenario runs once per module (fixtures), and all of it is bounded by
timeouts.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from processes import collect, free_port
from transformer.config import ConfigError, MeshShape, ParallelConfig
from transformer.model import scoring
from transformer.train import parallel

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
STEPS = 3
# Float32 sums over the batch are reduced in a different order when the batch is split over
# devices (per-device partial sums, then an all-reduce) than on one device, so results agree to a
# few float32 ulps per step, not bitwise. Parameters get a looser bound because adam divides by
# sqrt(nu): the attention key bias has an exactly-zero gradient in exact arithmetic (softmax ignores
# a shift shared by all keys), so its update is lr * float32 noise / (|noise| + eps). With eps=1e-5
# that stays ~1e-5 after STEPS steps (measured), every other parameter within ~3e-6.
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-4


# ---------------------------------------------------------------- scenarios (run in subprocesses)

def _tiny_setup(batch_rows: int):
  """The tiny encoder-decoder, its Config, plain adam, STEPS fixed random batches with padding."""
  import optax  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  from transformer.model import models  # pylint: disable=g-import-not-at-top
  from transformer.config import from_configdict  # pylint: disable=g-import-not-at-top
  cd = base.get_config()
  # Decoder-only: half the compile time of the encoder-decoder, the same sharding rules.
  cd.model.update(arch="decoder_only", d_model=32, num_heads=4, mlp_dim=64, num_decoder_layers=1,
                  vocab_size=16, source_vocab_size=16, max_len=16, dropout_rate=0.0)
  cd.data.update(max_source_len=16, max_target_len=16)
  cd.train.update(label_smoothing=0.1, optimizer="adam")
  cfg = from_configdict(cd)
  rng = np.random.RandomState(0)
  batches = []
  for _ in range(STEPS):
    inputs = rng.randint(1, 16, (batch_rows, 8)).astype(np.int32)
    targets = rng.randint(1, 16, (batch_rows, 6)).astype(np.int32)
    for i in range(batch_rows):  # ragged padding: rows carry different numbers of tokens
      targets[i, 2 + i % 5:] = 0
      inputs[i, 3 + i % 6:] = 0
    batches.append(dict(inputs=inputs, targets=targets, weights=(targets > 0).astype(np.float32)))
  return cfg, models.build_model(cfg.model), optax.adam(1e-2, eps=1e-5), batches


def _flat(tree) -> np.ndarray:
  import jax  # pylint: disable=g-import-not-at-top
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


def _initial_state(cfg, model, tx, batches, unbox=True):
  """The TrainState of seed 0 (jit-compiled once: eager flax init runs op by op, slowly)."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer.train import steps  # pylint: disable=g-import-not-at-top
  create = lambda: steps.create_train_state(cfg, model, jax.random.PRNGKey(0), batches[0], tx,
                                               unbox)
  return jax.eval_shape(create) if not unbox else jax.jit(create)()


def _run_mode(cfg, model, tx, batches, state, mode, mesh, rows):
  """Trains STEPS steps through parallel.compile_train_step as the loop does: the state placed on
  the mesh (sharded by its logical axes; pmap: replicated), prepared, stepped, fetched back.
  Returns (losses, the fetched state, eval sums, whether it is back on those shardings)."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer.train import steps  # pylint: disable=g-import-not-at-top
  shardings = parallel.state_shardings(_initial_state(cfg, model, tx, batches, False), mesh,
                                       replicated=mode == "pmap")
  run = parallel.compile_train_step(steps.make_train_step(cfg, model, tx), mode, mesh, shardings)
  ev = parallel.compile_eval_step(scoring.make_eval_step(model), mode, mesh, shardings.params)
  # prepare_state may share buffers with its input, which the donating step then frees: copy.
  state = run.prepare_state(jax.device_put(jax.tree.map(lambda x: x.copy(), state), shardings))
  losses = []
  for b in batches:
    state, metrics = run.step(state, run.prepare_batch({k: v[rows] for k, v in b.items()}))
    losses.append(float(metrics["loss"]))
  sums = ev.step(state.params, ev.prepare_batch({k: v[rows] for k, v in batches[0].items()}))
  fetched = run.fetch_state(state)
  placed = all(x.sharding == s
               for x, s in zip(jax.tree.leaves(fetched), jax.tree.leaves(shardings)))
  return losses, fetched, {k: float(v) for k, v in sums.items()}, placed


def scenario_modes() -> dict:
  """8 devices: one device (plain jit, no parallel code), mesh 8x1x1, mesh 2x2x2, pmap over 8."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from transformer.train import steps  # pylint: disable=g-import-not-at-top
  cfg, model, tx, batches = _tiny_setup(16)
  state = state0 = _initial_state(cfg, model, tx, batches)
  step = jax.jit(steps.make_train_step(cfg, model, tx))
  ref_losses = []
  for b in batches:
    state, metrics = step(state, b)
    ref_losses.append(float(metrics["loss"]))
  ref_params = _flat(state.params)
  ref_eval = {k: float(v) for k, v in
              jax.jit(scoring.make_eval_step(model))(state.params, batches[0]).items()}
  out = dict(ref_losses=ref_losses, ref_eval=ref_eval, modes={})
  all_rows = slice(None)
  for name, mode, shape in [("mesh8x1x1", "mesh", (8, 1, 1)), ("mesh2x2x2", "mesh", (2, 2, 2)),
                            ("pmap8", "pmap", (2, 2, 2))]:  # pmap: every device on data
    mesh = parallel.make_mesh(ParallelConfig(mode, MeshShape(*shape), "off", "", 0, -1))
    losses, st, sums, placed = _run_mode(cfg, model, tx, batches, state0, mode, mesh, all_rows)
    out["modes"][name] = dict(losses=losses, eval=sums, placed=placed, mesh=dict(mesh.shape),
                              param_diff=float(np.max(np.abs(_flat(st.params) - ref_params))))
    if name == "mesh2x2x2":
      wi, mu = st.params["decoder"]["layers_0"]["ffn"]["wi"]["kernel"], st.opt_state[0].mu
      mu_wi = mu["decoder"]["layers_0"]["ffn"]["wi"]["kernel"]
      out["wi"] = dict(spec=list(wi.sharding.spec), mu_spec=list(mu_wi.sharding.spec),
                       shape=list(wi.shape), shard=list(wi.addressable_shards[0].data.shape),
                       count_spec=list(st.opt_state[0].count.sharding.spec))
      batch = parallel.shard_batch(batches[0], mesh)
      out["batch_shard"] = list(batch["targets"].addressable_shards[0].data.shape)
      # The same shardings from an unboxed state plus the boxed abstract params.
      boxed = _initial_state(cfg, model, tx, batches, unbox=False)
      unboxed = jax.eval_shape(lambda: state0)
      a = parallel.state_shardings(boxed, mesh)
      b = parallel.state_shardings(unboxed, mesh, boxed_params=boxed.params)
      out["unboxed_same"] = jax.tree.map(lambda x, y: x.spec == y.spec, a, b) == \
          jax.tree.map(lambda x: True, a)
      # Dimensions an axis does not divide: vocab 37 and one kv head over tensor=2.
      odd = {"emb": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((37, 32), "float32"),
                                            ("vocab", "embed")),
             "kv": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((32, 1, 8), "float32"),
                                           ("embed", "kv_heads", "head_dim"))}
      odd_sh = parallel.state_shardings({"params": odd, "step": jax.ShapeDtypeStruct((), "int32")},
                                        mesh)
      out["odd"] = {k: list(v.spec) for k, v in odd_sh["params"].items()}
  return out


def process_batch_slice(global_batch_size: int) -> int:
  """The number of rows of a global batch that this process loads (global / process count)."""
  import jax  # pylint: disable=g-import-not-at-top  (after the worker sets its device count)
  n = jax.process_count()
  if global_batch_size % n:
    raise ConfigError(
        f"data.batch_size={global_batch_size} does not divide over {n} processes")
  return global_batch_size // n


def scenario_multihost(process_id: int, num_processes: int, port: int, modes: str) -> dict:
  """One process of a `jax.distributed` run on 127.0.0.1 (or the whole run if num_processes=1)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  pcfg = ParallelConfig("mesh", MeshShape(2, 1, 2), "auto" if num_processes > 1 else "off",
                        f"127.0.0.1:{port}", num_processes, process_id)
  parallel.initialize_distributed(pcfg)
  parallel.initialize_distributed(pcfg)  # idempotent
  cfg, model, tx, batches = _tiny_setup(8)
  per_host = process_batch_slice(8)
  try:
    process_batch_slice(7)
    bad_slice_error = ""
  except ConfigError as e:
    bad_slice_error = str(e)
  rows = slice(process_id * per_host, (process_id + 1) * per_host)
  state = _initial_state(cfg, model, tx, batches)
  out = dict(per_host=per_host, bad_slice_error=bad_slice_error, main=parallel.is_main_process(),
             processes=jax.process_count(), devices=jax.device_count())
  for mode in modes.split(","):
    mesh = parallel.make_mesh(dataclasses.replace(pcfg, mode=mode))
    losses, st, sums, placed = _run_mode(cfg, model, tx, batches, state, mode, mesh, rows)
    # Global arrays (pmap's replicated on every device of every process): each process's shards.
    params = multihost_utils.process_allgather(st.params, tiled=True)
    out[mode] = dict(losses=losses, eval=sums, params=_flat(params).tolist(), placed=placed)
  return out


# ---------------------------------------------------------------- the pytest side

def _spawn(args: list[str], devices: int, out_dir: Path) -> subprocess.Popen:
  """Starts `python tests/train/test_parallel.py *args` on `devices` fake CPU devices, output to
  files."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PARALLEL_TEST_DEVICES=str(devices),
             PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
  name = "_".join(args)
  # Files, not pipes: a process blocked on a full pipe would stall its peers' distributed shutdown.
  with open(out_dir / f"{name}.out", "w") as out, open(out_dir / f"{name}.err", "w") as err:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=REPO, env=env, text=True,
                            stdout=out, stderr=err)


@pytest.fixture(scope="module")
def modes(tmp_path_factory):
  out_dir = tmp_path_factory.mktemp("modes")
  return collect([_spawn(["modes"], 8, out_dir)], out_dir, timeout=150)[0]


@pytest.fixture(scope="module")
def multihost(tmp_path_factory):
  out_dir, port = tmp_path_factory.mktemp("multihost"), free_port()
  procs = [_spawn(["multihost", str(i), "2", str(port), "mesh,pmap"], 2, out_dir)
           for i in range(2)]
  procs.append(_spawn(["multihost", "0", "1", "0", "mesh"], 4, out_dir))
  return collect(procs, out_dir, timeout=180)


def test_resolve_mesh_shape():
  """-1 takes the devices left over; products that do not match give one-line ConfigErrors."""
  assert parallel.resolve_mesh_shape(MeshShape(-1, 2, 1), 8) == (4, 2, 1)
  assert parallel.resolve_mesh_shape(MeshShape(2, 2, 2), 8) == (2, 2, 2)
  with pytest.raises(ConfigError) as e:
    parallel.make_mesh(ParallelConfig("mesh", MeshShape(3, 1, 1), "off", "", 0, -1),
                       devices=[object()] * 8)
  assert str(e.value) == "parallel.mesh_shape data=3 fsdp=1 tensor=1 needs 3 devices, have 8"
  with pytest.raises(ConfigError, match=r"8 devices do not divide by .* 3"):
    parallel.resolve_mesh_shape(MeshShape(-1, 3, 1), 8)


def test_initialize_distributed_off_and_auto_are_noops(monkeypatch):
  """'off', and 'auto' without addresses or launcher variables, never start jax.distributed."""
  import jax  # pylint: disable=g-import-not-at-top
  for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"):
    monkeypatch.delenv(var, raising=False)
  for setting in ("off", "auto"):
    parallel.initialize_distributed(ParallelConfig("mesh", MeshShape(-1, 1, 1), setting, "", 0, -1))
  assert not jax.distributed.is_initialized()


def test_initialize_distributed_on_without_addresses_is_a_config_error(monkeypatch):
  """distributed='on' with nothing to connect to: a one-line ConfigError naming the key."""
  for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"):
    monkeypatch.delenv(var, raising=False)
  with pytest.raises(ConfigError, match=r"^parallel.distributed='on': [^\n]*$"):
    parallel.initialize_distributed(ParallelConfig("mesh", MeshShape(-1, 1, 1), "on", "", 0, -1))


def test_single_device_mesh_and_pmap_reach_the_same_loss(modes):
  """Mesh 8x1x1, mesh 2x2x2 and pmap over 8 train like one device (plain jit, no parallel code);
  each starts from and fetches back a state on the mesh (pmap's: every device on data, replicated).

  Same losses at every step to LOSS_RTOL, same parameters after STEPS adam steps to PARAM_ATOL,
  same eval sums: the batch split and the psum of sums are exact up to float32 summation order.
  """
  assert len(modes["modes"]) == 3
  assert modes["modes"]["pmap8"]["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
  for name, m in modes["modes"].items():
    assert m["placed"], name  # fetched back onto the shardings the state started on
    np.testing.assert_allclose(m["losses"], modes["ref_losses"], rtol=LOSS_RTOL, err_msg=name)
    assert m["param_diff"] < PARAM_ATOL, (name, m["param_diff"])
    for k, v in modes["ref_eval"].items():
      np.testing.assert_allclose(m["eval"][k], v, rtol=LOSS_RTOL, err_msg=f"{name} eval {k}")
  assert modes["ref_losses"][-1] < modes["ref_losses"][0]  # it did train


def test_mesh_2x2x2_places_mlp_over_tensor_and_embed_over_fsdp(modes):
  """On 2x2x2 the trained ffn kernel [embed=32, mlp=64] is split (fsdp, tensor): 16x32 per device.

  Its adam moment has the same sharding, the step count is replicated, the batch of 16 rows is
  split over data*fsdp (4 rows per device), and an unboxed state plus `boxed_params` gives the
  same shardings as the boxed state.
  """
  wi = modes["wi"]
  assert wi["spec"] == ["fsdp", "tensor"], wi
  assert wi["mu_spec"] == wi["spec"] and wi["count_spec"] == []
  assert wi["shape"] == [32, 64] and wi["shard"] == [16, 32]
  assert modes["batch_shard"] == [4, 6]
  assert modes["unboxed_same"]


def test_axes_that_do_not_divide_are_replicated(modes):
  """vocab=37 over tensor=2 and a single kv head stay unsplit instead of crashing."""
  assert modes["odd"] == {"emb": [None, "fsdp"], "kv": ["fsdp"]}, modes["odd"]


@pytest.mark.slow  # ~60 s of 2 processes; jax.distributed also runs in test_interrupt's two-process test
def test_two_processes_match_one_process(multihost):
  """A real 2-process jax.distributed run (2 CPU devices each, gloo on 127.0.0.1), each process
  feeding its half of the batch, matches one process with 4 devices (mesh 2x1x2) to LOSS_RTOL and
  PARAM_ATOL, in mesh 2x1x2 mode and in pmap mode (whose psum spans both processes); process 0 is
  the main process, and a global batch of 7 is refused for 2 processes."""
  p0, p1, ref = multihost
  assert (p0["processes"], p0["devices"], ref["processes"], ref["devices"]) == (2, 4, 1, 4)
  assert p0["main"] and not p1["main"] and p0["per_host"] == 4 and ref["per_host"] == 8
  assert p0["bad_slice_error"] == "data.batch_size=7 does not divide over 2 processes"
  want = ref["mesh"]
  assert want["losses"][-1] < want["losses"][0]
  for p in (p0, p1):
    for mode in ("mesh", "pmap"):
      got = p[mode]
      np.testing.assert_allclose(got["losses"], want["losses"], rtol=LOSS_RTOL, err_msg=mode)
      np.testing.assert_allclose(got["params"], want["params"], atol=PARAM_ATOL, err_msg=mode)
      np.testing.assert_allclose(got["eval"]["loss_sum"], want["eval"]["loss_sum"], rtol=LOSS_RTOL)
      assert got["eval"]["weight_sum"] == want["eval"]["weight_sum"]
      assert got["placed"], mode


if __name__ == "__main__":
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_num_cpu_devices", int(os.environ["PARALLEL_TEST_DEVICES"]))
  name, args = sys.argv[1], sys.argv[2:]
  if name == "modes":
    result = scenario_modes()
  else:
    result = scenario_multihost(int(args[0]), int(args[1]), int(args[2]), args[3])
  print(json.dumps(result))
