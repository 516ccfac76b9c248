"""The config schema: every key declared once in SCHEMA (default, meaning, allowed values or
range, roles). The default ConfigDict (`get_config`), the typed views and validation
(transformer/config.py), checkpoint compatibility (`with_role`) and docs/config.md (`python -m
transformer.schema > docs/config.md`, checked by a test) all derive from it. Defaults are the base
Transformer of Vaswani et al. (2017); sizes written 0 (role `derived`) are derived."""

import dataclasses
import importlib
from typing import Any, Callable, Mapping

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
}


@dataclasses.dataclass(frozen=True)
class Registry:
  """Allowed values: the names in module.table, imported lazily (that module imports this one)."""
  module: str
  table: str

  def entries(self) -> Mapping[str, Any]:
    return getattr(importlib.import_module(self.module), self.table)


@dataclasses.dataclass(frozen=True)
class Key:
  """One config key, of its default's type; `allowed` values or a RANGES entry `range` limit it."""
  name: str
  default: Any
  meaning: str
  allowed: tuple[Any, ...] | Registry = ()
  range: str = ""
  roles: frozenset[str] = frozenset()

  def choices(self) -> tuple[Any, ...]:
    """The allowed values (empty: any value of the type)."""
    return tuple(self.allowed.entries()) if isinstance(self.allowed, Registry) else self.allowed


def _k(name: str, default: Any, meaning: str, check: tuple[Any, ...] | Registry | str = (),
       roles: tuple[str, ...] = ()) -> Key:
  """A Key; `check` is its allowed values (a tuple or a Registry) or its range (a RANGES key)."""
  range_ = check if isinstance(check, str) else ""
  return Key(name, default, meaning, () if range_ else check, range_, frozenset(roles))


# Role sets, abbreviated for the table.
F, D, E, FT, T = (FIXED,), (FIXED, DERIVED), (EVAL,), (FINETUNE,), (RUN_TOKENIZER,)
FH, FV, EF = F + (HEAD,), F + (VOCAB_HEAD,), E + FT
DTYPES = ("float32", "bfloat16", "float16")

