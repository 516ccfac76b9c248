"""What a config key is and how one is declared, looked up and refused: its roles and ranges,
`Key` and the `key()` / `section()` field declarations the typed classes of transformer/schema.py
are written in, `walk` (a class's Keys), the one-line ConfigError, and `Table`, the implementations
of a named choice that refuse a name they lack as validation does. The keys themselves are
declared in schema.py; this module knows none of them."""

import dataclasses
import difflib
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

import ml_collections

# Roles: what a key means to code beyond the model's own.
FIXED, ON_OFF, DERIVED, EVAL = "fixed", "on_off", "derived", "eval"
FINETUNE, RUN_TOKENIZER, HEAD, VOCAB_HEAD = "finetune", "run_tokenizer", "head", "vocab_head"
ROLES = {
    FIXED: "a resumed run must keep the value (parameter or optimizer-state structure)",
    ON_OFF: "a resumed run must keep whether the value is 0 (a part of the train state)",
    DERIVED: "0 = derived from other keys or the tokenizer (not compared on resume)",
    EVAL: "evaluating a trained run may override it",
    FINETUNE: "fine-tuning (--init_from) keeps the new config's value, not the run's",
    RUN_TOKENIZER: "fine-tuning takes the run's value (the ids its embeddings mean)",
    HEAD: "encoder-only fine-tuning: a key of the new head, the new config's value",
    VOCAB_HEAD: "the vocabulary head's: the run's when its masked-LM head is continued",
}

# Ranges, written as the error message words them after "must be".
RANGES: dict[str, Callable[[Any], bool]] = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    ">= 1": lambda v: v >= 1,
    "in [0, 1]": lambda v: 0.0 <= v <= 1.0,
    "in (0, 1]": lambda v: 0.0 < v <= 1.0,
    "in [0, 1)": lambda v: 0.0 <= v < 1.0,
    "> 0 or -1": lambda v: v > 0 or v == -1,
    # Wider beams take minutes to compile and gigabytes of cache for no better output.
    "in [1, 1024]": lambda v: 1 <= v <= 1024,
}


class ConfigError(ValueError):
  """An invalid configuration; the message is one line naming the key."""


@dataclasses.dataclass(frozen=True)
class Key:
  """One config key, of its default's type; `allowed` values or a RANGES entry `range` limit it."""
  name: str
  default: Any
  meaning: str
  allowed: tuple[Any, ...] = ()
  range: str = ""
  roles: frozenset[str] = frozenset()

  def choices(self) -> tuple[Any, ...]:
    """The allowed values (empty: any value of the type)."""
    return self.allowed


def key(default: Any, meaning: str, check: tuple[Any, ...] | str = (),
        roles: tuple[str, ...] = ()) -> Any:
  """A config key as a field of its section's class; `check` is its allowed values (a tuple, or
  choices.py's names) or its range (a RANGES key). The field's metadata carries the rest of its Key."""
  range_ = check if isinstance(check, str) else ""
  return dataclasses.field(default=default, metadata={
      "meaning": meaning, "allowed": () if range_ else check, "range": range_,
      "roles": frozenset(roles)})


def section(cls: type) -> Any:
  """A sub-section field: an instance of its class, at the class's defaults."""
  return dataclasses.field(default_factory=cls)


def walk(cls: type, prefix: str = "") -> Iterator[Key]:
  """The Keys of a config class's fields in declaration order, sub-sections in place."""
  for f in dataclasses.fields(cls):
    if dataclasses.is_dataclass(f.type):
      yield from walk(f.type, f"{prefix}{f.name}.")
      continue
    if f.type is not type(f.default):
      raise TypeError(f"{prefix}{f.name}: annotated {f.type}, default {f.default!r}")
    m = f.metadata
    yield Key(prefix + f.name, f.default, m["meaning"], m["allowed"], m["range"], m["roles"])



V = TypeVar("V")


def one_of_message(name: str, value: Any, options: Any) -> str:
  """`name=value is not one of a|b|c`, with `; did you mean 'b'?` when an option is close."""
  options = list(options)
  shown = "|".join(str(o) if o != "" else repr(o) for o in options)
  close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
  hint = f"; did you mean {options[[str(o) for o in options].index(close[0])]!r}?" if close else ""
  return f"{name}={value!r} is not one of {shown}{hint}"


def not_one_of(name: str, value: Any, options: Any) -> ConfigError:
  """The one-line error of a value of key `name` outside its allowed `options`."""
  return ConfigError(one_of_message(name, value, options))


class Table(Mapping[str, V], Generic[V]):
  """The implementations of config key `name`'s choices (transformer/choices.py): a read-only
  mapping whose lookup of a name it lacks raises the one-line ConfigError validation gives."""

  def __init__(self, name: str, entries: Mapping[str, V]):
    self.name, self._entries = name, dict(entries)

  def __getitem__(self, entry: str) -> V:
    try:
      return self._entries[entry]
    except (KeyError, TypeError):  # TypeError: an unhashable value
      raise not_one_of(self.name, entry, self._entries) from None

  def __contains__(self, entry: object) -> bool:
    try:
      return entry in self._entries
    except TypeError:
      return False

  def get(self, entry: str, default: Any = None) -> Any:
    return self._entries[entry] if entry in self else default

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Table({self.name!r}, {self._entries!r})"


def lookup(tree: Any, name: str) -> Any:
  """The value of dotted key `name` in a nested dict or dataclass (None where a part is missing)."""
  for part in name.split("."):
    tree = tree.get(part) if isinstance(tree, Mapping) else getattr(tree, part, None)
    if tree is None:
      return None
  return tree



def flat_items(cd: Any, prefix: str = "") -> dict[str, Any]:
  """{'model.d_model': 512, ...}: the leaves of a (nested) ConfigDict by dotted key."""
  out = {}
  for name, value in cd.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out |= flat_items(value, f"{prefix}{name}.")
    else:
      out[f"{prefix}{name}"] = value
  return out
