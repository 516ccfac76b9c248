"""Expert parallelism (transformer/train/parallel.py's 'expert' rule): a model.ffn=moe model's
experts split over the mesh's data axis train like one device, on 4 fake CPU devices.

As in tests/train/test_parallel.py, the multi-device body runs in a fresh subprocess
(`python tests/train/test_moe_parallel.py`), which sets the device count before JAX creates its
backend and prints its results as one JSON line.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from processes import collect

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
DEVICES = 4
# Sums over a batch split over devices are added in another order than on one device.
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-4


def scenario() -> dict:
  """One device (plain jit) against meshes 4x1x1 and 2x1x2, capacity and dropless routing."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  from transformer.config import (  # pylint: disable=g-import-not-at-top
      from_configdict, MeshShape, ParallelConfig)
  from transformer.model import models  # pylint: disable=g-import-not-at-top
  from transformer.train import parallel, steps  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  batches = [dict(targets=rng.randint(1, 16, (8, 8)).astype(np.int32)) for _ in range(STEPS)]
  out = {}
  for capacity_factor in (1.0, 0.0):
    cd = base.get_config()
    cd.model.update(arch="decoder_only", d_model=16, num_heads=2, mlp_dim=8, num_decoder_layers=1,
                    vocab_size=16, max_len=16, dropout_rate=0.0, ffn="moe", moe_num_experts=4,
                    moe_top_k=2, moe_capacity_factor=capacity_factor, moe_num_shared_experts=1)
    cd.data.update(max_source_len=16, max_target_len=16)
    cfg = from_configdict(cd)
    model, tx = models.build_model(cfg.model), optax.sgd(0.5)  # adam would amplify ulps
    create = lambda: steps.create_train_state(cfg, model, jax.random.key(0), batches[0], tx)
    step = steps.make_train_step(cfg, model, tx)
    state, ref = jax.jit(create)(), []
    for b in batches:
      state, metrics = jax.jit(step)(state, b)
      ref.append([float(metrics["loss"]), float(metrics["moe_aux_loss"])])
    ref_params = jax.tree.leaves(state.params)
    runs = {}
    for shape in ((4, 1, 1), (2, 1, 2)):
      mesh = parallel.make_mesh(ParallelConfig("mesh", MeshShape(*shape), "off", "", 0, -1))
      boxed = jax.eval_shape(lambda: steps.create_train_state(cfg, model, jax.random.key(0),
                                                              batches[0], tx, False))
      shardings = parallel.state_shardings(boxed, mesh)
      run = parallel.compile_train_step(step, "mesh", mesh, shardings)
      st, got = run.prepare_state(jax.tree.map(lambda x: x.copy(), jax.jit(create)())), []
      for b in batches:
        st, metrics = run.step(st, run.prepare_batch(b))
        got.append([float(metrics["loss"]), float(metrics["moe_aux_loss"])])
      wi = st.params["decoder"]["layers_0"]["ffn"]["wi_gate"]["kernel"]
      runs["x".join(map(str, shape))] = dict(
          metrics=got, spec=[a for a in wi.sharding.spec],
          shard=list(wi.addressable_shards[0].data.shape),
          param_diff=max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                         for a, b in zip(jax.tree.leaves(st.params), ref_params)))
    out[str(capacity_factor)] = dict(ref=ref, runs=runs)
  return out


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("moe_parallel")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"),
                                         os.environ.get("PYTHONPATH", "")]))
  with open(tmp_path / "scenario.out", "w") as o, open(tmp_path / "scenario.err", "w") as e:
    proc = subprocess.Popen([sys.executable, __file__, "scenario"], cwd=REPO, env=env, text=True,
                            stdout=o, stderr=e)
  return collect([proc], tmp_path, timeout=240)[0]


@pytest.mark.parametrize("capacity_factor", ["1.0", "0.0"])
def test_experts_split_over_data_train_like_one_device(result, capacity_factor):
  """4 experts over data=4 (one each) or data=2: the same losses, aux losses and parameters."""
  r = result[capacity_factor]
  for name, run in r["runs"].items():
    np.testing.assert_allclose(run["metrics"], r["ref"], rtol=LOSS_RTOL, err_msg=name)
    assert run["param_diff"] < PARAM_ATOL, (name, run["param_diff"])
  assert r["runs"]["4x1x1"]["spec"][0] == "data" and r["runs"]["4x1x1"]["shard"] == [1, 16, 8]
  assert r["runs"]["2x1x2"]["spec"][0] == "data" and r["runs"]["2x1x2"]["shard"] == [2, 16, 4]


if __name__ == "__main__":
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_num_cpu_devices", DEVICES)
  print(json.dumps(scenario()))
