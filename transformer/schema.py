"""The config schema: every key declared once, as a field of the typed config classes below, with
its default, meaning, allowed values or range, and roles (`cfg.model.d_model` is
`ModelConfig.d_model`: go to its definition to read what it means). SCHEMA (one Key per field,
walked from `Config`), the default ConfigDict (`get_config`), validation (transformer/config.py),
checkpoint compatibility (`with_role`) and docs/config.md (`python -m transformer.schema >
docs/config.md`, checked by a test) all derive from them. Defaults are the base Transformer of
Vaswani et al. (2017); sizes written 0 (role `derived`) are derived.

A named choice's allowed values (model.ffn, train.optimizer, ...) come from transformer/choices.py,
which imports nothing: validation is complete in any process, whatever else is imported. What a
key is (roles, ranges, `key()`, `Key`, ConfigError, the implementations' `Table`) is
transformer/keyspec.py's."""

import dataclasses

import ml_collections

from transformer import choices
from transformer.keyspec import (
    DERIVED, EVAL, FINETUNE, FIXED, HEAD, Key, key, ON_OFF, ROLES, RUN_TOKENIZER, section,
    VOCAB_HEAD, walk)

# Role sets, abbreviated for the declarations.
F, D, E, FT, T = (FIXED,), (FIXED, DERIVED), (EVAL,), (FINETUNE,), (RUN_TOKENIZER,)
FH, FV, EF = F + (HEAD,), F + (VOCAB_HEAD,), E + FT
DTYPES = ("float32", "bfloat16", "float16")

