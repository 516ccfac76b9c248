"""Backend speed paths beside the layers, injected when the model is built (model.kernels, as
MaxText passes its kernels to its layers): the layers are Flax's own (nn.DenseGeneral, nn.Dense,
nn.LayerNorm) and a `Kernels` entry swaps in a drop-in for their maths, the same function
computed another way. PLAIN swaps nothing; 'cpu' holds XLA:CPU work-arounds (docs/performance.md);
on an H100 it runs `:fast`'s step at 0.94x (docs/results/gpu_h100_g2p_step). REMAT_POLICIES
lives here: its dot policies must also save the CPU matmul's named outputs."""

import dataclasses
import functools
import math
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from transformer import keyspec

Array = jax.Array


def _layer_norm_fwd(x, scale, bias, epsilon):
  """nn.LayerNorm's forward, op for op, (x - mean) / sqrt(var + eps) * scale + bias, with float32
  statistics (var = E[x^2] - E[x]^2, clipped at 0); and the backward's residuals."""
  x32 = x.astype(jnp.float32)
  mean, mean2 = x32.mean(-1, keepdims=True), (x32 * x32).mean(-1, keepdims=True)
  rstd = jax.lax.rsqrt(jnp.maximum(0.0, mean2 - mean * mean) + epsilon)
  return (x - mean) * (rstd * scale) + bias, (x, mean, rstd, scale, bias)


def _plain_layer_norm(x: Array, scale: Array, bias: Array, epsilon: float) -> Array:
  return _layer_norm_fwd(x, scale, bias, epsilon)[0]


@jax.custom_vjp
def _matmul(x: Array, kernel: Array) -> Array:
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _matmul_fwd(x: Array, kernel: Array) -> tuple[Array, tuple[Array, Array]]:
  return _matmul(x, kernel), (x, kernel)


def _matmul_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  x, kernel = res
  out = tuple(range(1, kernel.ndim))  # the kernel's output axes
  dx = jax.lax.dot_general(g, kernel, ((tuple(range(x.ndim - 1, g.ndim)), out), ((), ())))
  rows = math.prod(x.shape[:-1])
  # [*out, d] = g^T x over the tokens folded into one axis, then a small transpose to [d, *out].
  dk_t = jax.lax.dot_general(g.reshape(rows, *kernel.shape[1:]), x.reshape(rows, -1),
                             (((0,), (0,)), ((), ())))
  return dx, jnp.moveaxis(dk_t, -1, 0).astype(kernel.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)

# What remat policies save `matmul`'s outputs by: its custom_vjp hides the dot from checkpoint_dots.
MATMUL_NAME = "matmul"


def matmul(x: Array, kernel: Array) -> Array:
  """x [..., d] @ kernel [d, *out] -> [..., *out], `_matmul_bwd`'s gradient, named MATMUL_NAME."""
  return checkpoint_name(_matmul(x, kernel), MATMUL_NAME)


def _wide_out_dot_general(x, kernel, dimension_numbers, precision=None, **kwargs):
  """nn.Dense's dot_general through `matmul` when it is a plain [.., d] x [d, f] product."""
  if (dimension_numbers != (((x.ndim - 1,), (0,)), ((), ())) or precision is not None
      or kwargs or kernel.ndim != 2):
    return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision, **kwargs)
  return matmul(x, kernel)


