"""Every named choice of the config and the facts the code asks of it, as data: the allowed values
of model.ffn, model.positional, train.optimizer, ... and, where code asks, what a choice is (a
feed-forward's gating and activation, an encoding's kind). This module imports nothing, so the
schema (transformer/schema.py) validates a config completely in any process before any maths is
imported, and the counters (FLOPs, converters) read the same facts as the model.

The implementations sit beside the maths, in tables keyed by these names (transformer/model/
layers.py's ACTIVATIONS and NORMS, positional.py's ENCODINGS, attention.py's IMPLEMENTATIONS,
kernels.py's REMAT_POLICIES and KERNELS, data/tokenizers.py's TOKENIZERS, infer/decoding.py's
METHODS, train/optim.py's OPTIMIZERS and SCHEDULES, train/scheduled_sampling.py's SCHEDULES); a
test holds each table's names equal to its choices here. A new choice: its facts here, its function there."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class FeedForward:
  """A feed-forward variant. Dense: W2 act(W1 x), or `gated` W2 (act(Wg x) * Wu x) (three
  matrices); `activation` names the function (layers.ACTIVATIONS). A `mixture` routes each token to
  experts of the dense variant model.moe_expert_ffn (transformer/model/moe.py): no activation."""
  activation: str = ""
  gated: bool = False
  mixture: bool = False


# model.moe_expert_ffn: the dense variants.
DENSE_FFNS: dict[str, FeedForward] = {
    "relu": FeedForward("relu"),
    "gelu": FeedForward("gelu"),  # the exact (erf) GELU
    "gelu_tanh": FeedForward("gelu_tanh"),  # GPT-2's "gelu_new"
    "swiglu": FeedForward("silu", gated=True),
    "geglu": FeedForward("gelu", gated=True),
    "geglu_tanh": FeedForward("gelu_tanh", gated=True),  # T5 v1.1 / Flan-T5's "gated-gelu"
    "squared_relu": FeedForward("squared_relu"),  # Primer (So et al. 2021)
}
# model.ffn: a mixture of experts and the dense variants.
FFNS: dict[str, FeedForward] = {"moe": FeedForward(mixture=True), **DENSE_FFNS}


@dataclasses.dataclass(frozen=True)
class Positional:
  """A positional encoding; `kind` says where it enters the model (transformer/model/positional.py):
  'absolute' added to the embeddings, 'bias' added to the attention logits, 'rotary' rotating
  queries and keys, 'none' nothing (the causal mask alone carries order)."""
  kind: str


# model.positional.
POSITIONALS: dict[str, Positional] = {
    "sinusoidal": Positional("absolute"),
    "learned": Positional("absolute"),
    "rope": Positional("rotary"),
    "relative": Positional("bias"),  # T5's bucketed relative bias
    "alibi": Positional("bias"),
    "none": Positional("none"),
    "shaw": Positional("bias"),  # Shaw et al. 2018, as T5 simplified it
    "sincos2d": Positional("absolute"),  # images: ViT's 2-D sin-cos of the patch grid
}

NORMS = ("layernorm", "rmsnorm")  # model.norm
ATTENTION_IMPLS = ("einsum", "fused")  # model.attention_impl
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")  # model.remat
KERNELS = ("auto", "plain", "cpu")  # model.kernels
TOKENIZERS = ("char", "byte", "symbol", "sentencepiece", "hf")  # data.tokenizer
SOURCE_TOKENIZERS = ("", *TOKENIZERS)  # data.source_tokenizer ("": the target's own)
DECODE_METHODS = ("greedy", "sample", "beam")  # eval.decode.method
OPTIMIZERS = ("adam", "adamw", "adafactor", "sgd", "lion")  # train.optimizer
SCHEDULES = ("rsqrt", "warmup_cosine", "warmup_linear", "constant")  # train.schedule
# train.scheduled_sampling.schedule
SAMPLING_SCHEDULES = ("none", "linear", "exponential", "inverse_sigmoid")