# The config classes: frozen (hashable: jit static arguments); a validated one comes from
# transformer.config.from_configdict, which also fills the sizes written 0.


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model: its architecture, sizes and parts (`cfg.model`)."""
  arch: str = key("encoder_decoder", "the architecture (encoder_only: BERT-style)",
                  ("encoder_decoder", "decoder_only", "encoder_only"), FH)
  vocab_size: int = key(0, "target (or shared) vocabulary; 0 = from the tokenizer", ">= 0", D)
  source_vocab_size: int = key(0, "encoder vocabulary; 0 = from the source tokenizer (or "
                               "vocab_size)", ">= 0", D)
  d_model: int = key(512, "width of the residual stream", "> 0", F)
  num_heads: int = key(8, "query heads", "> 0", F)
  num_kv_heads: int = key(0, "key/value heads: 0 = num_heads (MHA); 1 = MQA; a divisor of "
                          "num_heads = GQA", ">= 0", D)
  head_dim: int = key(0, "query/key size per head; 0 = d_model // num_heads (which must then "
                      "divide)", ">= 0", D)
  v_head_dim: int = key(0, "value size per head; 0 = head_dim", ">= 0", D)
  mlp_dim: int = key(2048, "hidden size of the feed-forward layers", "> 0", F)
  num_encoder_layers: int = key(6, "encoder blocks", ">= 0", F)
  num_decoder_layers: int = key(6, "decoder blocks", ">= 0", F)
  positional: str = key("sinusoidal", "the positional encoding (transformer/model/positional.py)",
                        tuple(choices.POSITIONALS), F)
  rope_base: float = key(10000.0, "positional=rope: the base of the rotation frequencies", "> 0")
  rope_scaling: str = key("none", "positional=rope: frequency scaling: none | linear (every "
                          "frequency / rope_scaling_factor) | llama3 (Llama 3.1's: low "
                          "frequencies / factor, high ones kept, a smooth band between)",
                          ("none", "linear", "llama3"))
  rope_scaling_factor: float = key(8.0, "rope_scaling=linear|llama3: the factor frequencies are "
                                   "divided by", "> 0")
  rope_low_freq_factor: float = key(1.0, "rope_scaling=llama3: wavelengths above "
                                    "rope_original_max_len / this are divided by the factor", "> 0")
  rope_high_freq_factor: float = key(4.0, "rope_scaling=llama3: wavelengths below "
                                     "rope_original_max_len / this are kept", "> 0")
  rope_original_max_len: int = key(8192, "rope_scaling=llama3: the context length the "
                                   "frequencies were trained at", "> 0")
  relative_num_buckets: int = key(32, "positional=relative: T5's buckets", "> 0", F)
  relative_max_distance: int = key(128, "positional=relative|shaw: the largest distance told apart",
                                   "> 0", F)
  norm: str = key("layernorm", "the norm", choices.NORMS, F)
  norm_position: str = key("post", "post (the paper's LayerNorm(x + Sublayer(x))) | pre",
                           ("post", "pre"), F)
  norm_eps: float = key(1e-6, "the norms' epsilon", "> 0")
  ffn: str = key("relu", "the feed-forward variant (transformer/model/layers.py)", tuple(choices.FFNS),
                 F)
  use_bias: bool = key(True, "biases in attention projections and the feed-forward layers", roles=F)
  qkv_bias: bool = key(False, "biases on the query/key/value projections even with use_bias=False "
                       "(Qwen2)", roles=F)
  moe_num_experts: int = key(8, "ffn=moe: routed experts per layer", "> 0", F)
  moe_top_k: int = key(2, "ffn=moe: experts each token is routed to (at most moe_num_experts)",
                       "> 0")
  moe_expert_ffn: str = key("swiglu", "ffn=moe: each expert's feed-forward variant (hidden size "
                            "mlp_dim)", tuple(choices.DENSE_FFNS), F)
  moe_capacity_factor: float = key(1.25, "ffn=moe: each expert takes at most ceil(factor * t * "
                                   "top_k / experts) tokens of a row of t, in position order; "
                                   "the rest pass through the residual; 0 = dropless (grouped "
                                   "matmuls, lax.ragged_dot)", ">= 0")
  moe_renormalize: bool = key(True, "ffn=moe: the top-k gates renormalised to sum to 1 (Mixtral: "
                              "softmax over all experts, top-k, renormalise = softmax over the "
                              "selected logits); False: the top-k softmax probabilities as they "
                              "are (Switch, top-1)")
  moe_num_shared_experts: int = key(0, "ffn=moe: always-on experts (one dense FFN of hidden size "
                                    "this * mlp_dim) added to the routed output", ">= 0", F)
  scale_attention_logits: bool = key(True, "q.k / sqrt(head_dim); False: unscaled (T5: folded in "
                                     "its init)", roles=F)
  scale_decoder_output: bool = key(False, "decoder output * d_model**-0.5 before the logits "
                                   "(original T5)", roles=F)
  parametrization: str = key("standard", "standard | mup: the maximal-update parametrization for "
                            "Adam, relative to mup_base_width (init scales, multipliers, "
                            "per-parameter learning rates: transformer/model/parametrization.py, "
                            "docs/mup.md)", ("standard", "mup"), F)
  mup_base_width: int = key(0, "parametrization=mup: the d_model at which µP equals the standard "
                            "parametrization (the width the learning rate was tuned at)", ">= 0", F)
  mup_base_head_dim: int = key(0, "parametrization=mup: the head_dim at the base width (attention "
                               "logits * sqrt(this) / head_dim); 0 = head_dim * mup_base_width / "
                               "d_model (heads fixed, head_dim grows with the width)", ">= 0", F)
  dropout_rate: float = key(0.1, "dropout of the embeddings and residual branches", "in [0, 1]", FT)
  attention_dropout_rate: float = key(0.0, "dropout of the attention weights", "in [0, 1]", FT)
  ffn_dropout_rate: float = key(0.0, "dropout of the feed-forward hidden layer", "in [0, 1]", FT)
  dropout_bits: int = key(32, "random bits per dropout decision: 32 (Flax's nn.Dropout) | 8 (a "
                          "speed option: one threefry word decides four elements; rates rounded "
                          "to 1/256)", (8, 32), F)
  tie_embeddings: bool = key(True, "output logits from the target embedding matrix", roles=FV)
  share_src_tgt_embeddings: bool = key(True, "one embedding table for encoder and decoder", roles=F)
  scale_embeddings: bool = key(True, "multiply embeddings by sqrt(d_model), as in the paper",
                               roles=F)
  embedding_norm: bool = key(False, "a norm (model.norm) on the embeddings before the first layer "
                             "(BERT)", roles=F)
  head_transform: bool = key(False, "vocabulary logits from Norm(act(Dense(x))) instead of x "
                             "(BERT's MLM)", roles=FV)
  logits_bias: bool = key(False, "a learned bias over the vocabulary added to the logits (BERT's "
                          "MLM)", roles=FV)
  excluded_ids: str = key("", "ids the vocabulary head never predicts (logit -1e30): ids and "
                          "ranges, e.g. '0,2-3,54'; set by transformer/convert", roles=FV)
  start_embedding_id: int = key(0, "the embedding row the decoder's start token 0 reads (0: its "
                                "own; set by transformer/convert to a tied decoder's BOS)", ">= 0", F)
  prefix_lm: bool = key(True, "decoder_only on a seq2seq task: bidirectional attention over the "
                        "prefix")
  head: str = key("mlm", "encoder_only: mlm (masked LM, tied per tie_embeddings) | classify | tag",
                  ("mlm", "classify", "tag"), FH)
  pooling: str = key("mean", "head=classify: first (the first token, BOS) | mean (its tokens) | "
                     "class_token (images: a learned token before the patches, as ViT)",
                     ("first", "mean", "class_token"), FH)
  num_classes: int = key(0, "head=classify|tag outputs; 0 = the label tokenizer's vocabulary",
                         ">= 0", FH)
  # Images (ViT): encoder_only reads an image [b, H, W, C] cut into patches instead of tokens.
  image_size: int = key(0, "encoder_only with head=classify: the side of a square image in "
                        "pixels, read as patches; 0 = token inputs", ">= 0", F)
  image_channels: int = key(3, "image_size > 0: channels per pixel (the last axis)", "> 0", F)
  patch_size: int = key(4, "image_size > 0: the side of a square patch (it must divide "
                        "image_size); a linear map of each flattened patch embeds it", "> 0", F)
  head_bias: bool = key(False, "head=classify|tag: a learned bias on the class logits (ViT)",
                        roles=FH)
  attention_impl: str = key("einsum", "einsum | fused (jax.nn.dot_product_attention; cuDNN on GPU)",
                            choices.ATTENTION_IMPLS, EF)
  sliding_window: int = key(0, "attention to keys fewer than this many positions away: causal, "
                            "the query's own and the W-1 before it (Mistral's; decoding keeps W "
                            "cache slots, a ring); bidirectional, W-1 on each side; 0 = all keys",
                            ">= 0")
  causal_kernel: bool = key(False, "decoder self-attention outside decoding and the prefix-LM "
                            "passes the fused kernel its own causal flag (segments stay a dense "
                            "mask)", roles=FT)
  scan_layers: bool = key(False, "nn.scan over layers: compile time flat in depth", roles=F)
  remat: str = key("none", "nn.remat policy of each block (dots*: save every matmul)",
                   choices.REMAT_POLICIES, FT)
  kernels: str = key("auto", "backend speed paths injected into Flax's layers when the model is "
                     "built (transformer/model/kernels.py): auto (the running backend's; cpu on a "
                     "CPU) | plain (Flax's own maths) | cpu (XLA:CPU's)", choices.KERNELS, EF)
  dtype: str = key("float32", "compute dtype", DTYPES, EF)
  param_dtype: str = key("float32", "parameter storage dtype", DTYPES, F)
  max_len: int = key(512, "longest sequence: learned/sinusoidal tables and the decoding cache",
                     "> 0", F)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The task's data: dataset, tokenizers, lengths and batching (`cfg.data`)."""
  dataset: str = key("cmudict_g2p", "a TFDS name (with /config), or text_files | tsv_pairs")
  data_dir: str = key("", "TFDS directory; \"\" = TFDS_DATA_DIR or ~/tensorflow_datasets", roles=E)
  train_split: str = key("train", "the training split")
  eval_split: str = key("validation", "the split evaluated during training", roles=E)
  source_key: str = key("", "source feature of a catalog dataset; \"\" = the builder's default")
  target_key: str = key("", "target feature of a catalog dataset; \"\" = the builder's default")
  train_file: str = key("", "tsv_pairs: WORD<TAB>PH1 PH2 ... (or source<TAB>target) training file")
  dev_file: str = key("", "tsv_pairs: the development file")
  test_file: str = key("", "tsv_pairs: the test file")
  text_file: str = key("", "text_files: a path or a glob")
  text_split: str = key("fraction", "text_files: fraction (the first train_fraction is train) | "
                        "document", ("fraction", "document"))
  train_fraction: float = key(0.9, "text_files: the training fraction", "in [0, 1]")
  label_fraction: float = key(1.0, "fraction of the training examples used (a fixed nested subset)",
                              "in (0, 1]")
  label: str = key("none", "cmudict_g2p/stress as classification",
                   ("none", "primary_stress", "syllables"))
  objective: str = key("none", "none | mlm (BERT; encoder_only) | span (T5; encoder_decoder)",
                       ("none", "mlm", "span"))
  mask_rate: float = key(0.15, "mlm: fraction of each example's tokens selected (80/10/10 "
                         "replaced)", "in [0, 1]")
  whole_word_masking: bool = key(False, "mlm: select whole words (char, byte, sentencepiece, "
                                 "WordPiece hf)")
  noise_density: float = key(0.15, "span: fraction of tokens corrupted", "in [0, 1]")
  mean_span_length: float = key(3.0, "span: mean length of a corrupted span", ">= 1")
  tokenizer: str = key("symbol", "target (or shared) tokenizer", choices.TOKENIZERS, T)
  source_tokenizer: str = key("char", "source tokenizer; \"\" = the same as the target",
                              choices.SOURCE_TOKENIZERS, T)
  spm_model_type: str = key("bpe", "sentencepiece: the model type", ("bpe", "unigram"), T)
  spm_vocab_size: int = key(8000, "sentencepiece: the vocabulary size", "> 0", T)
  hf_tokenizer: str = key("", "tokenizer=hf: a Hugging Face tokenizer.json (or its directory)",
                          roles=T)
  hf_id_offset: int = key(4, "our id = HF id + this: 4 (our 0-3 first: GPT-2) | 0 (T5's pad 0, eos "
                          "1 = ours)", (4, 0), T)
  max_source_len: int = key(64, "longest source, in tokens", "> 0")
  max_target_len: int = key(64, "longest target, in tokens", "> 0")
  too_long: str = key("drop", "what happens to a longer example", ("drop", "truncate"))
  batching: str = key("pack", "pack | bucket | pad", ("pack", "bucket", "pad"))
  batch_size: int = key(128, "global, in rows of max_*_len tokens", "> 0", E)
  shuffle_seed: int = key(0, "seed of the data order")
  prefetch: int = key(2, "training batches made ahead on a background thread; 0 = in the loop",
                      ">= 0")
  # Images (model.image_size > 0): data.dataset is digits (scikit-learn's, offline) or a TFDS
  # image builder prepared in data_dir; training batches are augmented as below.
  crop_padding: int = key(0, "images: a random crop of the image padded by this many pixels "
                          "each side; 0 = off", ">= 0")
  flip: bool = key(False, "images: random horizontal flips (off for digits: a flipped 2 is no 2)")


