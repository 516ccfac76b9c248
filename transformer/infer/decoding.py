"""Autoregressive decoding: greedy, temperature/top-k/top-p sampling, beam search over `kv_cache`.

`sample_search` and `beam_search` run a pure `step_fn(tokens [B], cache, j) -> (logits [B, V],
cache)` (feed token j, get the logits of token j+1); `generate` wires models in through `prefill`.
Token 0 (the start) is never generated; scores are log-probabilities of the unmodified model.
"""

from collections.abc import Callable
import functools
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from transformer import keyspec
from transformer.config import check_value, ConfigError
from transformer.model import ensemble, kv_cache, models

StepFn = Callable[[jnp.ndarray, Any, jnp.ndarray], tuple[jnp.ndarray, Any]]
ReorderFn = Callable[[Any, jnp.ndarray], Any]
NEG_INF = -1e30  # finite so that (NEG_INF - NEG_INF) never makes NaNs
PAD_ID = 0
_BLOCK = 128  # logits per block in `top_k_log_probs`


class Search(NamedTuple):
  """The decoding settings that change the compiled program (part of the jit cache key)."""
  method: str = "greedy"  # greedy | sample | beam
  beam_size: int = 1
  length_penalty: float = 0.0  # GNMT alpha
  temperature: float = 1.0
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1.0 = off


# The decoding methods (eval.decode.method): name -> its Search from the eval.decode section.
METHODS: keyspec.Table[Callable[[Any], Search]] = keyspec.Table("eval.decode.method", {
    "greedy": lambda d: Search("greedy"),
    "sample": lambda d: Search("sample", temperature=float(d.temperature), top_k=int(d.top_k),
                               top_p=float(d.top_p)),
    "beam": lambda d: Search("beam", beam_size=int(d.beam_size),
                             length_penalty=float(d.length_penalty)),
})


def search_settings(decode_cfg: Any, vocab_size: int = 0, max_len: int = 0) -> Search:
  """eval.decode checked as the config is (the schema's ranges), against the vocabulary and
  max_len too (0 = unknown), as a Search: one-line ConfigErrors (ValueErrors)."""
  d = decode_cfg
  for name in Search._fields:
    check_value(f"eval.decode.{name}", getattr(d, name))
  if d.max_decode_len < 0 or (max_len and d.max_decode_len > max_len):
    raise ConfigError(f"eval.decode.max_decode_len={d.max_decode_len} must be in [0, "
                      f"model.max_len={max_len or '?'}] (0 = data.max_target_len)")
  if d.method == "beam" and vocab_size and d.beam_size > vocab_size:  # the schema bounds it too
    raise ConfigError(f"eval.decode.beam_size={d.beam_size} must be in [1, {vocab_size}] (at "
                      f"most the vocabulary size {vocab_size})")
  return METHODS[d.method](d)


def filter_logits(logits: jnp.ndarray, temperature: float, top_k: int, top_p: float) -> jnp.ndarray:
  """Scales logits [..., v] by 1/temperature, then keeps the top-k, then the top-p nucleus."""
  logits = logits.astype(jnp.float32) / temperature
  if 0 < top_k < logits.shape[-1]:
    kth = lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # A token is in the nucleus if the mass strictly before it is < p (so the top token always is).
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.where(mass_before < top_p, sorted_logits, jnp.inf)
    threshold = jnp.min(kept, axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, NEG_INF, logits)
  return logits


