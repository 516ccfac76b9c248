"""Decoding benchmark: beam-search milliseconds per step, and LM sampling tokens/s with vs without cache.

  python benchmarks/decode.py                    # both parts, the shapes below
  python benchmarks/decode.py --part=beam --vocab=8000 --repeats=5

Beam: an encoder-decoder of 3+3 layers, d_model 256 (8 heads, MLP 1024, tied embeddings), batch 32,
beam 4, source length 48, 47 decode steps (48 generated tokens; EOS never matches, so no early stop).
The time per step is the whole generate() call (encoder, start step and 47 loop steps) divided by 47.
Target on a 2-core CPU: <= 17 ms per step (the flax WMT example takes ~34 ms for the same shapes).

LM sampling: a decoder-only model generating 256 new tokens after a 16-token prompt, with the KV
cache (generate(): one prefill call, then one token per step) and without it (the same sampling loop,
each step a full forward pass over the fixed-length [prompt + 256] buffer, causal-masked). Both are
single jit-compiled while loops with the same sampling code and seed, so they should also produce
the same tokens. Target: the cache at least 10x faster.

  python benchmarks/decode.py --part=beam --vocab=32000,8000,1000 --compare=HEAD~1

--compare=REV times beam search at git revision REV too (its tree from `git archive`), in the same
run, alternating fresh processes of the two trees `--rounds` times and keeping each one's best, so a
busy machine slows both alike. The last line is a README-ready table row.
"""

import argparse
import json
import os
import sys
import time

from trees import alternate, hlo_ops, same_work, tree_from_argv, tree_module  # benchmarks/ is the script's directory


sys.path.insert(0, tree_from_argv())

import flax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from transformer.config import DecodeConfig, model_config  # pylint: disable=g-import-not-at-top,wrong-import-position

# The layout of the tree timed (--compare reads older revisions' trees too).
decoding = tree_module("transformer.infer.decoding", "transformer.decoding")
build_model = tree_module("transformer.model.models", "transformer.models").build_model

NEVER = -1  # an EOS id no token matches: every run decodes the full length


def random_params(model, *init_args, seed: int = 0):
  """Parameters of the model's shapes filled by NumPy (values do not change the timing, and this
  avoids compiling model.init, which is slow on CPU)."""
  shapes = flax.core.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), *init_args)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.standard_normal(s.shape) / np.sqrt(s.shape[0]), s.dtype), shapes)


def timed(fn, repeats: int) -> tuple[float, float, float, object]:
  """(compile + first run s, best wall s of `repeats`, process CPU s of that run, last result).

  CPU seconds (all threads) tell whether a slow wall time is the machine being shared.
  """
  start = time.perf_counter()
  result = jax.block_until_ready(fn())
  first = time.perf_counter() - start
  best, cpu = float("inf"), 0.0
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    result = jax.block_until_ready(fn())
    wall = time.perf_counter() - start
    if wall < best:
      best, cpu = wall, time.process_time() - start_cpu
  return first, best, cpu, result


def decode_cfg(method: str, beam_size: int = 1) -> DecodeConfig:
  return DecodeConfig(method=method, beam_size=beam_size, length_penalty=0.6, temperature=1.0,
                      top_k=0, top_p=0.95, max_decode_len=0)


BEAM_SHAPES = "beam 4, batch 32, 3+3 layers d_model 256, 47 steps"


def bench_beam(vocab: int, repeats: int) -> dict:
  """Beam search ms per decode step on the encoder-decoder shapes of the module docstring."""
  cfg = model_config(arch="encoder_decoder", vocab_size=vocab, source_vocab_size=vocab,
                     d_model=256, num_heads=8, mlp_dim=1024, num_encoder_layers=3,
                     num_decoder_layers=3, dropout_rate=0.0, max_len=256)
  model = build_model(cfg)
  steps, batch, beam, src_len = 47, 32, 4, 48
  inputs = np.random.default_rng(1).integers(3, vocab, (batch, src_len), dtype=np.int32)
  params = random_params(model, inputs[:1], inputs[:1])
  run = lambda: decoding.generate(model, params, {"inputs": inputs}, decode_cfg("beam", beam),
                                  eos_id=NEVER, max_decode_len=steps + 1)
  first, best, cpu, (tokens, _) = timed(run, repeats)
  assert tokens.shape == (batch, steps + 1)
  return dict(vocab=vocab, ms=1000 * best / steps, cpu_ms=1000 * cpu / steps, call_s=best,
              first_s=first, hlo=_beam_hlo(model, params, inputs, beam, steps + 1))


def _beam_hlo(model, params, inputs, beam: int, length: int) -> dict[str, int] | None:
  """Instruction counts of the compiled beam search; None where a tree's internals differ."""
  try:
    search = decoding.search_settings(decode_cfg("beam", beam))
    if hasattr(decoding, "ensemble"):  # a tuple of members since the ensembles
      model, params = (model,), (params,)  # (older trees, timed by --compare, take one model)
    fn = decoding._compiled(model, search, NEVER, length, False, False)  # pylint: disable=protected-access
    return hlo_ops(fn.lower(params, {"inputs": jnp.asarray(inputs)}, jax.random.key(0))
                   .compile().as_text())
  except (AttributeError, TypeError):
    return None


def print_beam(r: dict) -> None:
  print(f"beam search  {BEAM_SHAPES}, vocab {r['vocab']}, src 48: {r['ms']:.1f} ms per step "
        f"(target <= 17; {r['cpu_ms']:.1f} CPU-ms), {r['call_s']:.2f} s per call, "
        f"first call {r['first_s']:.1f} s")


