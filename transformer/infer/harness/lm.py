"""`RunLM`: a restored run as the lm-evaluation-harness's language model (`lm_eval.api.model.LM`).

It answers the harness's three request types as its reference `hf` backend does, on our jitted
model: `loglikelihood` (the continuation's summed log-probability and whether it is the greedy
argmax, token for token), `loglikelihood_rolling` (a document in windows of model.max_len, the
harness's `get_rolling_token_windows` rule) and `generate_until` (our KV-cached decoding, cut at
the stop strings). Requests are sorted by length and padded to a few bucket widths (powers of
two), so the scorer compiles once per bucket, not once per request.

Tokens and the BOS rule (docs/evaluation.md): a converted model's text goes through its Hugging
Face tokenizer.json as transformers encodes it (its post-processor: a Llama tokenizer's BOS, a T5
tokenizer's EOS), the ids mapped to ours, and the harness's prefix token (for an empty context
and the first rolling window) is config.json's bos_token_id, else its eos_token_id. A run
trained here conditions every sequence on our decoder's start token (id 0), as training did.
"""

import collections
import dataclasses
import functools
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models import utils as model_utils
import numpy as np

from transformer.config import Config
from transformer.data.tokenizers import EOS_ID
from transformer.infer import evaluation
from transformer.infer.decoding import search_settings
from transformer.model import ensemble, models
from transformer.run.restore import EvaluationError

START_ID = 0  # the decoder's start token (models.shift_right): a run's own BOS
MIN_WIDTH = 16  # the narrowest bucket
log = logging.getLogger(__name__)


def bucket(n: int, cap: int) -> int:
  """The padded width of n tokens: a power of two >= MIN_WIDTH, at most `cap` (>= n)."""
  return max(n, min(cap, max(MIN_WIDTH, 1 << max(0, n - 1).bit_length())))