def _choose(logits: jnp.ndarray, key: jnp.ndarray, search: Search) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Next token [B] (never PAD_ID) and its log-probability under the unmodified model."""
  logits = logits.astype(jnp.float32)
  allowed = logits.at[:, PAD_ID].set(NEG_INF)
  if search.method == "greedy":
    tokens = jnp.argmax(allowed, axis=-1)
  else:
    filtered = filter_logits(allowed, search.temperature, search.top_k, search.top_p)
    tokens = jax.random.categorical(key, filtered, axis=-1)
  chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
  return tokens.astype(jnp.int32), chosen - jax.nn.logsumexp(logits, axis=-1)


def sample_search(step_fn: StepFn, first_logits: jnp.ndarray, cache: Any, *, search: Search,
                  eos_id: int, max_len: int, rng: jnp.ndarray | None = None
                  ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Greedy or sampled decoding: (tokens [b, max_len], summed log-probs [b], EOS included)."""
  b = first_logits.shape[0]
  rng = jax.random.key(0) if rng is None else rng

  def update(state, logits):
    i, seqs, done, scores, cache = state
    tokens, log_probs = _choose(logits, jax.random.fold_in(rng, i), search)
    tokens = jnp.where(done, 0, tokens)
    seqs = lax.dynamic_update_slice(seqs, tokens[:, None], (0, i))
    scores = scores + jnp.where(done, 0.0, log_probs)
    return i + 1, seqs, done | (tokens == eos_id), scores, cache

  def cond(state):
    i, _, done, _, _ = state
    return (i < max_len) & ~jnp.all(done)

  def body(state):
    i, seqs, done, scores, cache = state
    logits, cache = step_fn(seqs[:, i - 1], cache, i - 1)
    return update((i, seqs, done, scores, cache), logits)

  state = (jnp.int32(0), jnp.zeros((b, max_len), jnp.int32), jnp.zeros((b,), bool),
           jnp.zeros((b,), jnp.float32), cache)
  state = lax.while_loop(cond, body, update(state, first_logits))
  return state[1], state[3]


