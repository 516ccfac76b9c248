"""Device mesh, logical partition rules, jit shardings, pmap mode, multi-host setup, memory check.

Both modes hold the train state on a ('data', 'fsdp', 'tensor') mesh between steps: created,
restored, evaluated and saved by the same code. mode='mesh' shards it by its logical axis names
and jits the step over the mesh, the batch split over data*fsdp, the state donated. mode='pmap'
puts every device on the data axis and replicates the state there; its step is the same function
(steps.py), pmapped with its sums `psum`med over `axis_name`, fed a copy of the state per device
and a slice of the batch per device.
"""

import dataclasses
import functools
import math
import os
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from flax.core import meta
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.config import ConfigError, MeshShape, ParallelConfig

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
PMAP_AXIS = "batch"

# Logical axis name -> mesh axes; earlier rules win when two names of one array want one mesh
# axis. fsdp devices are data-parallel too (ZeRO-3) and split every weight on its d_model side;
# tensor splits the wide side of each projection (Megatron), so a block's in/out matmul pair needs
# one all-reduce. A mixture's experts split over data (expert parallelism as GShard and Switch lay
# it out: each data-parallel device holds experts / data of them, and tokens travel to their
# experts), so no mesh axis is added. A dimension a mesh axis does not divide is replicated.
LOGICAL_AXIS_RULES = (
    ("batch", BATCH_AXES), ("expert", "data"), ("embed", "fsdp"),
    ("mlp", "tensor"), ("heads", "tensor"), ("kv_heads", "tensor"), ("vocab", "tensor"),
    ("classes", None), ("head_dim", None), ("layers", None), ("length", None),
    ("relpos_buckets", None), ("norm", None), ("patch", None),
)


def _environment_asks_for_distributed() -> bool:
  """True when a launcher set up a multi-process job that jax.distributed can detect by itself."""
  env = os.environ
  slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
  if (env.get("JAX_COORDINATOR_ADDRESS")
      or (all(k in env for k in slurm) and int(env["SLURM_NTASKS"]) > 1)
      or ("OMPI_MCA_orte_hnp_uri" in env and int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1)):
    return True
  try:  # jax sets this flag at import when libtpu and TPU chips are present (a Cloud TPU VM).
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top  (private; may be absent)
    return bool(cloud_tpu_init.running_in_cloud_tpu_vm) and "TPU_SKIP_MDS_QUERY" not in env
  except (ImportError, AttributeError):
    return False


def initialize_distributed(parallel_cfg: ParallelConfig) -> None:
  """Calls jax.distributed.initialize if the config ('on', explicit addresses) or environment
  asks; idempotent. Must run before any other JAX call that touches devices."""
  c = parallel_cfg
  if c.distributed == "off" or jax.distributed.is_initialized():
    return
  given = {"coordinator_address": c.coordinator_address or None,
           "num_processes": c.num_processes if c.num_processes > 0 else None,
           "process_id": c.process_id if c.process_id >= 0 else None}
  given = {k: v for k, v in given.items() if v is not None}
  if c.distributed == "auto" and not (given or _environment_asks_for_distributed()):
    return
  try:
    jax.distributed.initialize(**given)
  except (ValueError, TypeError, RuntimeError) as e:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ConfigError(
        f"parallel.distributed={c.distributed!r}: jax.distributed.initialize failed ({msg}); set "
        "parallel.coordinator_address/num_processes/process_id or parallel.distributed=off") from e


def is_main_process() -> bool:
  """True on the process that writes logs, provenance and other single-writer files."""
  return jax.process_index() == 0


