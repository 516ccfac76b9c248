"""The coordinate check of a parametrization (docs/mup.md): models of growing width train a few
Adam steps on one batch, and before each step the mean absolute value of every layer's output is
measured. Under µP the curves stay flat in width; under the standard parametrization the ones fed
by width-sized sums of updates (the logits first) grow with it.

  python -m transformer.train.coord_check --widths=64,128,256 --parametrization=mup

Layers measured (decoder-only models, one value per block for the block's parts): `embedding`
(the token embedding's output), `attention_logits` (q.k times the logits' scale, every pair),
`attention_output` (after the out projection), `ffn_output`, `residual` (the block's output) and
`logits`.
"""

import argparse
import json
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import Config, from_configdict
from transformer.model import models, parametrization
from transformer.schema import get_config
from transformer.train import optim, steps


def small_config(width: int, parametrization_name: str, base_width: int, *, layers: int = 2,
                 vocab_size: int = 64, length: int = 32, learning_rate: float = 2**-8,
                 seed: int = 0) -> Config:
  """A pre-LN decoder-only model of d_model `width` (4 heads, mlp_dim 4 x width, learned
  positions, tied embeddings) trained by plain Adam at a constant rate: no clip, no decay."""
  c = get_config()
  c.model.update(arch="decoder_only", num_encoder_layers=0, num_decoder_layers=layers,
                 d_model=width, mlp_dim=4 * width, num_heads=4, vocab_size=vocab_size,
                 max_len=length, positional="learned", norm_position="pre", ffn="gelu",
                 use_bias=False, scale_embeddings=False, tie_embeddings=True, dropout_rate=0.0,
                 parametrization=parametrization_name,
                 mup_base_width=base_width if parametrization_name == "mup" else 0)
  c.data.update(max_target_len=length, max_source_len=length)
  c.train.update(optimizer="adam", learning_rate=learning_rate, schedule="constant",
                 warmup_steps=0, grad_clip=0.0, weight_decay=0.0, label_smoothing=0.0)
  c.seed = seed
  return from_configdict(c)


def _mean_abs(x: Any) -> jax.Array:
  return jnp.mean(jnp.abs(jnp.asarray(x, jnp.float32)))


def layer_sizes(cfg: Config, model: Any, params: Any, batch: dict[str, Any]) -> dict[str, Any]:
  """{layer name: mean |output|} of one deterministic forward pass (see the module doc)."""
  m = cfg.model
  logits, state = model.apply({"params": params}, batch["targets"], deterministic=True,
                              capture_intermediates=True, mutable=["intermediates"])
  inter = state["intermediates"]
  out = {"embedding": _mean_abs(inter["token_embed"]["__call__"][0])}
  scale = parametrization.attention_scale(m) or 1.0 / math.sqrt(m.head_dim)
  for i in range(m.num_decoder_layers):
    block = inter["decoder"][f"layers_{i}"]
    qkv = block["self_attention"]["qkv"]["__call__"][0]  # [b, t, 3, n, h]
    qk = jnp.einsum("btnh,bsnh->bnts", qkv[:, :, 0], qkv[:, :, 1],
                    preferred_element_type=jnp.float32) * scale
    out[f"layers_{i}/attention_logits"] = _mean_abs(qk)
    out[f"layers_{i}/attention_output"] = _mean_abs(block["self_attention"]["__call__"][0])
    out[f"layers_{i}/ffn_output"] = _mean_abs(block["ffn"]["__call__"][0])
    out[f"layers_{i}/residual"] = _mean_abs(block["__call__"][0])
  out["logits"] = _mean_abs(logits)
  return out


def run(cfg: Config, batch: dict[str, np.ndarray], num_steps: int) -> list[dict[str, float]]:
  """layer_sizes before each of `num_steps` + 1 Adam steps on `batch` (index t: after t)."""
  model = models.build_model(cfg.model)
  state = steps.create_train_state(cfg, model, jax.random.key(cfg.seed), batch)
  step = jax.jit(steps.make_train_step(cfg, model, optim.make_optimizer(cfg.train, cfg.model)))
  measure = jax.jit(lambda params: layer_sizes(cfg, model, params, batch))
  sizes = [measure(state.params)]
  for _ in range(num_steps):
    state, _ = step(state, batch)
    sizes.append(measure(state.params))
  return [{k: float(v) for k, v in s.items()} for s in sizes]


def check(widths: Sequence[int], parametrization_name: str, batch: dict[str, np.ndarray], *,
          num_steps: int = 5, seeds: Sequence[int] = (0,), **config: Any) -> dict[str, Any]:
  """{width: {layer: [mean |output| at step 0..num_steps], averaged over seeds}} and, per layer,
  the ratio of the widest width's value to the narrowest's at the last step."""
  curves: dict[int, dict[str, list[float]]] = {}
  for width in widths:
    runs = [run(small_config(width, parametrization_name, widths[0], seed=s, **config), batch,
                num_steps) for s in seeds]
    curves[width] = {name: [float(np.mean([r[t][name] for r in runs])) for t in range(num_steps + 1)]
                     for name in runs[0][0]}
  narrow, wide = curves[widths[0]], curves[widths[-1]]
  ratios = {name: wide[name][-1] / narrow[name][-1] for name in narrow}
  return {"curves": curves, "ratios": ratios}


def random_batch(vocab_size: int = 64, batch_size: int = 4, length: int = 32,
                 seed: int = 0) -> dict[str, np.ndarray]:
  """A batch of uniformly random token ids 1..vocab_size-1 (no padding)."""
  rng = np.random.default_rng(seed)
  return {"targets": rng.integers(1, vocab_size, (batch_size, length)).astype(np.int32)}


def main(argv: Sequence[str] | None = None) -> None:
  """Prints the check's ratios (and curves with --curves) as JSON."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--widths", default="64,128,256")
  parser.add_argument("--parametrization", default="mup", choices=("standard", "mup"))
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--curves", action="store_true")
  args = parser.parse_args(argv)
  result = check([int(w) for w in args.widths.split(",")], args.parametrization, random_batch(),
                 num_steps=args.steps)
  print(json.dumps(result if args.curves else result["ratios"], indent=1))


if __name__ == "__main__":
  main()