SCHEMA: tuple[Key, ...] = (
    _k("seed", 0, "seed of initialisation, dropout and data order", roles=E),
    _k("peak_flops", 0.0, "FLOP/s per device for MFU; 0 = look the device kind up in a table",
       ">= 0"),
    _k("model.arch", "encoder_decoder", "the architecture (encoder_only: BERT-style)",
       ("encoder_decoder", "decoder_only", "encoder_only"), FH),
    _k("model.vocab_size", 0, "target (or shared) vocabulary; 0 = from the tokenizer", ">= 0", D),
    _k("model.source_vocab_size", 0, "encoder vocabulary; 0 = from the source tokenizer (or "
       "vocab_size)", ">= 0", D),
    _k("model.d_model", 512, "width of the residual stream", "> 0", F),
    _k("model.num_heads", 8, "query heads", "> 0", F),
    _k("model.num_kv_heads", 0, "key/value heads: 0 = num_heads (MHA); 1 = MQA; a divisor of "
       "num_heads = GQA", ">= 0", D),
    _k("model.head_dim", 0, "query/key size per head; 0 = d_model // num_heads (which must then "
       "divide)", ">= 0", D),
    _k("model.v_head_dim", 0, "value size per head; 0 = head_dim", ">= 0", D),
    _k("model.mlp_dim", 2048, "hidden size of the feed-forward layers", "> 0", F),
    _k("model.num_encoder_layers", 6, "encoder blocks", ">= 0", F),
    _k("model.num_decoder_layers", 6, "decoder blocks", ">= 0", F),
    _k("model.positional", "sinusoidal",
       "the positional encoding (transformer/model/positional.py)",
       Registry("transformer.model.positional", "ENCODINGS"), F),
    _k("model.rope_base", 10000.0, "positional=rope: the base of the rotation frequencies", "> 0"),
    _k("model.relative_num_buckets", 32, "positional=relative: T5's buckets", "> 0", F),
    _k("model.relative_max_distance", 128, "positional=relative|shaw: the largest distance told "
       "apart", "> 0", F),
    _k("model.norm", "layernorm", "the norm", Registry("transformer.model.layers", "NORMS"), F),
    _k("model.norm_position", "post", "post (the paper's LayerNorm(x + Sublayer(x))) | pre",
       ("post", "pre"), F),
    _k("model.norm_eps", 1e-6, "the norms' epsilon", "> 0"),
    _k("model.ffn", "relu", "the feed-forward variant (transformer/model/layers.py)",
       Registry("transformer.model.layers", "FFNS"), F),
    _k("model.use_bias", True, "biases in attention projections and the feed-forward layers",
       roles=F),
    _k("model.scale_attention_logits", True, "q.k / sqrt(head_dim); False: unscaled (T5: folded in "
       "its init)", roles=F),
    _k("model.scale_decoder_output", False, "decoder output * d_model**-0.5 before the logits "
       "(original T5)", roles=F),
    _k("model.dropout_rate", 0.1, "dropout of the embeddings and residual branches",
       "in [0, 1]", FT),
    _k("model.attention_dropout_rate", 0.0, "dropout of the attention weights", "in [0, 1]", FT),
    _k("model.ffn_dropout_rate", 0.0, "dropout of the feed-forward hidden layer", "in [0, 1]", FT),
    _k("model.dropout_bits", 8, "random bits per dropout decision: 8 (one threefry word decides "
       "four elements; rates rounded to 1/256) | 32 (Flax's nn.Dropout, bit for bit)", (8, 32), F),
    _k("model.tie_embeddings", True, "output logits from the target embedding matrix", roles=FV),
    _k("model.share_src_tgt_embeddings", True, "one embedding table for encoder and decoder",
       roles=F),
    _k("model.scale_embeddings", True, "multiply embeddings by sqrt(d_model), as in the paper",
       roles=F),
    _k("model.embedding_norm", False, "a norm (model.norm) on the embeddings before the first "
       "layer (BERT)", roles=F),
    _k("model.head_transform", False, "vocabulary logits from Norm(act(Dense(x))) instead of x "
       "(BERT's MLM)", roles=FV),
    _k("model.logits_bias", False, "a learned bias over the vocabulary added to the logits (BERT's "
       "MLM)", roles=FV),
    _k("model.excluded_ids", "", "ids the vocabulary head never predicts (logit -1e30): ids and "
       "ranges, e.g. '0,2-3,54'; set by transformer/convert", roles=FV),
    _k("model.prefix_lm", True, "decoder_only on a seq2seq task: bidirectional attention over the "
       "prefix"),
    _k("model.head", "mlm", "encoder_only: mlm (masked LM, tied per tie_embeddings) | classify | "
       "tag", ("mlm", "classify", "tag"), FH),
    _k("model.pooling", "mean", "head=classify: first (the first token, BOS) | mean (its tokens)",
       ("first", "mean"), FH),
    _k("model.num_classes", 0, "head=classify|tag outputs; 0 = the label tokenizer's vocabulary",
       ">= 0", FH),
    _k("model.attention_impl", "einsum", "einsum | fused (jax.nn.dot_product_attention; cuDNN on "
       "GPU)", Registry("transformer.model.attention", "IMPLEMENTATIONS"), EF),
    _k("model.causal_kernel", False, "decoder self-attention outside decoding and the prefix-LM "
       "passes the fused kernel its own causal flag (segments stay a dense mask)", roles=FT),
    _k("model.scan_layers", False, "nn.scan over layers: compile time flat in depth", roles=F),
    _k("model.remat", "none", "nn.remat policy of each block (dots*: save every matmul)",
       Registry("transformer.model.kernels", "REMAT_POLICIES"), FT),
    _k("model.dtype", "float32", "compute dtype", DTYPES, EF),
    _k("model.param_dtype", "float32", "parameter storage dtype", DTYPES, F),
    _k("model.max_len", 512, "longest sequence: learned/sinusoidal tables and the decoding cache",
       "> 0", F),
    _k("data.dataset", "cmudict_g2p", "a TFDS name (with /config), or text_files | tsv_pairs"),
    _k("data.data_dir", "", "TFDS directory; \"\" = TFDS_DATA_DIR or ~/tensorflow_datasets",
       roles=E),
    _k("data.train_split", "train", "the training split"),
    _k("data.eval_split", "validation", "the split evaluated during training", roles=E),
    _k("data.source_key", "", "source feature of a catalog dataset; \"\" = the builder's default"),
    _k("data.target_key", "", "target feature of a catalog dataset; \"\" = the builder's default"),
    _k("data.train_file", "", "tsv_pairs: WORD<TAB>PH1 PH2 ... (or source<TAB>target) training "
       "file"),
    _k("data.dev_file", "", "tsv_pairs: the development file"),
    _k("data.test_file", "", "tsv_pairs: the test file"),
    _k("data.text_file", "", "text_files: a path or a glob"),
    _k("data.text_split", "fraction", "text_files: fraction (the first train_fraction is train) | "
       "document", ("fraction", "document")),
    _k("data.train_fraction", 0.9, "text_files: the training fraction", "in [0, 1]"),
    _k("data.label_fraction", 1.0, "fraction of the training examples used (a fixed nested subset)",
       "in (0, 1]"),
    _k("data.label", "none", "cmudict_g2p/stress as classification",
       ("none", "primary_stress", "syllables")),
    _k("data.objective", "none", "none | mlm (BERT; encoder_only) | span (T5; encoder_decoder)",
       ("none", "mlm", "span")),
    _k("data.mask_rate", 0.15, "mlm: fraction of each example's tokens selected (80/10/10 "
       "replaced)", "in [0, 1]"),
    _k("data.whole_word_masking", False, "mlm: select whole words (char, byte, sentencepiece, "
       "WordPiece hf)"),
    _k("data.noise_density", 0.15, "span: fraction of tokens corrupted", "in [0, 1]"),
    _k("data.mean_span_length", 3.0, "span: mean length of a corrupted span", ">= 1"),
    _k("data.tokenizer", "symbol", "target (or shared) tokenizer",
       Registry("transformer.data.tokenizers", "TOKENIZERS"), T),
    _k("data.source_tokenizer", "char", "source tokenizer; \"\" = the same as the target",
       Registry("transformer.data.tokenizers", "SOURCE_TOKENIZERS"), T),
    _k("data.spm_model_type", "bpe", "sentencepiece: the model type", ("bpe", "unigram"), T),
    _k("data.spm_vocab_size", 8000, "sentencepiece: the vocabulary size", "> 0", T),
    _k("data.hf_tokenizer", "", "tokenizer=hf: a Hugging Face tokenizer.json (or its directory)",
       roles=T),
    _k("data.hf_id_offset", 4, "our id = HF id + this: 4 (our 0-3 first: GPT-2) | 0 (T5's pad 0, "
       "eos 1 = ours)", (4, 0), T),
    _k("data.max_source_len", 64, "longest source, in tokens", "> 0"),
    _k("data.max_target_len", 64, "longest target, in tokens", "> 0"),
    _k("data.too_long", "drop", "what happens to a longer example", ("drop", "truncate")),
    _k("data.batching", "pack", "pack | bucket | pad", ("pack", "bucket", "pad")),
    _k("data.batch_size", 128, "global, in rows of max_*_len tokens", "> 0", E),
    _k("data.shuffle_seed", 0, "seed of the data order"),
    _k("data.prefetch", 2, "training batches made ahead on a background thread; 0 = in the loop",
       ">= 0"),
    _k("train.num_steps", 100_000, "training steps", "> 0"),
    _k("train.optimizer", "adam", "the optimizer (transformer/train/optim.py)",
       Registry("transformer.train.optim", "OPTIMIZERS"), F),
    _k("train.learning_rate", 1.0, "peak value; for schedule=rsqrt a multiplier of the paper's "
       "formula", "> 0"),
    _k("train.schedule", "rsqrt", "the learning-rate schedule (transformer/train/optim.py)",
       Registry("transformer.train.optim", "SCHEDULES")),
    _k("train.warmup_steps", 4000, "steps of learning-rate warmup", ">= 0"),
    _k("train.min_learning_rate_ratio", 0.0, "end of cosine/linear decay, as a fraction of the "
       "peak", "in [0, 1]"),
    _k("train.b1", 0.9, "Adam's beta1"),
    _k("train.b2", 0.98, "Adam's beta2"),
    _k("train.eps", 1e-9, "Adam's epsilon"),
    _k("train.momentum", 0.9, "sgd: heavy-ball momentum (0 = plain SGD)"),
    _k("train.weight_decay", 0.0, "adam: L2 on the gradient; others: decoupled decay", ">= 0"),
    _k("train.weight_decay_norms_and_biases", False, "decay norm scales and biases too"),
    _k("train.weight_decay_embeddings", False, "decay embeddings too"),
    _k("train.grad_clip", 0.0, "global-norm clipping; 0 = off", ">= 0"),
    _k("train.grad_accum_steps", 1, "micro-batches per update", "> 0"),
    _k("train.steps_per_dispatch", 1, "train steps per host dispatch (one lax.scan); the same "
       "results as 1", "> 0"),
    _k("train.loss_chunk_tokens", 0, "tokens per chunk of a chunked training loss (the output "
       "layer and cross-entropy a chunk at a time, never the whole batch's logits); 0 = off",
       ">= 0"),
    _k("train.members", "", "N runs in one vmapped program, each in <workdir>/<name>: members "
       "split by ';', each key=value overrides of seed, train.learning_rate, train.label_smoothing "
       "and the dropout rates; or seeds:N; '' = one run"),
    _k("train.label_smoothing", 0.1, "label smoothing of the cross-entropy", "in [0, 1)"),
    _k("train.z_loss", 0.0, "weight of log(Z)^2 (PaLM's z-loss)", ">= 0"),
    _k("train.ema_decay", 0.0, "EMA of the parameters, used by evaluation and best-checkpoint "
       "choice; 0 = off", "in [0, 1)", (ON_OFF,)),
    _k("train.scheduled_sampling.schedule", "none", "teacher-forcing schedule (Mihaylova & Martins "
       "2019)", Registry("transformer.train.scheduled_sampling", "SCHEDULES")),
    _k("train.scheduled_sampling.k", 1.0, "linear: start teacher-forcing prob; exponential: base; "
       "inverse_sigmoid: k"),
    _k("train.scheduled_sampling.c", 0.0, "linear: decrease per step"),
    _k("train.scheduled_sampling.min_teacher_forcing", 0.0, "floor of the teacher-forcing "
       "probability", "in [0, 1]"),
    _k("train.early_stop_patience", 0, "evaluations without improvement before stopping; 0 = off",
       ">= 0"),
    _k("train.early_stop_metric", "eval/loss", "the metric early stopping watches"),
    _k("train.early_stop_mode", "min", "min | max", ("min", "max")),
    _k("train.log_every_steps", 50, "steps between logged training metrics", "> 0"),
    _k("train.profile_start_step", 0, "jax.profiler trace of a step range; 0 = off"),
    _k("train.profile_num_steps", 0, "steps traced"),
    _k("eval.every_steps", 1000, "steps between evaluations", "> 0", E),
    _k("eval.num_batches", 0, "teacher-forced batches per evaluation; 0 = the whole split",
       ">= 0", E),
    _k("eval.batch_size", 0, "0 = data.batch_size", ">= 0", E),
    _k("eval.num_decode_examples", 0, "examples decoded per in-training evaluation; 0 = the whole "
       "split", ">= 0", E),
    _k("eval.metrics", "auto", "auto (by task) or a comma list: wer,per,bleu,bpc", roles=E),
    _k("eval.decode.method", "beam", "the decoding method",
       Registry("transformer.infer.decoding", "METHODS"), E),
    _k("eval.decode.beam_size", 4, "beams", "> 0", E),
    _k("eval.decode.length_penalty", 0.6, "GNMT alpha", roles=E),
    _k("eval.decode.temperature", 1.0, "sample: softmax temperature", "> 0", E),
    _k("eval.decode.top_k", 0, "sample: keep the k likeliest; 0 = off", ">= 0", E),
    _k("eval.decode.top_p", 1.0, "sample: nucleus mass; 1.0 = off", "in (0, 1]", E),
    _k("eval.decode.max_decode_len", 0, "0 = data.max_target_len", ">= 0", E),
    _k("checkpoint.every_steps", 1000, "steps between saves", "> 0"),
    _k("checkpoint.keep", 3, "latest checkpoints kept", "> 0"),
    _k("checkpoint.keep_best_by", "eval/loss", "metric of the kept best checkpoint; \"\" = none"),
    _k("checkpoint.best_mode", "min", "min | max", ("min", "max")),
    _k("checkpoint.async_save", True, "save in the background"),
    _k("parallel.mode", "mesh", "mesh (jit over a device mesh) | pmap", ("mesh", "pmap")),
    _k("parallel.mesh_shape.data", -1, "data-parallel axis; -1 = the rest", "> 0 or -1"),
    _k("parallel.mesh_shape.fsdp", 1, "parameter-sharding axis; -1 = the rest", "> 0 or -1"),
    _k("parallel.mesh_shape.tensor", 1, "tensor-parallel axis; -1 = the rest", "> 0 or -1"),
    _k("parallel.distributed", "auto", "jax.distributed.initialize: auto | on | off",
       ("auto", "on", "off")),
    _k("parallel.coordinator_address", "", "multi-process: the coordinator's host:port"),
    _k("parallel.num_processes", 0, "multi-process: the process count; 0 = auto"),
    _k("parallel.process_id", -1, "multi-process: this process; -1 = auto"),
)
KEYS: dict[str, Key] = {k.name: k for k in SCHEMA}