def length_penalty(length: jnp.ndarray, alpha: float) -> jnp.ndarray:
  """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016); 1 when alpha is 0."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def top_k_log_probs(logits: jnp.ndarray, k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """lax.top_k(jax.nn.log_softmax(logits), k) for logits [B, V], ties included, in two reads: the
  k largest lie in the k blocks of 128 with the largest maxima, searched in vocabulary order (ties
  go to the lowest id, as in lax.top_k)."""
  logits = logits.astype(jnp.float32)
  rows, vocab = logits.shape
  num_blocks, rest = divmod(vocab, _BLOCK)
  if num_blocks <= 4 * k:  # small vocabulary: nothing to gain
    values, tokens = lax.top_k(logits, k)
    return values - jax.nn.logsumexp(logits, axis=-1, keepdims=True), tokens
  blocks = logits[:, :num_blocks * _BLOCK].reshape(rows, num_blocks, _BLOCK)
  if rest:  # the last, partial block: padded with -inf (it is small)
    tail = jnp.pad(logits[:, num_blocks * _BLOCK:], ((0, 0), (0, _BLOCK - rest)),
                   constant_values=-jnp.inf)[:, None]  # [B, 1, block]
    block_max = jnp.concatenate([jnp.max(blocks, axis=-1), jnp.max(tail, axis=-1)], axis=1)
  else:
    block_max = jnp.max(blocks, axis=-1)  # [B, blocks]
  top_blocks = jnp.sort(lax.top_k(block_max, k)[1], axis=-1)  # [B, k], in vocabulary order
  candidates = jnp.take_along_axis(blocks, jnp.minimum(top_blocks, num_blocks - 1)[:, :, None],
                                   axis=1, mode="clip")  # [B, k, block]
  if rest:
    candidates = jnp.where((top_blocks == num_blocks)[:, :, None], tail, candidates)
  values, index = lax.top_k(candidates.reshape(rows, k * _BLOCK), k)
  tokens = jnp.take_along_axis(top_blocks, index // _BLOCK, axis=1) * _BLOCK + index % _BLOCK
  row_max = jnp.max(block_max, axis=-1, keepdims=True)
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)  # all -inf rows: as logsumexp does
  lse = jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1, keepdims=True)) + row_max
  return values - lse, tokens.astype(jnp.int32)


def _gather_beams(x: jnp.ndarray, indices: jnp.ndarray) -> jnp.ndarray:
  """x [b, m, ...], indices [b, k] -> [b, k, ...]."""
  return jax.vmap(lambda row, idx: row[idx])(x, indices)


class _Beams(NamedTuple):
  i: jnp.ndarray          # [] index of the token being chosen
  alive_seqs: jnp.ndarray  # [b, k, L]
  alive_logp: jnp.ndarray  # [b, k] summed log-probs
  fin_seqs: jnp.ndarray   # [b, k, L]
  fin_scores: jnp.ndarray  # [b, k] length-penalised, best first
  cache: Any              # for b*k query rows (tile_fn's layout)


def beam_search(step_fn: StepFn, first_logits: jnp.ndarray, cache: Any, *, beam_size: int,
                alpha: float, eos_id: int, max_len: int, reorder_fn: ReorderFn = kv_cache.reorder,
                return_all_beams: bool = False, tile_fn: Callable[[Any, int], Any] | None = None
                ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Beam search scoring a hypothesis logp / length_penalty(len incl. EOS): the best (tokens
  [b, L], scores [b]), or all k ([b, k, L], [b, k]). first_logits and `cache` have b rows;
  step_fn runs on b*k rows with the cache tile_fn(cache, k) makes (default: rows repeated)."""
  b, vocab = first_logits.shape
  k, L = beam_size, max_len
  # The 2k best continuations are among each beam's 2k+1 best tokens (one may be pad): no
  # [b, k * vocab] array of candidates per step.
  per_beam = min(2 * k + 1, vocab)
  num_candidates = min(2 * k, k * per_beam)  # 2k: at most k of them end in EOS, k stay alive
  offsets = (jnp.arange(b) * k)[:, None]

  def update(state: _Beams, logits: jnp.ndarray) -> _Beams:
    i = state.i
    log_probs, best_tokens = top_k_log_probs(logits, per_beam)  # [b*k, per_beam]
    log_probs = jnp.where(best_tokens == PAD_ID, NEG_INF, log_probs)
    candidate_logp = (state.alive_logp.reshape(-1, 1) + log_probs).reshape(b, k * per_beam)
    top_logp, top_index = lax.top_k(candidate_logp, num_candidates)  # [b, 2k]
    beam = top_index // per_beam
    token = jnp.take_along_axis(best_tokens.reshape(b, k * per_beam), top_index, axis=1)
    seqs = _gather_beams(state.alive_seqs, beam)
    seqs = lax.dynamic_update_slice(seqs, token[:, :, None], (0, 0, i))  # [b, 2k, L]
    ends = (token == eos_id) | (i == L - 1)
    # A hypothesis ends only if it ranks among the k best candidates of this step (ended hypotheses
    # take beam slots, so beam 1 is greedy); none grown from the dead start beams (logp ~ NEG_INF).
    accepted = ends & (jnp.arange(num_candidates) < k) & (top_logp > NEG_INF / 2)
    alive_logp, keep = lax.top_k(jnp.where(ends, NEG_INF, top_logp), k)
    alive_seqs = _gather_beams(seqs, keep)
    cache = reorder_fn(state.cache, (offsets + _gather_beams(beam, keep)).reshape(-1))
    new_scores = jnp.where(accepted, top_logp / length_penalty(i + 1, alpha), NEG_INF)
    fin_scores, best = lax.top_k(jnp.concatenate([state.fin_scores, new_scores], axis=1), k)
    fin_seqs = _gather_beams(jnp.concatenate([state.fin_seqs, seqs], axis=1), best)
    return _Beams(i + 1, alive_seqs, alive_logp, fin_seqs, fin_scores, cache)

  def cond(state: _Beams) -> jnp.ndarray:
    # Log-probs only fall as a hypothesis grows, so an alive beam can at best reach its current
    # logp divided by the largest penalty still ahead; stop once the k-th finished beats that.
    best_penalty = jnp.maximum(length_penalty(state.i + 1, alpha), length_penalty(L, alpha))
    best_alive = jnp.max(state.alive_logp, axis=1) / best_penalty
    all_done = jnp.all(state.fin_scores[:, -1] >= best_alive)
    return (state.i < L) & ~all_done

  def body(state: _Beams) -> _Beams:
    tokens = state.alive_seqs[:, :, state.i - 1].reshape(-1)
    logits, cache = step_fn(tokens, state.cache, state.i - 1)
    return update(state._replace(cache=cache), logits)

  # Beam 0 alone is live at the start, so the first expansion picks k distinct tokens.
  alive_logp = jnp.tile(jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF), (b, 1))
  state = _Beams(jnp.int32(0), jnp.zeros((b, k, L), jnp.int32), alive_logp,
                 jnp.zeros((b, k, L), jnp.int32), jnp.full((b, k), NEG_INF),
                 reorder_fn(cache, jnp.repeat(jnp.arange(b), k)) if tile_fn is None
                 else tile_fn(cache, k))
  state = lax.while_loop(cond, body, update(state, jnp.repeat(first_logits, k, axis=0)))
  if return_all_beams:
    return state.fin_seqs, state.fin_scores
  return state.fin_seqs[:, 0], state.fin_scores[:, 0]