def _rows_per_batch(tokens: int, width: int, most: int) -> int:
  """Rows of `width` tokens in a batch of about `tokens` tokens: a power of two in [1, most]."""
  rows = max(1, min(most, tokens // max(width, 1)))
  return 1 << (rows.bit_length() - 1)


class RunLM(TemplateLM):
  """A run (one model, or an ensemble: the mean of its members' probabilities) as the harness's
  LM; `hf`: the converted model's config.json (converted_from.json), None for a run of ours;
  `kind`: its task's ('lm' or 'seq2seq')."""

  def __init__(self, config: Config, model: Any, params: Any, source_tokenizer: Any,
               target_tokenizer: Any, hf: dict[str, Any] | None = None, kind: str = "lm",
               batch_tokens: int = 4096, max_rows: int = 64):
    super().__init__()
    arch = config.model.arch
    if arch == "encoder_only":
      raise EvaluationError("the harness scores text with a decoder: this run is "
                            "model.arch='encoder_only' (give a decoder_only or encoder_decoder "
                            "run)")
    self.config, self.model, self.params = config, model, params
    self.backend = "seq2seq" if arch == "encoder_decoder" else "causal"
    # A prefix-LM reads the context bidirectionally, as it read its sources; one trained on plain
    # text (kind 'lm': no prefix in its rows) is causal throughout.
    self.prefix_lm = arch == "decoder_only" and config.model.prefix_lm and kind != "lm"
    self.source_tok = source_tokenizer or target_tokenizer
    self.tok = target_tokenizer
    self.hf = hf if getattr(target_tokenizer, "kind", "") == "hf" else None
    self.batch_tokens, self.max_rows = batch_tokens, max_rows
    self.truncated = 0  # requests cut from the left to fit model.max_len (logged once per call)
    self._places = self._inverse = None
    if self.hf is not None:  # Hugging Face id -> ours (transformer/convert: shifted_ids)
      offset, size = self.tok.offset, self.tok.vocab_size - self.tok.offset
      self._places = np.arange(size) + offset
      if offset and self._hf_id("eos_token_id") is not None:
        self._places[self._hf_id("eos_token_id")] = EOS_ID
      self._inverse = {int(o): h for h, o in enumerate(self._places)}
      prefix = self._inverse.get(self.prefix_token_id)
      prefix_text = self.tok.hf_decode([prefix], False) if prefix is not None else ""
      self._prefix_text = prefix_text or "\0"  # "\0": no text starts with it
    self._scorer = _scorer(model, self.backend, self.prefix_lm)

  # The vocabulary: text <-> our ids, the harness's special ids.

  def _hf_id(self, name: str) -> int | None:
    value = self.hf.get(name)
    value = value[0] if isinstance(value, list) and value else value
    return value if isinstance(value, int) and 0 <= value < len(self._places) else None

  @property
  def eot_token_id(self) -> int:
    """End of text: our EOS (a converted model's end-of-sequence id is mapped to it)."""
    return EOS_ID

  @property
  def prefix_token_id(self) -> int:
    """What an empty context and the first rolling window are conditioned on."""
    if self.hf is None:
      return EOS_ID if self.backend == "seq2seq" else START_ID
    hf_id = self._hf_id("bos_token_id")
    hf_id = hf_id if hf_id is not None else self._hf_id("eos_token_id")
    return START_ID if hf_id is None else int(self._places[hf_id])  # none: our start token

  @property
  def max_length(self) -> int:
    """The model's window: model.max_len tokens."""
    return self.config.model.max_len

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
    """Our ids of `string`; special tokens as the tokenizer adds them (a run of ours: the start
    token first; a seq2seq run's encoder input: the source tokenizer's ids, EOS last), unless
    add_special_tokens is False."""
    del kwargs
    if self.hf is not None:
      if add_special_tokens is None:  # the harness's rule: a text that starts with BOS keeps it
        add_special_tokens = not string.startswith(self._prefix_text)
      return [int(self._places[i]) for i in self.tok.hf_encode(string, add_special_tokens)]
    special = add_special_tokens is not False
    if self.backend == "seq2seq":  # with specials an encoder input (the harness's context), else
      # a decoder target (its continuation): each in its own vocabulary
      return list(self.source_tok.encode(string)) + [EOS_ID] if special else list(
          self.tok.encode(string))
    return ([START_ID] if special else []) + list(self.tok.encode(string))

  def tok_decode(self, ids: Sequence[int]) -> str:
    """The text of our ids (a converted model's: as transformers decodes, specials skipped)."""
    if self.hf is not None:
      return self.tok.hf_decode([self._inverse[int(i)] for i in ids if int(i) in self._inverse])
    return self.tok.decode(ids)

  # Scoring: jitted per bucket shape (_scorer).

  def _rows(self, requests: Sequence[tuple[Any, list[int], list[int]]]) -> list[dict[str, Any]]:
    """One scoring row per (key, context ids, continuation ids), cut as the `hf` backend cuts."""
    rows, cap = [], self.max_length
    for _, context, continuation in requests:
      if self.backend == "seq2seq":
        self.truncated += len(context) > cap or len(continuation) > cap
        rows.append(dict(inputs=context[-cap:], targets=continuation[-cap:],
                         count=len(continuation[-cap:])))
        continue
      whole = context + continuation
      self.truncated += len(whole) > cap + 1
      whole = whole[-(cap + 1):]
      rows.append(dict(tokens=whole[:-1], targets=whole[1:], count=len(continuation),
                       prefix=max(0, len(whole) - len(continuation))))
    return rows

  def _batch(self, rows: list[dict[str, Any]], widths: dict[str, int], b: int) -> list[np.ndarray]:
    """The scorer's arrays for `rows`, padded to `widths` and `b` rows."""
    names = ("tokens", "targets") if self.backend == "causal" else ("inputs", "targets")
    arrays = {k: np.zeros((b, widths[k]), np.int32) for k in names}
    for r, row in enumerate(rows):
      for k in names:
        arrays[k][r, :len(row[k])] = row[k]
    if self.backend == "seq2seq":
      return [arrays["inputs"], arrays["targets"]]
    lengths = np.zeros(b, np.int32)
    lengths[:len(rows)] = [len(row["tokens"]) for row in rows]
    prefix = np.zeros(b, np.int32)
    prefix[:len(rows)] = [row["prefix"] for row in rows]
    return [arrays["tokens"], arrays["targets"], lengths, prefix]

  def _loglikelihood_tokens(self, requests: Sequence[tuple[Any, list[int], list[int]]],
                            disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
    """(log p(continuation | context), greedy) of each request, in the harness's order."""
    del disable_tqdm, kwargs
    rows = self._rows(requests)
    keys = ("tokens",) if self.backend == "causal" else ("inputs", "targets")
    groups = collections.defaultdict(list)
    for i in sorted(range(len(rows)), key=lambda i: -len(rows[i]["targets"])):
      groups[tuple(bucket(len(rows[i][k]), self.max_length) for k in keys)].append(i)
    out: list[Any] = [None] * len(rows)
    for shape, members in groups.items():
      widths = dict(zip(keys, shape))
      widths.setdefault("targets", widths.get("tokens", 0))
      per_batch = _rows_per_batch(self.batch_tokens, sum(shape), self.max_rows)
      b = min(per_batch, 1 << (len(members) - 1).bit_length())  # one shape per bucket: one compile
      for start in range(0, len(members), b):
        chunk = members[start:start + b]
        logp, greedy = jax.device_get(self._scorer(self.params, *self._batch(
            [rows[i] for i in chunk], widths, b)))
        for r, i in enumerate(chunk):
          n, c = len(rows[i]["targets"]), rows[i]["count"]
          out[i] = (float(np.sum(logp[r, n - c:n], dtype=np.float64)),
                    bool(greedy[r, n - c:n].all()))
    self._say_truncated()
    return out

  def _say_truncated(self) -> None:
    if self.truncated:
      log.warning("%d requests are longer than model.max_len=%d: truncated from the left as the "
                  "harness does", self.truncated, self.max_length)
      self.truncated = 0

  def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False
                            ) -> list[float]:
    """log p(document) of each request's text, scored in disjoint windows of model.max_len."""
    windows, owner = [], []
    for i, request in enumerate(requests):
      (text,) = request.args
      tokens = self.tok_encode(text) if self.hf is not None else self.tok_encode(text, False)
      for context, target in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
          token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
          context_len=1)):
        windows.append((None, context, target))
        owner.append(i)
    totals = [0.0] * len(requests)
    for i, (logp, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
      totals[i] += logp
    return totals

  def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
    """Each request's generation (greedy, or sampled as its gen_kwargs say), cut at `until`."""
    del disable_tqdm
    out: list[Any] = [None] * len(requests)
    groups = collections.defaultdict(list)
    for i, request in enumerate(requests):
      groups[repr(sorted(request.args[1].items()))].append(i)
    for members in groups.values():
      kwargs = model_utils.normalize_gen_kwargs(dict(requests[members[0]].args[1]), 256)
      texts = self._generate([requests[i].args[0] for i in members], kwargs)
      for i, text in zip(members, texts):
        out[i] = text
    self._say_truncated()
    return out

  def _generate(self, contexts: list[str], kwargs: dict[str, Any]) -> list[str]:
    """Generations of `contexts` with one set of normalized gen_kwargs, in bucketed batches. A
    seq2seq model runs to len(context) + max_gen_toks - 1 tokens, as the harness's seq2seq path
    does (its generate max_length counts the context; at batch size 1, the context's own)."""
    until = model_utils.handle_stop_sequences(kwargs.pop("until", None),
                                              eos=self.tok_decode([self.eot_token_id]))
    steps = int(kwargs.pop("max_gen_toks"))
    own_start = self.hf is None and self.backend == "causal"  # decoding puts our start token
    room = self.max_length - (steps if self.backend == "causal" else 0)
    if room < 1:
      raise EvaluationError(f"max_gen_toks={steps} leaves no room for a context within "
                            f"model.max_len={self.max_length}")
    ids = []
    for context in contexts:
      encoded = self.tok_encode(context, False if own_start else None)
      self.truncated += len(encoded) > room
      ids.append(encoded[-room:])
    limits = [steps if self.backend == "causal" else min(len(i) + steps - 1, self.max_length)
              for i in ids]
    texts: list[Any] = [None] * len(ids)
    groups = collections.defaultdict(list)
    for i in sorted(range(len(ids)), key=lambda i: -len(ids[i])):
      groups[bucket(len(ids[i]), room)].append(i)
    for width, members in groups.items():
      most = max(limits[i] for i in members)
      per_batch = _rows_per_batch(self.batch_tokens, width + most, self.max_rows)
      tokens, _ = evaluation.decode_batches(
          self.config, self.model, self.params, [ids[i] for i in members],
          self._decode_config(kwargs, most), eos_id=EOS_ID,
          batch_size=min(per_batch, 1 << (len(members) - 1).bit_length()),
          rng=jax.random.key(self.config.seed), prefix_lm=self.prefix_lm if
          self.backend == "causal" else None, start_token=own_start, width=width)
      for i, t in zip(members, tokens):
        texts[i] = model_utils.postprocess_generated_text(self.tok_decode(t[:limits[i]]), until,
                                                          None)
    return texts

  def _decode_config(self, kwargs: dict[str, Any], steps: int) -> Any:
    """eval.decode for the gen_kwargs: greedy, or sampling at their temperature/top_k/top_p."""
    sample = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature") or 0) > 0
    cfg = dataclasses.replace(
        self.config.eval.decode, method="sample" if sample else "greedy", max_decode_len=steps,
        **({"temperature": float(kwargs["temperature"]), "top_k": int(kwargs.get("top_k") or 0),
            "top_p": float(kwargs.get("top_p") or 1.0)} if sample else {}))
    search_settings(cfg, self.config.model.vocab_size, self.config.model.max_len)
    return cfg


@functools.lru_cache(maxsize=16)
def _scorer(model: Any, backend: str, prefix_lm: bool) -> Any:
  """The jitted scorer of a model (a tuple: an ensemble), shared by every RunLM of it, so each
  bucket shape compiles once per process (in training: once, not at every evaluation)."""
  if backend == "causal":
    return jax.jit(functools.partial(_decoder_scores, model, prefix_lm))
  return jax.jit(functools.partial(_encoder_decoder_scores, model))


def _decoder_scores(model: Any, prefix_lm: bool, params: Any, tokens: jax.Array,
                    targets: jax.Array, lengths: jax.Array, prefix_lengths: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
  """(log p(target) [b, t], target == argmax [b, t]) of decoder inputs `tokens` [b, t]."""
  where = jnp.arange(tokens.shape[1])[None, :]
  segments = (where < lengths[:, None]).astype(jnp.int32)
  prefix = (where < prefix_lengths[:, None]) if prefix_lm else None
  positions = jnp.broadcast_to(where, tokens.shape)
  members, trees = ensemble.members(model, params)
  logits = ensemble.log_mean_probs([m.apply(
      {"params": p}, tokens, decoder_positions=positions, decoder_segment_ids=segments,
      decoder_prefix_mask=prefix, method="decode") for m, p in zip(members, trees)])
  return _picked(logits, targets)


def _encoder_decoder_scores(model: Any, params: Any, inputs: jax.Array, targets: jax.Array
                            ) -> tuple[jax.Array, jax.Array]:
  """As _decoder_scores, of encoder inputs [b, s] and decoder targets [b, t] (shifted inside)."""
  members, trees = ensemble.members(model, params)
  logits = ensemble.log_mean_probs([models.batch_logits(m, p, {"inputs": inputs,
                                                               "targets": targets})
                                    for m, p in zip(members, trees)])
  return _picked(logits, targets)


def _picked(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(log-softmax at `targets`, whether each target is the argmax) of logits [b, t, v]."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return picked, jnp.argmax(logits, axis=-1) == targets