def unsplit(logical_axes: tuple) -> bool:
  """True unless the active mesh and logical-axis rules split one of these axes over devices."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return True
  entries = [e if isinstance(e, tuple) else (e,) for e in nn.logical_to_mesh_axes(logical_axes)]
  return all(name is None or mesh.shape[name] == 1 for names in entries for name in names)


def _cpu_project(x: Array, kernel: Array, dimension_numbers, precision=None, *,
                 out_axes: tuple) -> Array:
  """nn.DenseGeneral's dot_general for x [b, t, *in] . kernel [*in, *out] (`out_axes`: the
  kernel's output logical axes) as one [b, t, in] x [in, out] `matmul`; output axes a mesh splits
  stay unfolded (no reshard). Any other contraction is lax.dot_general's."""
  (x_axes, k_axes), batch_axes = dimension_numbers
  n_in = len(k_axes)
  if (tuple(x_axes) != tuple(range(2, 2 + n_in)) or tuple(k_axes) != tuple(range(n_in))
      or batch_axes != ((), ()) or precision is not None or x.ndim != 2 + n_in):
    return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision)
  in_shape, out_shape = kernel.shape[:n_in], kernel.shape[n_in:]
  fold_in = math.prod(in_shape)
  out = (math.prod(out_shape),) if unsplit(out_axes) else out_shape
  y = matmul(x.reshape(*x.shape[:2], fold_in), kernel.reshape(fold_in, *out))
  return y.reshape(*x.shape[:2], *out_shape)


def _layer_norm_bwd(epsilon, res, g):
  """dx = rstd (g s - mean(g s) - xhat mean(g s xhat)), with xhat = (x - mean) rstd; the two
  feature means as matrix-vector products with the scale, g @ s and (g xhat) @ s."""
  del epsilon
  x, mean, rstd, scale, bias = res
  g = g.astype(jnp.float32)
  s = scale.astype(jnp.float32)
  xhat = (x.astype(jnp.float32) - mean) * rstd
  gx = g * xhat
  d = x.shape[-1]
  # float32 products (a TPU's default matmul precision would round them to bfloat16).
  matvec = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
  mean_gs = matvec(g, s)[..., None] / d
  mean_gsx = matvec(gx, s)[..., None] / d
  dx = rstd * (g * s - mean_gs - xhat * mean_gsx)
  lead = tuple(range(x.ndim - 1))
  return (dx.astype(x.dtype), jnp.sum(gx, lead).astype(scale.dtype),
          jnp.sum(g, lead).astype(bias.dtype))


_layer_norm = jax.custom_vjp(_plain_layer_norm, nondiff_argnums=(3,))
_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@dataclasses.dataclass(frozen=True)
class Kernels:
  """A backend's drop-ins for Flax's maths (None: Flax's own). `project`: nn.DenseGeneral's
  dot_general for x [b, t, *in] . kernel [*in, *out], told the kernel's output logical axes by
  the keyword `out_axes`; `dense_dot_general`: the widening feed-forward nn.Dense's dot_general;
  `layer_norm(x, scale, bias, epsilon)`: nn.LayerNorm's function (layers.KernelLayerNorm)."""
  project: Optional[Callable[..., Array]] = None
  dense_dot_general: Optional[Callable[..., Array]] = None
  layer_norm: Optional[Callable[[Array, Array, Array, float], Array]] = None


PLAIN = Kernels()
# The backends with speed paths of their own: jax.default_backend() -> its Kernels.
BACKENDS: dict[str, Kernels] = {
    "cpu": Kernels(project=_cpu_project, dense_dot_general=_wide_out_dot_general,
                   layer_norm=_layer_norm)}
# model.kernels' fixed entries ('auto' is `select`'s: the running backend's).
KERNELS: keyspec.Table[Kernels] = keyspec.Table("model.kernels", {"plain": PLAIN, **BACKENDS})


def select(name: str) -> Kernels:
  """model.kernels' Kernels: 'auto' is jax's default backend's (PLAIN where BACKENDS has none),
  'plain' Flax's own maths, a backend's name that backend's speed paths."""
  if name == "auto":
    return BACKENDS.get(jax.default_backend(), PLAIN)
  return KERNELS[name]


_SAVE_MATMULS = jax.checkpoint_policies.save_only_these_names(MATMUL_NAME)
# The remat policies (model.remat): name -> nn.remat's policy ('none': no remat).
REMAT_POLICIES: keyspec.Table[Any] = keyspec.Table("model.remat", {
    "none": None,
    "full": None,  # save nothing: recompute the whole block in the backward pass
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots, _SAVE_MATMULS),
    "dots_no_batch": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims, _SAVE_MATMULS),
})