@dataclasses.dataclass(frozen=True)
class ScheduledSamplingConfig:
  """Scheduled sampling's teacher-forcing schedule (`cfg.train.scheduled_sampling`)."""
  schedule: str = key("none", "teacher-forcing schedule (Mihaylova & Martins 2019)",
                      choices.SAMPLING_SCHEDULES)
  k: float = key(1.0, "linear: start teacher-forcing prob; exponential: base, in [0, 1]; "
                 "inverse_sigmoid: k, > 0")
  c: float = key(0.0, "linear: decrease per step", ">= 0")
  min_teacher_forcing: float = key(0.0, "floor of the teacher-forcing probability", "in [0, 1]")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The optimizer, schedule, loss and loop of training (`cfg.train`)."""
  num_steps: int = key(100_000, "training steps", "> 0")
  optimizer: str = key("adam", "the optimizer (transformer/train/optim.py)", choices.OPTIMIZERS,
                       F)
  learning_rate: float = key(1.0, "peak value; for schedule=rsqrt a multiplier of the paper's "
                             "formula", "> 0")
  schedule: str = key("rsqrt", "the learning-rate schedule (transformer/train/optim.py)",
                      choices.SCHEDULES)
  warmup_steps: int = key(4000, "steps of learning-rate warmup", ">= 0")
  min_learning_rate_ratio: float = key(0.0, "end of cosine/linear decay, as a fraction of the peak",
                                       "in [0, 1]")
  b1: float = key(0.9, "adam, adamw, lion: beta1", "in [0, 1)")
  b2: float = key(0.98, "adam, adamw, lion: beta2", "in [0, 1)")
  eps: float = key(1e-9, "adam, adamw: epsilon", "> 0")
  momentum: float = key(0.9, "sgd: heavy-ball momentum (0 = plain SGD)", "in [0, 1)")
  weight_decay: float = key(0.0, "adam: L2 on the gradient; others: decoupled decay", ">= 0")
  weight_decay_norms_and_biases: bool = key(False, "decay norm scales and biases too")
  weight_decay_embeddings: bool = key(False, "decay embeddings too")
  grad_clip: float = key(0.0, "global-norm clipping; 0 = off", ">= 0")
  grad_accum_steps: int = key(1, "micro-batches per update", "> 0")
  steps_per_dispatch: int = key(1, "train steps per host dispatch (one lax.scan); the same results "
                                "as 1", "> 0")
  loss_chunk_tokens: int = key(0, "tokens per chunk of a chunked training loss (the output layer "
                               "and cross-entropy a chunk at a time, never the whole batch's "
                               "logits); 0 = off", ">= 0")
  members: str = key("", "N runs in one vmapped program, each in <workdir>/<name>: members split "
                     "by ';', each key=value overrides of seed, train.learning_rate, "
                     "train.label_smoothing, the dropout rates, train.weight_decay, "
                     "train.warmup_steps, train.b1, train.b2, train.z_loss and train.grad_clip; "
                     "or seeds:N; '' = one run")
  label_smoothing: float = key(0.1, "label smoothing of the cross-entropy", "in [0, 1)")
  z_loss: float = key(0.0, "weight of log(Z)^2 (PaLM's z-loss)", ">= 0")
  moe_balance_loss: float = key(0.01, "model.ffn=moe: weight of Switch Transformer's "
                                "load-balancing loss (each layer's experts * sum_e load_e * mean "
                                "router prob_e; 1 when balanced)", ">= 0")
  moe_z_loss: float = key(0.001, "model.ffn=moe: weight of ST-MoE's router z-loss (each layer's "
                          "mean logsumexp(router logits)^2)", ">= 0")
  ema_decay: float = key(0.0, "EMA of the parameters, used by evaluation and best-checkpoint "
                         "choice; 0 = off", "in [0, 1)", (ON_OFF,))
  scheduled_sampling: ScheduledSamplingConfig = section(ScheduledSamplingConfig)
  early_stop_patience: int = key(0, "evaluations without improvement before stopping; 0 = off",
                                 ">= 0")
  early_stop_metric: str = key("eval/loss", "the metric early stopping watches")
  early_stop_mode: str = key("min", "min | max", ("min", "max"))
  log_every_steps: int = key(50, "steps between logged training metrics", "> 0")
  wandb_project: str = key("", "Weights & Biases project that also gets the run's config, "
                           "provenance and metrics (pip install -e '.[wandb]'); \"\" = off")
  wandb_mode: str = key("", "W&B's mode; \"\" = W&B's default (WANDB_MODE, else online)",
                        ("", "online", "offline", "disabled"))
  profile_start_step: int = key(0, "jax.profiler trace of a step range; 0 = off")
  profile_num_steps: int = key(0, "steps traced")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Decoding: the method and its settings (`cfg.eval.decode`)."""
  method: str = key("beam", "the decoding method", choices.DECODE_METHODS, E)
  beam_size: int = key(4, "beams", "in [1, 1024]", E)
  length_penalty: float = key(0.6, "GNMT alpha", roles=E)
  temperature: float = key(1.0, "sample: softmax temperature", "> 0", E)
  top_k: int = key(0, "sample: keep the k likeliest; 0 = off", ">= 0", E)
  top_p: float = key(1.0, "sample: nucleus mass; 1.0 = off", "in (0, 1]", E)
  max_decode_len: int = key(0, "0 = data.max_target_len", ">= 0", E)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Evaluation during training (`cfg.eval`)."""
  every_steps: int = key(1000, "steps between evaluations", "> 0", E)
  num_batches: int = key(0, "teacher-forced batches per evaluation; 0 = the whole split", ">= 0", E)
  batch_size: int = key(0, "0 = data.batch_size", ">= 0", E)
  num_decode_examples: int = key(0, "examples decoded per in-training evaluation; 0 = the whole "
                                 "split", ">= 0", E)
  metrics: str = key("auto", "auto (by task) or a comma list: wer,per,bleu,bpc", roles=E)
  harness_tasks: str = key("", "lm-evaluation-harness tasks (a comma list) scored in evaluations "
                           "as eval/harness/<task>/<metric>; \"\" = none (needs the eval extra)",
                           roles=E)
  harness_every_steps: int = key(0, "harness tasks at the evaluations whose step is a multiple of "
                                 "this (and the last); 0 = every evaluation", ">= 0", E)
  harness_limit: int = key(0, "documents per harness task; 0 = all", ">= 0", E)
  harness_include_path: str = key("", "a directory of the harness's task YAML files "
                                  "(docs/evaluation.md)", roles=E)
  decode: DecodeConfig = section(DecodeConfig)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Checkpoint saving (`cfg.checkpoint`)."""
  every_steps: int = key(1000, "steps between saves", "> 0")
  keep: int = key(3, "latest checkpoints kept", "> 0")
  keep_best_by: str = key("eval/loss", "metric of the kept best checkpoint; \"\" = none")
  best_mode: str = key("min", "min | max", ("min", "max"))
  async_save: bool = key(True, "save in the background")