def with_role(role: str, section: str = "") -> tuple[str, ...]:
  """The keys with `role` (within `section`, e.g. 'model', names without the section)."""
  prefix = section + "." if section else ""
  return tuple(k.name[len(prefix):] for k in SCHEMA
               if role in k.roles and k.name.startswith(prefix))


def lookup(tree: Any, key: str) -> Any:
  """The value of dotted `key` in a nested dict or dataclass (None where a part is missing)."""
  for part in key.split("."):
    tree = tree.get(part) if isinstance(tree, Mapping) else getattr(tree, part, None)
    if tree is None:
      return None
  return tree


def get_config() -> ml_collections.ConfigDict:
  """A fresh ConfigDict of every key at its default; every config starts from it."""
  root: dict[str, Any] = {}
  for key in SCHEMA:
    *sections, name = key.name.split(".")
    node = root
    for section in sections:
      node = node.setdefault(section, {})
    node[name] = key.default
  return ml_collections.ConfigDict(root)


def flat_items(cd: Any, prefix: str = "") -> dict[str, Any]:
  """{'model.d_model': 512, ...}: the leaves of a (nested) ConfigDict by dotted key."""
  out = {}
  for key, value in cd.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out |= flat_items(value, f"{prefix}{key}.")
    else:
      out[f"{prefix}{key}"] = value
  return out


def markdown() -> str:
  """The key reference docs/config.md: one table row per key of SCHEMA."""
  lines = ["# Config keys", "",
           "Generated from `transformer/schema.py` by `python -m transformer.schema > "
           "docs/config.md`; every key is declared there once.", "",
           "Roles:", "", *(f"- `{r}`: {meaning}" for r, meaning in ROLES.items()), "",
           "| key | type | default | allowed | roles | meaning |", "|---|---|---|---|---|---|"]
  for k in SCHEMA:
    allowed = (f"a name in `{k.allowed.module}.{k.allowed.table}`"
               if isinstance(k.allowed, Registry)
               else " \\| ".join(repr(o) for o in k.allowed) or k.range)
    roles = ", ".join(r for r in ROLES if r in k.roles)
    lines.append(f"| `{k.name}` | {type(k.default).__name__} | `{k.default!r}` | {allowed} | "
                 f"{roles} | {k.meaning.replace('|', '&#124;')} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(markdown(), end="")