def resolve_mesh_shape(mesh_shape: MeshShape, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with a -1 entry replaced by the devices left over; checks the product."""
  sizes = [getattr(mesh_shape, a) for a in MESH_AXES]
  text = " ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise ConfigError(f"parallel.mesh_shape {text}: sizes must be > 0, with at most one -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f"parallel.mesh_shape {text}: {num_devices} devices do not divide by "
                        f"the fixed axes' product {known}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(
        f"parallel.mesh_shape {text} needs {math.prod(sizes)} devices, have {num_devices}")
  return tuple(sizes)


def make_mesh(parallel_cfg: ParallelConfig, devices: Sequence[Any] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh of Auto axes (what flax linen partitioning needs); pmap
  mode: every device on the data axis (parallel.mesh_shape is the mesh mode's)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = ((len(devices), 1, 1) if parallel_cfg.mode == "pmap"
           else resolve_mesh_shape(parallel_cfg.mesh_shape, len(devices)))
  auto = (AxisType.Auto,) * len(MESH_AXES)
  try:  # Topology-aware device order on TPU/GPU.
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):  # e.g. a subset of a TPU slice
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=auto)


def memory_bytes() -> int | None:
  """The memory this process's devices hold together (on CPU: the host's RAM), or None."""
  stats = [d.memory_stats() or {} for d in jax.local_devices()]
  if all("bytes_limit" in s for s in stats):
    return sum(int(s["bytes_limit"]) for s in stats)
  if jax.local_devices()[0].platform == "cpu":
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return None


def check_fits(abstract_state: Any, model_cfg: Any) -> None:
  """Raises ConfigError when the train state alone is larger than this process's device memory."""
  leaves = jax.tree.leaves(abstract_state)
  need = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves)
  have = memory_bytes()
  if have is not None and need / max(1, jax.process_count()) > have:
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_state.params))
    raise ConfigError(
        f"model.d_model={model_cfg.d_model}, model.mlp_dim={model_cfg.mlp_dim}: the model has "
        f"{params:,} parameters and its train state needs {need / 2**30:,.1f} GiB, more than the "
        f"{have / 2**30:,.1f} GiB of memory here; make the model smaller")


def _fit_spec(spec: Sequence[Any], shape: Sequence[int], mesh: Mesh) -> P:
  """Drops mesh axes that do not divide their dimension (keeps the longest dividing prefix)."""
  fitted = []
  for dim, axes in zip(shape, list(spec) + [None] * (len(shape) - len(spec))):
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    kept = []
    for a in axes:
      if dim % (math.prod(mesh.shape[k] for k in kept) * mesh.shape[a]):
        break
      kept.append(a)
    fitted.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  while fitted and fitted[-1] is None:
    fitted.pop()
  return P(*fitted)


def _box_sharding(box: Any, mesh: Mesh) -> NamedSharding:
  spec = P()
  if isinstance(box, nn.LogicallyPartitioned):
    spec = nn.logical_to_mesh_axes(box.names, box.rules or LOGICAL_AXIS_RULES)
  return NamedSharding(mesh, _fit_spec(spec, np.shape(box.unbox()), mesh))


def _key_name(k: Any) -> Any:
  return next((getattr(k, a) for a in ("key", "name", "idx") if hasattr(k, a)), str(k))


def _is_box(x: Any) -> bool:
  return isinstance(x, meta.AxisMetadata)


def state_shardings(abstract_state: Any, mesh: Mesh, boxed_params: Any = None,
                    replicated: bool = False) -> Any:
  """A pytree of NamedSharding mirroring the unboxed `abstract_state`, from the flax boxes' logical
  axis names (in the state, or in `boxed_params`). A leaf whose path ends with a param's path and
  has its shape (params, moments, EMAs) gets that param's sharding; the rest is replicated.
  `replicated`: every leaf is (pmap mode)."""
  if replicated:
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract_state, is_leaf=_is_box)
  source = abstract_state if boxed_params is None else boxed_params
  boxed = [(tuple(_key_name(k) for k in path), box) for path, box in
           jax.tree_util.tree_flatten_with_path(source, is_leaf=_is_box)[0] if _is_box(box)]
  # The params root is the longest common prefix of the boxes' paths (never a whole leaf path).
  root = 0
  if boxed:
    paths = [p for p, _ in boxed]
    shortest = min(len(p) for p in paths) - (1 if len(boxed) == 1 else 0)
    while root < shortest and len({p[root] for p in paths}) == 1:
      root += 1
  by_suffix = {p[root:]: (box, _box_sharding(box, mesh)) for p, box in boxed}
  lengths = sorted({len(s) for s in by_suffix}, reverse=True)

  def leaf_sharding(path: Any, x: Any) -> NamedSharding:
    if _is_box(x):
      return _box_sharding(x, mesh)
    names = tuple(_key_name(k) for k in path)
    for n in lengths:
      hit = by_suffix.get(names[len(names) - n:]) if 0 < n <= len(names) else None
      if hit is not None and np.shape(x) == np.shape(hit[0].unbox()):
        return hit[1]
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(leaf_sharding, abstract_state, is_leaf=_is_box)