@dataclasses.dataclass(frozen=True)
class MeshShape:
  """The device mesh's axis sizes (`cfg.parallel.mesh_shape`)."""
  data: int = key(-1, "data-parallel axis; -1 = the rest", "> 0 or -1")
  fsdp: int = key(1, "parameter-sharding axis; -1 = the rest", "> 0 or -1")
  tensor: int = key(1, "tensor-parallel axis; -1 = the rest", "> 0 or -1")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
  """How the program spreads over devices and processes (`cfg.parallel`)."""
  mode: str = key("mesh", "mesh (jit over a device mesh) | pmap", ("mesh", "pmap"))
  mesh_shape: MeshShape = section(MeshShape)
  distributed: str = key("auto", "jax.distributed.initialize: auto | on | off",
                         ("auto", "on", "off"))
  coordinator_address: str = key("", "multi-process: the coordinator's host:port")
  num_processes: int = key(0, "multi-process: the process count; 0 = auto")
  process_id: int = key(-1, "multi-process: this process; -1 = auto")


@dataclasses.dataclass(frozen=True)
class Config:
  """A whole configuration: two top-level keys and a section per part (`cfg`)."""
  seed: int = key(0, "seed of initialisation, dropout and data order", roles=E)
  peak_flops: float = key(0.0, "FLOP/s per device for MFU; 0 = look the device kind up in a table",
                          ">= 0")
  model: ModelConfig = section(ModelConfig)
  data: DataConfig = section(DataConfig)
  train: TrainConfig = section(TrainConfig)
  eval: EvalConfig = section(EvalConfig)
  checkpoint: CheckpointConfig = section(CheckpointConfig)
  parallel: ParallelConfig = section(ParallelConfig)



