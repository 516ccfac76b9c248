"""Many members in one program (`train.members`): N runs that differ only in their seed or in
MEMBER_KEYS hyperparameters, trained by one vmapped train step.

train.members: ';'-separated members of ','-separated key=value overrides (e.g.
"seed=0;train.learning_rate=1e-3,model.dropout_rate=0"), or "seeds:N" (seeds cfg.seed ..). Member
i trains in `<workdir>/<name>` as its plain run would, on the same batches, its state stacked on a
leading axis and its other keys traced (hyper.py): it equals its separate run up to float rounding.
"""

import dataclasses
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp

from transformer.config import Config, ConfigError, from_configdict, to_dict
from transformer.train import hyper, steps

# Keys a member may override, and their types: the seed, and hyper.FIELDS (traced when they
# differ). Anything else would change the program.
MEMBER_KEYS = {"seed": int, "train.learning_rate": float, "train.label_smoothing": float,
               "model.dropout_rate": float, "model.attention_dropout_rate": float,
               "model.ffn_dropout_rate": float, "train.weight_decay": float,
               "train.warmup_steps": int, "train.b1": float, "train.b2": float,
               "train.z_loss": float, "train.grad_clip": float}


@dataclasses.dataclass(frozen=True)
class Member:
  """One member: its name (its workdir under the run's) and its resolved config."""
  name: str
  cfg: Config


def parse(spec: str, seed: int) -> list[dict[str, Any]]:
  """The members' overrides of a train.members string (see the module doc); raises ConfigError."""
  spec = spec.strip()
  if spec.startswith("seeds:"):
    count = spec[len("seeds:"):].strip()
    if not count.isdigit() or int(count) < 2:
      raise ConfigError(f"train.members={spec!r}: seeds:N needs an integer N >= 2")
    return [{"seed": seed + i} for i in range(int(count))]
  members = []
  for i, text in enumerate(part.strip() for part in spec.split(";")):
    where = f"train.members: member {i + 1} ({text!r})"
    overrides: dict[str, Any] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
      key, eq, value = (part.strip() for part in item.partition("="))
      if not eq:
        raise ConfigError(f"{where}: {item!r} is not key=value")
      if key not in MEMBER_KEYS:
        raise ConfigError(f"{where}: {key} cannot differ between members (only "
                          f"{', '.join(MEMBER_KEYS)})")
      if key in overrides:
        raise ConfigError(f"{where}: {key} is given twice")
      kind = MEMBER_KEYS[key]
      try:
        overrides[key] = kind(value)
      except ValueError:
        raise ConfigError(f"{where}: {key}={value!r} is not a {kind.__name__}") from None
    members.append(overrides)
  if len(members) < 2:
    raise ConfigError(f"train.members={spec!r} needs at least 2 members (one run needs no "
                      "train.members)")
  return members


def member_name(overrides: dict[str, Any]) -> str:
  """A member's directory name: its overrides as key=value joined by ',' (filesystem-safe)."""
  text = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                  for k, v in overrides.items()) or "base"
  return re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)


def unsupported(mode: str, early_stop_patience: int) -> str:
  """Why a run with this parallel.mode and train.early_stop_patience cannot train members ('' if
  it can); sweep.py --pack asks it too."""
  if mode != "mesh":
    return f"train.members needs parallel.mode=mesh (got {mode!r})"
  if early_stop_patience:
    return "train.members cannot stop members early: set train.early_stop_patience=0"
  return ""


def members_of(cfg: Config) -> list[Member]:
  """The members of cfg's train.members ([] for ""), each config validated; raises ConfigError."""
  if not cfg.train.members.strip():
    return []
  why = unsupported(cfg.parallel.mode, cfg.train.early_stop_patience)
  if why:
    raise ConfigError(why)
  base = with_values(cfg, {"train.members": ""})
  members: list[Member] = []
  for overrides in parse(cfg.train.members, cfg.seed):
    member = from_configdict(to_dict(with_values(base, overrides)))
    name = member_name(overrides)
    if any(m.name == name for m in members):
      raise ConfigError(f"train.members: two members are named {name!r} (the same overrides)")
    members.append(Member(name, member))
  return members


def with_values(cfg: Config, values: dict[str, Any]) -> Config:
  """cfg with each (dotted) key of `values` set to its value."""
  for key, value in values.items():
    section, _, name = key.rpartition(".")
    if section:  # e.g. train.learning_rate: a new train section
      value = dataclasses.replace(getattr(cfg, section), **{name: value})
    cfg = dataclasses.replace(cfg, **{section or name: value})
  return cfg


def make_train_step(configs: list[Config], train_step: Callable) -> Callable:
  """Returns `step(state, batch) -> (state, metrics [N])`: steps.make_train_step's `train_step`
  (of configs[0]) vmapped over a stacked state and the members' traced values (a Hyper of the
  keys that differ), the batch shared."""
  values = hyper.stacked(configs)

  def step(state: steps.TrainState, batch: dict[str, Any], rng: Any = None,
           axis_name: str | None = None) -> Any:
    if rng is not None or axis_name is not None:
      raise ValueError("a members' train step takes no rng override and no pmap axis")
    return jax.vmap(lambda s, h: train_step(s, batch, hyper=h))(
        state, jax.tree.map(jnp.asarray, values))

  return step