def _left_pad_prompt(prompt: jnp.ndarray, start_token: bool = True
                     ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Right-padded prompts [b, p] -> left-padded decoder inputs [b, p+1] = pads, start token 0,
  prompt; with segment ids (0 on padding) and positions (0 at each row's start token). Without
  `start_token`, [b, p] = pads, prompt (a prompt that brings its own first token, as a Hugging
  Face model's BOS)."""
  b, p = prompt.shape
  lengths = jnp.sum(prompt != 0, axis=1)  # [b]
  if start_token:
    with_start = jnp.pad(prompt, ((0, 0), (1, 0)))  # [b, p+1]: 0, prompt, right padding
    p += 1
    lengths += 1
  else:
    with_start = prompt
  positions = jnp.arange(p)[None, :] - (p - lengths)[:, None]  # [b, p]
  real = positions >= 0
  tokens = jnp.where(real, jnp.take_along_axis(with_start, jnp.maximum(positions, 0), axis=1), 0)
  return tokens, real.astype(jnp.int32), jnp.where(real, positions, 0).astype(jnp.int32)


def prefill(model, params: Any, batch: dict[str, jnp.ndarray], max_len: int, prefix_lm: bool,
            beams: int = 1, start_token: bool = True) -> tuple[jnp.ndarray, Any, StepFn]:
  """(first_logits [b, v], cache, step_fn for b * beams rows): the encoder run and the start token
  fed (batch['inputs']), or start token (unless not `start_token`) + left-padded prompt
  (batch['prompt']) prefilled at once."""
  is_variables = isinstance(params, dict) and set(params) == {"params"}  # or a params tree
  variables = dict(params) if is_variables else {"params": params}
  apply = functools.partial(model.apply, deterministic=True, decode=True, mutable=["cache"],
                            method="decode")
  if model.config.arch == "encoder_decoder":
    inputs = batch["inputs"]
    b = inputs.shape[0]
    source_segments = (inputs != 0).astype(jnp.int32)
    encoded = model.apply(variables, inputs, inputs_segment_ids=source_segments,
                          deterministic=True, method="encode")
    cache = kv_cache.empty(model, encoded, jnp.zeros((b, max_len), jnp.int32),
                         encoder_segment_ids=source_segments)
    ones = jnp.ones((b, 1), jnp.int32)
    # Feeding the start token computes (and caches) the cross-attention keys/values once.
    logits, state = apply({**variables, "cache": cache}, encoded, jnp.zeros((b, 1), jnp.int32),
                          encoder_segment_ids=source_segments, decoder_positions=0 * ones,
                          decoder_segment_ids=ones)
    step_segments = jnp.repeat(source_segments, beams, axis=0)
    # The cross-attention keys/values keep their b rows, shared by each row's beams.
    state["cache"], cross = kv_cache.split_cross(state["cache"])

    def step_fn(tokens, cache, j):
      ones = jnp.ones((tokens.shape[0], 1), jnp.int32)
      logits, state = apply({**variables, "cache": kv_cache.join(cache, cross)}, None,
                            tokens[:, None], encoder_segment_ids=step_segments,
                            decoder_positions=(j + 1) * ones, decoder_segment_ids=ones)
      return logits[:, -1], kv_cache.split_cross(state["cache"])[0]
  else:
    prompt = batch["prompt"]
    b = prompt.shape[0]
    tokens, segments, positions = _left_pad_prompt(prompt, start_token)
    cache = kv_cache.empty(model, jnp.zeros((b, tokens.shape[1] + max_len - 1), jnp.int32))
    prompt_targets = jnp.pad(tokens[:, 1:] != 0, ((0, 0), (0, 1)))  # input i's target: i+1
    prefix = models.decoder_prefix(prompt_targets, segments) if prefix_lm else None
    logits, state = apply({**variables, "cache": cache}, tokens, decoder_positions=positions,
                          decoder_segment_ids=segments, decoder_prefix_mask=prefix)
    next_position = jnp.repeat(positions[:, -1:] + 1, beams, axis=0)  # [b*k, 1]

    def step_fn(tokens, cache, j):
      ones = jnp.ones((tokens.shape[0], 1), jnp.int32)
      logits, state = apply({**variables, "cache": cache}, tokens[:, None],
                            decoder_positions=next_position + j, decoder_segment_ids=ones,
                            decoder_prefix_mask=0 * ones if prefix_lm else None)
      return logits[:, -1], state["cache"]

  return logits[:, -1], state["cache"], step_fn


@functools.lru_cache(maxsize=32)
def _compiled(members: tuple, search: Search, eos_id: int, max_len: int, return_all_beams: bool,
              prefix_lm: bool, start_token: bool = True):
  """One jitted decoder per (models, settings): one search over the members' mean probability."""
  k = search.beam_size if search.method == "beam" else 1

  def decode(params: tuple, batch: dict[str, jnp.ndarray], rng: jnp.ndarray):
    prefilled = [prefill(m, p, batch, max_len, prefix_lm, beams=k, start_token=start_token)
                 for m, p in zip(members, params)]
    first_logits, cache, member_steps = zip(*prefilled)
    first_logits = ensemble.log_mean_probs(first_logits)

    def step_fn(tokens, caches, j):
      outs = [step(tokens, c, j) for step, c in zip(member_steps, caches)]
      return ensemble.log_mean_probs([logits for logits, _ in outs]), tuple(c for _, c in outs)

    if search.method == "beam":
      # Beams share their row's self-attention keys/values: a reorder gathers only the bookkeeping.
      scans = [m.config.scan_layers for m in members]
      reorder = lambda caches, idx: tuple(  # noqa: E731
          kv_cache.reorder_beams(c, idx, s) for c, s in zip(caches, scans))
      tile = lambda caches, beams: tuple(  # noqa: E731
          kv_cache.tile_beams(c, beams, s) for c, s in zip(caches, scans))
      return beam_search(step_fn, first_logits, cache, beam_size=k, alpha=search.length_penalty,
                         eos_id=eos_id, max_len=max_len, return_all_beams=return_all_beams,
                         reorder_fn=reorder, tile_fn=tile)
    return sample_search(step_fn, first_logits, cache, search=search, eos_id=eos_id,
                         max_len=max_len, rng=rng)

  return jax.jit(decode)


def generate(model, params: Any, batch: dict[str, Any], decode_cfg: Any, *, eos_id: int,
             max_decode_len: int, rng: jnp.ndarray | None = None, return_all_beams: bool = False,
             prefix_lm: bool | None = None, start_token: bool = True
             ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(tokens [b, max_decode_len] ending in EOS then 0s, scores [b]) of a batch {'inputs': [b, s]}
  or {'prompt': [b, p]} (decoder-only), right-padded with 0. prefix_lm: attend over the prompt
  bidirectionally (None = the config's; an LM trained on plain text needs False); start_token:
  False feeds a decoder-only prompt without our start token in front. `model` and
  `params` may be tuples: an ensemble, the mean of their probabilities."""
  members, params = ensemble.members(model, params)
  ensemble.check_compatible([m.config for m in members])
  cfg = members[0].config
  search = search_settings(decode_cfg, cfg.vocab_size, cfg.max_len)
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len={max_decode_len} must be >= 1")
  key = "inputs" if cfg.arch == "encoder_decoder" else "prompt"
  if key not in batch:
    raise ValueError(f"generate: a {cfg.arch} model needs batch[{key!r}], got keys {sorted(batch)}")
  tokens = jnp.asarray(batch[key], jnp.int32)
  if tokens.ndim != 2 or tokens.shape[0] == 0:
    raise ValueError(f"generate: batch[{key!r}] must be [batch, length] token ids, got "
                     f"shape {tokens.shape}")
  cache_len = max_decode_len if key == "inputs" else tokens.shape[1] + max_decode_len - (
      not start_token)
  for i, m in enumerate(members):
    if cache_len > m.config.max_len:
      member = f" (ensemble member {i})" if len(members) > 1 else ""
      raise ValueError(f"generate: {'prompt length + ' if key == 'prompt' else ''}max_decode_len = "
                       f"{cache_len} exceeds model.max_len={m.config.max_len}{member}")
  if prefix_lm is None:
    prefix_lm = any(bool(getattr(m.config, "prefix_lm", False)) for m in members)
  fn = _compiled(members, search, int(eos_id), int(max_decode_len), bool(return_all_beams),
                 bool(prefix_lm) and cfg.arch == "decoder_only", bool(start_token))
  return fn(tuple(params), {key: tokens}, jax.random.key(0) if rng is None else rng)