def shard_batch(local_batch: dict[str, Any], mesh: Mesh, stacked: bool = False
                ) -> dict[str, jax.Array]:
  """This process's rows -> global jax.Arrays split over data*fsdp (single- or multi-host);
  stacked: [steps, batch, ...] arrays (train.steps_per_dispatch), split along their second axis."""
  sharding = NamedSharding(mesh, P(None, BATCH_AXES) if stacked else P(BATCH_AXES))
  shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
  axis = 1 if stacked else 0
  out = {}
  for key, value in local_batch.items():
    if value is None:
      continue
    value = np.asarray(value)
    rows = value.shape[axis] * jax.process_count() if value.ndim > axis else 0
    if rows % shards:
      raise ConfigError(f"batch feature {key!r}: {rows} global rows ({value.shape[axis]} per process) "
                        f"do not split over data*fsdp={shards} devices")
    out[key] = jax.make_array_from_process_local_data(sharding, value)
  return out


def replicate(tree: Any, devices: Sequence[Any]) -> Any:
  """A copy of every leaf on each of `devices`, stacked on a new leading axis (pmap's layout); a
  leaf replicated on the mesh gives the copies it holds, any other is put on each device."""
  sharding = NamedSharding(Mesh(np.asarray(devices, dtype=object), (PMAP_AXIS,)), P(PMAP_AXIS))

  def put(x: Any) -> jax.Array:
    held = {s.device: s.data for s in getattr(x, "addressable_shards", ())
            if s.data.shape == np.shape(x)}
    copies = [(held[d] if d in held else jax.device_put(x, d))[None] for d in devices]
    return jax.make_array_from_single_device_arrays((len(devices),) + np.shape(x), sharding, copies)

  return jax.tree.map(put, tree)


def unreplicate(tree: Any) -> Any:
  """The first copy of each leaf of pmap's layout."""
  return jax.tree.map(lambda x: x[0], tree)


def gather_replicas(tree: Any, mesh: Mesh) -> Any:
  """pmap's layout (a copy per local device on a leading axis) -> arrays replicated on `mesh`,
  as the mesh path holds them."""
  sharding = NamedSharding(mesh, P())
  return jax.tree.map(lambda x: jax.make_array_from_single_device_arrays(
      x.shape[1:], sharding, [s.data[0] for s in x.addressable_shards]), tree)


