"""transformer/choices.py: every named choice declared once, as data, importing nothing. The schema's
allowed values are its names, so validation is complete in a process that imported nothing else;
each implementation table beside the maths holds exactly the declared names."""

import ast
import pathlib
import subprocess
import sys

import pytest

from transformer import choices, config as config_lib, schema
from transformer.data import tokenizers
from transformer.infer import decoding
from transformer.model import attention, kernels, layers, positional
from transformer.train import optim, scheduled_sampling

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each choice key: its declared names and the implementation table keyed by them.
TABLES = {
    "model.ffn": (choices.FFNS, {"moe": None, **layers.FFNS}),
    "model.moe_expert_ffn": (choices.DENSE_FFNS, layers.FFNS),
    "model.positional": (choices.POSITIONALS, positional.ENCODINGS),
    "model.norm": (choices.NORMS, layers.NORMS),
    "model.attention_impl": (choices.ATTENTION_IMPLS, attention.IMPLEMENTATIONS),
    "model.remat": (choices.REMAT_POLICIES, kernels.REMAT_POLICIES),
    "model.kernels": (choices.KERNELS, {"auto": None, **kernels.KERNELS}),
    "data.tokenizer": (choices.TOKENIZERS, tokenizers.TOKENIZERS),
    "data.source_tokenizer": (choices.SOURCE_TOKENIZERS, tokenizers.SOURCE_TOKENIZERS),
    "eval.decode.method": (choices.DECODE_METHODS, decoding.METHODS),
    "train.optimizer": (choices.OPTIMIZERS, optim.OPTIMIZERS),
    "train.schedule": (choices.SCHEDULES, optim.SCHEDULES),
    "train.scheduled_sampling.schedule": (choices.SAMPLING_SCHEDULES, scheduled_sampling.SCHEDULES),
}


@pytest.mark.parametrize("key", list(TABLES))
def test_each_implementation_table_holds_exactly_the_declared_choices(key):
  """The schema allows the declared names, in their order, and the table beside the maths
  implements each of them and no other."""
  declared, table = TABLES[key]
  assert schema.KEYS[key].choices() == tuple(declared)
  assert set(table) == set(declared), key


def test_the_activations_are_those_the_dense_variants_name():
  """layers.ACTIVATIONS implements each activation choices.DENSE_FFNS names, and no other."""
  assert set(layers.ACTIVATIONS) == {f.activation for f in choices.DENSE_FFNS.values()}
  for name, facts in choices.DENSE_FFNS.items():
    assert layers.FFNS[name].gated == facts.gated, name
    assert layers.FFNS[name].activation is layers.ACTIVATIONS[facts.activation], name


def test_the_facts_are_those_of_the_papers():
  """Gated: the GLU variants (Shazeer 2020), T5 v1.1's gated-gelu among them; 'moe' alone is a
  mixture; each encoding's kind is one the model knows."""
  assert {n for n, f in choices.FFNS.items() if f.gated} == {"swiglu", "geglu", "geglu_tanh"}
  assert [n for n, f in choices.FFNS.items() if f.mixture] == ["moe"]
  assert {p.kind for p in choices.POSITIONALS.values()} == {"absolute", "rotary", "bias", "none"}
  assert choices.POSITIONALS["rope"].kind == "rotary" and choices.POSITIONALS["alibi"].kind == "bias"


def test_choices_imports_nothing_but_the_standard_dataclasses():
  """The facts load in any process: no JAX, no other module of the package."""
  tree = ast.parse((ROOT / "transformer" / "choices.py").read_text())
  imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names} | {n.module for n in ast.walk(tree)
                                   if isinstance(n, ast.ImportFrom)}
  assert imported == {"dataclasses"}


@pytest.mark.parametrize("code", [
    "from transformer import config; config.model_config(ffn='bogus')",
    "import transformer; transformer.model_config(ffn='bogus')",
])
def test_validation_is_complete_in_a_fresh_process(code):
  """model_config(ffn='bogus') fails with the one-line error in a process that imported only the
  config (or the notebook API), and no JAX was imported to get there."""
  script = (f"import sys\ntry:\n  {code}\nexcept ValueError as e:\n  print(e)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')))\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.splitlines()
  assert out == ["model.ffn='bogus' is not one of moe|relu|gelu|gelu_tanh|swiglu|geglu|geglu_tanh|"
                 "squared_relu", "[]"]


@pytest.mark.parametrize("key,value", [("model.moe_expert_ffn", "swiglo"),
                                       ("train.optimizer", "adamx"),
                                       ("data.source_tokenizer", "bpe")])
def test_a_table_refuses_an_unknown_name_as_validation_does(key, value):
  """Looking a name up in an implementation table that lacks it raises the same one-line
  ConfigError as validating the config; `in` and `get` answer without raising."""
  table = TABLES[key][1]
  with pytest.raises(config_lib.ConfigError) as at_use:
    table[value]  # pylint: disable=pointless-statement
  with pytest.raises(config_lib.ConfigError) as validated:
    config_lib.from_configdict(_with(key, value))
  assert str(at_use.value) == str(validated.value) and "\n" not in str(at_use.value)
  assert value not in table and table.get(value) is None
  with pytest.raises(config_lib.ConfigError, match=r"^train.optimizer=\['adam'\] is not one of"):
    optim.OPTIMIZERS[["adam"]]  # pylint: disable=pointless-statement


def _with(key: str, value: str):
  """The default config with dotted `key` set to `value`."""
  cd = schema.get_config()
  *path, last = key.split(".")
  section = cd
  for p in path:
    section = section[p]
  section[last] = value
  return cd
