"""model.param_dtype=bfloat16: a train step returns the state in the dtypes it took (bfloat16
parameters and moments), so the compiled step runs again on its own output."""

import jax
import jax.numpy as jnp
import numpy as np

from configs import lm
from transformer.config import from_configdict
from transformer.model import models
from transformer.train import optim, steps


def test_bfloat16_parameters_keep_their_dtypes_through_steps():
  cd = lm.get_config("nanogpt_cpu")
  cd.model.update(num_decoder_layers=1, d_model=16, num_heads=2, mlp_dim=32, vocab_size=17,
                  max_len=64, param_dtype="bfloat16", dtype="bfloat16")
  cfg = from_configdict(cd)
  model = models.build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, d_model=cfg.model.d_model)
  batch = {"targets": jnp.asarray(np.random.default_rng(0).integers(1, 17, (2, 8)), jnp.int32)}
  state = steps.create_train_state(cfg, model, jax.random.key(0), batch, tx)
  dtypes = jax.tree.map(lambda x: x.dtype, state)
  assert jax.tree.leaves(state.params)[0].dtype == jnp.bfloat16
  step = jax.jit(steps.make_train_step(cfg, model, tx)).lower(state, batch).compile()
  for _ in range(2):  # a compiled step rejects a state of other dtypes
    state, metrics = step(state, batch)
  assert jax.tree.map(lambda x: x.dtype, state) == dtypes
  assert np.isfinite(float(metrics["loss"]))