def split_for_pmap(local_batch: dict[str, Any], n: int) -> dict[str, Any]:
  """[b, ...] numpy arrays -> [n, b / n, ...] for n local devices."""
  out = {}
  for key, value in local_batch.items():
    if value is None:
      continue
    value = np.asarray(value)
    if value.shape[0] % n:
      raise ConfigError(f"batch feature {key!r}: {value.shape[0]} rows per process do not split "
                        f"over {n} local devices (parallel.mode=pmap)")
    out[key] = value.reshape((n, value.shape[0] // n) + value.shape[1:])
  return out


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """A step compiled for one parallel mode, with its data movers. step(state, batch) returns
  (state, metrics) or eval sums, unreplicated in both modes. prepare_state's result may share
  buffers with its input, which a donating step frees; fetch_state undoes prepare_state."""
  step: Callable[[Any, Any], Any]
  prepare_batch: Callable[[Any], dict[str, Any]]
  prepare_state: Callable[[Any], Any]
  fetch_state: Callable[[Any], Any]


def _compile_mesh(step_fn: Callable[..., Any], mesh: Mesh, state_sharding: Any,
                  returns_state: bool, stacked: bool = False) -> CompiledStep:
  """jit over the mesh; stacked: prepare_batch takes a list of K host batches (scan_steps)."""
  rep = NamedSharding(mesh, P())
  batch = NamedSharding(mesh, P(None, BATCH_AXES) if stacked else P(BATCH_AXES))
  jitted = jax.jit(step_fn, in_shardings=(state_sharding, batch),
                   out_shardings=(state_sharding, rep) if returns_state else rep,
                   donate_argnums=(0,) if returns_state else ())

  def step(state: Any, batch: Any) -> Any:
    # The mesh and rules in context let the model's nn.with_logical_constraint take effect.
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_AXIS_RULES):
      return jitted(state, batch)

  def prepare(b: Any) -> dict[str, jax.Array]:
    if stacked:
      b = {k: np.stack([np.asarray(x[k]) for x in b]) for k, v in b[0].items() if v is not None}
    return shard_batch(b, mesh, stacked)

  return CompiledStep(step=step, prepare_batch=prepare,
                      prepare_state=lambda s: jax.device_put(s, state_sharding),
                      fetch_state=lambda s: s)


def _compile_pmap(step_fn: Callable[..., Any], mesh: Mesh, returns_state: bool) -> CompiledStep:
  """pmap over all processes' devices (a global psum), each process feeding its local ones; the
  state goes in as a copy per device and comes back replicated on `mesh`."""
  devices = jax.local_devices()
  fn = (functools.partial(step_fn, axis_name=PMAP_AXIS) if returns_state
        else lambda *args: jax.lax.psum(step_fn(*args), PMAP_AXIS))
  pmapped = jax.pmap(fn, axis_name=PMAP_AXIS, in_axes=(0, 0),
                     donate_argnums=(0,) if returns_state else ())

  def step(state: Any, batch: Any) -> Any:
    out = pmapped(state, batch)  # metrics and sums were psum'ed: every device holds the same
    return (out[0], unreplicate(out[1])) if returns_state else unreplicate(out)

  return CompiledStep(step=step, prepare_batch=lambda b: split_for_pmap(b, len(devices)),
                      prepare_state=lambda s: replicate(s, devices),
                      fetch_state=lambda s: gather_replicas(s, mesh))


def compile_train_step(step_fn: Callable[..., Any], mode: str, mesh: Mesh,
                       state_sharding: Any) -> CompiledStep:
  """Compiles `step_fn(state, batch, axis_name=None) -> (state, metrics)` for `mode`."""
  return (_compile_pmap(step_fn, mesh, returns_state=True) if mode == "pmap"
          else _compile_mesh(step_fn, mesh, state_sharding, returns_state=True))


def compile_multi_step(multi_step_fn: Callable[..., Any], mesh: Mesh, state_sharding: Any
                       ) -> CompiledStep:
  """Compiles steps.scan_steps' `multi_step_fn` over the mesh (mesh mode only)."""
  return _compile_mesh(multi_step_fn, mesh, state_sharding, returns_state=True, stacked=True)


def compile_eval_step(eval_fn: Callable[..., Any], mode: str, mesh: Mesh,
                      state_sharding: Any) -> CompiledStep:
  """Compiles `eval_fn(state, batch) -> pytree of sums`; pmap mode adds up the devices'."""
  return (_compile_pmap(eval_fn, mesh, returns_state=False) if mode == "pmap"
          else _compile_mesh(eval_fn, mesh, state_sharding, returns_state=False))