SCHEMA: tuple[Key, ...] = tuple(walk(Config))
KEYS: dict[str, Key] = {k.name: k for k in SCHEMA}


def with_role(role: str, section_name: str = "") -> tuple[str, ...]:
  """The keys with `role` (within `section_name`, e.g. 'model', names without the section)."""
  prefix = section_name + "." if section_name else ""
  return tuple(k.name[len(prefix):] for k in SCHEMA
               if role in k.roles and k.name.startswith(prefix))


def kept_on_resume() -> tuple[str, ...]:
  """The keys a resumed run must keep: those of role fixed or on_off (the train state's
  structure) and every other model key but those of role eval or finetune, for each changes the
  function the weights compute (the window, the MoE routing, the RoPE frequencies, ...)."""
  free = (EVAL, FINETUNE)
  return tuple(k.name for k in SCHEMA if FIXED in k.roles or ON_OFF in k.roles or (
      k.name.startswith("model.") and not any(r in k.roles for r in free)))


def get_config() -> ml_collections.ConfigDict:
  """A fresh ConfigDict of every key at its default; every config starts from it."""
  return ml_collections.ConfigDict(dataclasses.asdict(Config()))



def markdown() -> str:
  """The key reference docs/config.md: one table row per key of SCHEMA."""
  lines = ["# Config keys", "",
           "Generated from `transformer/schema.py` by `python -m transformer.schema > "
           "docs/config.md`; every key is declared there once.", "",
           "Roles:", "", *(f"- `{r}`: {meaning}" for r, meaning in ROLES.items()), "",
           "| key | type | default | allowed | roles | meaning |", "|---|---|---|---|---|---|"]
  for k in SCHEMA:
    allowed = " \\| ".join(repr(o) for o in k.choices()) or k.range
    roles = ", ".join(r for r in ROLES if r in k.roles)
    lines.append(f"| `{k.name}` | {type(k.default).__name__} | `{k.default!r}` | {allowed} | "
                 f"{roles} | {k.meaning.replace('|', '&#124;')} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(markdown(), end="")
