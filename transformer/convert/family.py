"""The contract of a converted Hugging Face family: a frozen `Family` that each family module
declares as its last statement and the driver (`convert/__init__.py`) reads, field by field.

A family maps both ways: config.json -> our model keys (`model_overrides`, `workdir_config`) and
back (`hf_config`); the state dict -> our parameters (`params_from_hf`) and back
(`hf_from_params`), both usually one weight table read in either direction (common.params_of /
state_of). Import and export hooks are optional fields, None where a family has no such step.
"""

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from transformer.config import Config, ModelConfig, TrainConfig

State = dict[str, np.ndarray]  # a Hugging Face state dict, float32 numpy


class ConvertError(ValueError):
  """A checkpoint or config that cannot be converted; the message is one line naming the key."""


def _any_model(m: ModelConfig) -> bool:
  del m
  return True


@dataclasses.dataclass(frozen=True)
class Family:
  """One Hugging Face family: what it is called, what it reads and writes, and how."""
  name: str  # in messages and descriptions: "GPT-2"
  model_types: tuple[str, ...]  # config.json model_type values it reads
  arch: str  # our model.arch
  id_offset: int  # data.hf_id_offset: our id of Hugging Face id 0
  fixed: Mapping[str, Any]  # our model keys the family fixes: set on import, required on export
  hf_fixed: Mapping[str, Any]  # config.json keys whose other values we lack: required, written
  # config.json (and the weights, or None) -> our model keys; ConvertError names what does not map
  model_overrides: Callable[[dict[str, Any], State | None], dict[str, Any]]
  # (config.json, weights, tokenizer.json path, text file, data dir) -> the converted run's config
  workdir_config: Callable[..., Config]
  # our model config (and the source's config.json, or None) -> config.json
  hf_config: Callable[[ModelConfig, dict[str, Any] | None], dict[str, Any]]
  # (weights, model config, config.json, tokenizer or None) -> our parameters, unrolled layers
  params_from_hf: Callable[..., Any]
  # (parameters, model config, config.json or None) -> the Hugging Face state dict
  hf_from_params: Callable[..., State]
  describe_workdir: Callable[[Config], str]  # the converted workdir, one line
  describe_hf: Callable[[dict[str, Any]], str]  # an exported config.json, one line
  reads_images: bool = False  # its models read images (model.image_size > 0), not tokens
  # Beyond arch and images, which model configs export as this family; the families of one arch
  # are disjoint, so a config has one family.
  exports: Callable[[ModelConfig], bool] = _any_model
  # Tensors of its checkpoints that no parameter of ours reads, by design (regular expressions
  # on the state dict's keys): buffers, tied copies, heads its Hugging Face class drops.
  unused: tuple[str, ...] = ()
  # Import hook: a family without tokenizer.json builds its tokenizer from config.json (ViT).
  label_tokenizer: Callable[[dict[str, Any]], Any] | None = None
  # Export hooks: config.json keys of the run's train config (Mixtral's balance loss) and of
  # the run's tokenizer (ViT's class names).
  hf_training: Callable[[TrainConfig, ModelConfig, dict[str, Any]], dict[str, Any]] | None = None
  hf_tokenizer_keys: Callable[[Any], dict[str, Any]] | None = None
  module: str = ""  # the module that declares it, whose docstring maps every key

  def reads(self, hf: dict[str, Any]) -> bool:
    """Whether config.json dict `hf` is one of this family's."""
    return hf.get("model_type") in self.model_types

  def exports_model(self, m: ModelConfig) -> bool:
    """Whether model config `m` exports as this family."""
    return self.arch == m.arch and self.reads_images == bool(m.image_size) and self.exports(m)