def readme_row(r: dict, base: dict | None = None, rev: str = "") -> str:
  before = f" ({base['ms']:.1f} at {rev})" if base else ""
  return (f"| beam search ({BEAM_SHAPES}, vocab {r['vocab']}) | {r['ms']:.1f} ms per step{before} "
          f"| target <= 17; the flax WMT example ~34 |")


def compare_beam(args, vocabs: list[int]) -> None:
  """Beam search at revision args.compare and in this tree, alternating fresh processes."""
  best = {}
  runs = [["--part=beam", f"--vocab={vocab}", f"--repeats={args.repeats}"] for vocab in vocabs]
  for name, run_args, r in alternate(os.path.abspath(__file__), runs, args.compare, args.rounds):
    vocab = vocabs[runs.index(run_args)]
    if (name, vocab) not in best or r["ms"] < best[name, vocab]["ms"]:
      best[name, vocab] = r
  print(f"beam search  {BEAM_SHAPES}: best of {args.rounds} alternating rounds, "
        f"{args.compare} (before) vs this tree (after)")
  for vocab in vocabs:
    b, a = best["before", vocab], best["after", vocab]
    print(f"  vocab {vocab:6d}: {b['ms']:6.1f} -> {a['ms']:5.1f} ms per step "
          f"({b['cpu_ms']:.1f} -> {a['cpu_ms']:.1f} CPU-ms), {b['ms'] / a['ms']:.2f}x; "
          f"target <= 17")
    if b.get("hlo") and a.get("hlo"):
      print(f"                compiled search: {same_work(b['hlo'], a['hlo'])}")
  for vocab in vocabs:
    print("README:", readme_row(best["after", vocab], best["before", vocab], args.compare))


def bench_lm(args) -> None:
  """LM sampling tokens/s with the KV cache and with a full forward pass per token."""
  cfg = model_config(arch="decoder_only", vocab_size=256, d_model=args.lm_d_model, num_heads=4,
                     mlp_dim=4 * args.lm_d_model, num_decoder_layers=args.lm_layers,
                     dropout_rate=0.0, prefix_lm=False, max_len=512)
  model = build_model(cfg)
  new, batch, prompt_len = 256, args.lm_batch, 16
  prompt = np.random.default_rng(2).integers(1, 256, (batch, prompt_len), dtype=np.int32)
  params = random_params(model, prompt[:1])
  sample = decode_cfg("sample")
  rng = jax.random.key(3)

  cached = lambda: decoding.generate(model, params, {"prompt": prompt}, sample, eos_id=NEVER,
                                     max_decode_len=new, rng=rng)[0]

  @jax.jit
  def uncached_fn(params, prompt, rng):
    inputs = jnp.pad(prompt, ((0, 0), (1, new)))  # [b, 1 + p + new]: start token, prompt, room
    p = prompt_len + 1

    def forward(inputs):  # full causal forward pass, no cache
      return model.apply({"params": params}, inputs, method="decode")

    def step_fn(tokens, inputs, j):
      inputs = inputs.at[:, p + j].set(tokens)
      return forward(inputs)[:, p + j], inputs

    return decoding.sample_search(step_fn, forward(inputs)[:, p - 1], inputs,
                                  search=decoding.search_settings(sample), eos_id=NEVER,
                                  max_len=new, rng=rng)[0]

  uncached = lambda: uncached_fn(params, prompt, rng)
  first_c, best_c, cpu_c, tokens_c = timed(cached, args.repeats)
  first_u, best_u, cpu_u, tokens_u = timed(uncached, max(1, args.repeats // 3))
  tps_c, tps_u = batch * new / best_c, batch * new / best_u
  same = float(np.mean(np.asarray(tokens_c) == np.asarray(tokens_u)))
  print(f"LM sampling  batch {batch}, {args.lm_layers} layers d_model {args.lm_d_model}, "
        f"{new} new tokens after {prompt_len}:")
  print(f"  with cache    {tps_c:9.0f} tokens/s ({best_c:.2f} s, {cpu_c:.2f} CPU-s, "
        f"first call {first_c:.1f} s)")
  print(f"  without cache {tps_u:9.0f} tokens/s ({best_u:.2f} s, {cpu_u:.2f} CPU-s, "
        f"first call {first_u:.1f} s)")
  print(f"  cache speed-up {tps_c / tps_u:.1f}x (target >= 10x); "
        f"same tokens as the uncached loop: {100 * same:.1f}%")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--part", choices=["all", "beam", "lm"], default="all")
  parser.add_argument("--vocab", default="32000",
                      help="beam model vocabularies, comma-separated (the flax WMT example: 32000)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--compare", default="", help="git revision to time beam search against")
  parser.add_argument("--rounds", type=int, default=2, help="alternating rounds for --compare")
  parser.add_argument("--tree", default="", help=argparse.SUPPRESS)  # read by trees.tree_from_argv()
  parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # for --compare
  parser.add_argument("--lm_layers", type=int, default=4)
  parser.add_argument("--lm_d_model", type=int, default=256)
  parser.add_argument("--lm_batch", type=int, default=4)
  args = parser.parse_args()
  try:
    vocabs = [int(v) for v in args.vocab.split(",")]
  except ValueError:
    parser.error(f"--vocab={args.vocab!r} must be comma-separated integers")
  if args.json:
    print(json.dumps(bench_beam(vocabs[0], args.repeats)))
    return
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores")
  if args.part in ("all", "beam"):
    if args.compare:
      compare_beam(args, vocabs)
    else:
      results = [bench_beam(vocab, args.repeats) for vocab in vocabs]
      for r in results:
        print_beam(r)
      for r in results:
        print("README:", readme_row(r))
  if args.part in ("all", "lm"):
    bench_lm(args)


if __name__ == "__main__":
  main()
