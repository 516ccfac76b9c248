"""Train-step benchmark: ms per step, tokens/s and the share of a same-run matmul peak.

  python benchmarks/train_step.py                         # every size, ours vs the anchors
  python benchmarks/train_step.py --sizes=baby,encdec --steps=20 --rounds=3
  python benchmarks/train_step.py --no-anchors            # ours only
  python benchmarks/train_step.py --compare=HEAD~1        # this tree vs a git revision, alternating
  python benchmarks/train_step.py --scan-compile=6,24     # compile s with model.scan_layers=True
  python benchmarks/train_step.py --sizes=g2pfast --variants="dropout_bits=32|dropout_bits=8|dropout_rate=0"

Anchors (benchmarks/anchors.py): flax examples/lm1b at baby and medium, nanoGPT's model.py
(torch) at the same two sizes, flax examples/wmt at encdec; none at g2p. They are imported from
local checkouts under `--anchors=DIR` ($TRANSFORMER_ANCHORS, default /tmp/anchors); absent ones
are skipped with a note. Ours and the anchors run in one process, alternating `--rounds` times
(`--steps` steps each), and each keeps its fastest median, so a busy machine slows all alike;
the report gives ours/anchor ratios and every side's share of the same-run matmul peak (the
anchors' share uses our FLOP count of the same widths).

Sizes (float32, dropout 0, the project's own jitted train step with donation, random token ids):
  baby    decoder-only, lm.py:nanogpt_cpu knobs: 4 layers, d 128, 4 heads, mlp 512, seq 64, batch 12
  medium  decoder-only, the same knobs: 6 layers, d 384, 6 heads, mlp 1536, seq 256, batch 16
  encdec  encoder-decoder, pre-LN: 3+3 layers, d 256, 4 heads, mlp 1024, src 32, tgt 48, batch 64
  g2p     configs/g2p.py:ablate's model, packed rows: 64 rows x 32/30 (dropout as configured)
  g2pfast configs/g2p.py:fast's model (3+3 layers, d 128, mlp 512, dropout as configured),
          128 rows x 32/30
(Vocabulary 64 for the first three.)

FLOPs per step = 6 x (matmul weights, output projection included) x tokens + 12 x layers x
attention length x d_model x tokens (nanoGPT's and PaLM's count; causal attention counted whole),
summed over the encoder and decoder stacks. The peak is a float32 2048^3 jitted matmul timed in
the same process; "share" = achieved GFLOP/s / peak.

--variants="K=V,K=V|K=V|..." times each size once per variant (model config overrides, and
`rows=N` for the batch's rows; `|` separates variants, `,` the keys of one) in one process,
alternating `--rounds` times, and prints each variant's fastest median and its tokens/s against
the first's: one knob's cost (or, with rows, what a larger batch buys per token), same run.

--compare=REV runs this file against REV's tree (from `git archive`) and this tree in fresh
processes, alternating `--rounds` times and keeping each one's fastest median, so a busy machine
slows both alike; it prints before -> after per size and the ratio, and the instruction counts
of the two compiled steps (matmuls, fusions, transposes, copies, ...): equal counts mean the same
work, so a ratio away from 1.00 is then the machine's noise, not the code.
"""

import argparse
import ast
import json
import os
import sys
import time

import anchors  # pylint: disable=g-import-not-at-top
from trees import KEY_OPS, alternate, hlo_ops, same_work, tree_from_argv, tree_module  # benchmarks/ is the script's directory
VOCAB = 64


sys.path.insert(0, tree_from_argv())
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import base, g2p, lm  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer import choices  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.config import ConfigError, from_configdict  # pylint: disable=g-import-not-at-top,wrong-import-position
# The layout of the tree timed (--compare reads older revisions' trees too).
build_model = tree_module("transformer.model.models", "transformer.models").build_model
optim = tree_module("transformer.train.optim", "transformer.optim")
step_lib = tree_module("transformer.train.steps", "transformer.steps", "transformer.training")

SIZES = ("baby", "medium", "encdec", "g2p", "g2pfast")


def size_config(name: str):
  """(ConfigDict, batch shapes {feature: [rows, length]}) of a named size."""
  if name in ("baby", "medium"):
    layers, d, heads, mlp, seq, batch = ((4, 128, 4, 512, 64, 12) if name == "baby"
                                         else (6, 384, 6, 1536, 256, 16))
    cd = lm.get_config("nanogpt_cpu")
    cd.model.update(num_decoder_layers=layers, d_model=d, num_heads=heads, mlp_dim=mlp,
                    max_len=seq, vocab_size=VOCAB, dropout_rate=0.0)
    cd.data.update(max_target_len=seq, batch_size=batch)
    return cd, {"targets": (batch, seq)}
  if name == "encdec":
    cd = base.get_config()
    cd.model.update(d_model=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3,
                    num_decoder_layers=3, vocab_size=VOCAB, source_vocab_size=VOCAB,
                    dropout_rate=0.0, norm_position="pre", max_len=64)
    cd.train.update(optimizer="adamw", schedule="constant", learning_rate=1e-3,
                    label_smoothing=0.0)
    return cd, {"inputs": (64, 32), "targets": (64, 48)}
  if name in ("g2p", "g2pfast"):
    # --compare runs this against older trees, where :ablate's model is g2p.py's "tiny".
    variant = "fast" if name == "g2pfast" else "ablate" if "ablate" in g2p.VARIANTS else "tiny"
    if variant not in g2p.VARIANTS:
      raise SystemExit(f"--sizes={name}: this tree's configs/g2p.py has no :{variant}")
    cd = g2p.get_config(variant)
    cd.model.update(vocab_size=VOCAB, source_vocab_size=VOCAB)
    rows = cd.data.batch_size
    return cd, {"inputs": (rows, cd.data.max_source_len), "targets": (rows, cd.data.max_target_len)}
  raise SystemExit(f"--sizes: unknown size {name!r} (one of {', '.join(SIZES)})")


def random_batch(shapes: dict[str, tuple[int, int]], packed: bool, seed: int) -> dict:
  """Random ids; `packed` rows hold 4 segments each, with positions restarting per segment."""
  rng = np.random.default_rng(seed)
  batch = {}
  for name, (rows, length) in shapes.items():
    batch[name] = rng.integers(4, VOCAB, (rows, length), dtype=np.int32)
    if packed:
      seg = np.repeat(np.arange(1, 5), -(-length // 4))[:length]
      batch[f"{name}_segment_ids"] = np.tile(seg, (rows, 1)).astype(np.int32)
      pos = np.concatenate([np.arange(np.sum(seg == s)) for s in range(1, 5)])
      batch[f"{name}_positions"] = np.tile(pos, (rows, 1)).astype(np.int32)
  if "targets" in batch:
    batch["weights"] = np.ones(batch["targets"].shape, np.float32)
  return batch


def train_flops(cfg, shapes: dict[str, tuple[int, int]]) -> float:
  """Model FLOPs of one train step (forward + backward), as the module docstring counts them."""
  m = cfg.model
  hd, vd, kv = m.head_dim, m.v_head_dim, m.num_kv_heads
  attn_w = m.d_model * (m.num_heads * hd + kv * hd + kv * vd) + m.num_heads * vd * m.d_model
  mlp_w = m.d_model * m.mlp_dim * (3 if choices.FFNS[m.ffn].gated else 2)
  flops = 0.0
  tgt_rows, tgt_len = shapes["targets"]
  tgt_tokens = tgt_rows * tgt_len
  if "inputs" in shapes:
    src_rows, src_len = shapes["inputs"]
    src_tokens = src_rows * src_len
    flops += 6 * m.num_encoder_layers * (attn_w + mlp_w) * src_tokens
    flops += 12 * m.num_encoder_layers * src_len * m.d_model * src_tokens
    cross_w = m.d_model * (m.num_heads * hd) + m.num_heads * vd * m.d_model  # q and out
    cross_kv = m.d_model * kv * (hd + vd)  # computed on the source tokens
    flops += 6 * m.num_decoder_layers * (cross_w * tgt_tokens + cross_kv * src_tokens)
    flops += 12 * m.num_decoder_layers * src_len * m.d_model * tgt_tokens
  flops += 6 * m.num_decoder_layers * (attn_w + mlp_w) * tgt_tokens
  flops += 12 * m.num_decoder_layers * tgt_len * m.d_model * tgt_tokens
  flops += 6 * m.d_model * m.vocab_size * tgt_tokens  # output projection
  return flops


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
  """GFLOP/s of a jitted float32 n^3 matmul, the best of `repeats`."""
  a = jax.random.normal(jax.random.key(0), (n, n), np.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best / 1e9


def build(name: str, keep_hlo_text: bool = False, rows: int | None = None,
          **model_overrides) -> tuple:
  """(run: one train step, blocking; record: size, compile_s, tokens, flops, hlo) of size `name`;
  keep_hlo_text adds the compiled step's HLO text as record["hlo_text"] (step_profile.py);
  rows replaces the size's batch rows (every feature keeps its length)."""
  cd, shapes = size_config(name)
  if rows is not None:
    shapes = {feature: (rows, length) for feature, (_, length) in shapes.items()}
  return build_sized(name, cd, shapes, keep_hlo_text=keep_hlo_text, **model_overrides)


def build_sized(name: str, cd, shapes: dict[str, tuple[int, int]], keep_hlo_text: bool = False,
                steps_per_dispatch: int = 1, **model_overrides) -> tuple:
  """build() of a size given as (config, batch shapes), e.g. accelerator.py's larger ones;
  steps_per_dispatch K > 1 makes one run() K train steps in one scan (steps.scan_steps)."""
  cd.model.update(model_overrides)
  cfg = from_configdict(cd)
  model = build_model(cfg.model)
  tx = optim.make_optimizer(cfg.train, cfg.model)
  packed = name.startswith("g2p")
  batches = [random_batch(shapes, packed, seed) for seed in range(4 * steps_per_dispatch)]
  example = {k: np.asarray(v)[:1] for k, v in batches[0].items()}
  state = step_lib.create_train_state(cfg, model, jax.random.PRNGKey(0), example, tx)
  train_step = step_lib.make_train_step(cfg, model, tx)
  if steps_per_dispatch > 1:
    k = steps_per_dispatch
    train_step = step_lib.scan_steps(train_step)
    batches = [{f: np.stack([b[f] for b in batches[i * k:(i + 1) * k]]) for f in batches[0]}
               for i in range(4)]
  batches = [jax.device_put(b) for b in batches]
  step = jax.jit(train_step, donate_argnums=(0,))
  start = time.perf_counter()
  compiled = step.lower(state, batches[0]).compile()
  compile_s = time.perf_counter() - start
  box = {"state": state, "i": 0}

  def run():
    box["state"], metrics = compiled(box["state"], batches[box["i"] % 4])
    box["i"] += 1
    jax.block_until_ready(metrics)

  tokens = sum(r * t for r, t in shapes.values()) * steps_per_dispatch
  text = compiled.as_text()
  memory = compiled.memory_analysis()  # XLA's own account; None where the backend gives none
  record = {"size": name, "compile_s": compile_s, "tokens": tokens,
            "flops": train_flops(cfg, shapes) * steps_per_dispatch, "hlo": hlo_ops(text),
            "temp_bytes": getattr(memory, "temp_size_in_bytes", None)}
  return run, record | ({"hlo_text": text} if keep_hlo_text else {})


def median_ms(run, steps: int, warmup: int = 0) -> float:
  """Median wall milliseconds of `steps` calls of `run` after `warmup` untimed ones."""
  times = []
  for i in range(warmup + steps):
    start = time.perf_counter()
    run()
    if i >= warmup:
      times.append(time.perf_counter() - start)
  return float(np.median(times)) * 1e3


def with_rates(record: dict, ms: float) -> dict:
  """The record with ms per step and the tokens/s and GFLOP/s they give."""
  return record | {"ms": ms, "tokens_per_s": record["tokens"] / ms * 1e3,
                   "gflops": record["flops"] / ms / 1e6}


def bench(name: str, steps: int, warmup: int = 3) -> dict:
  """Compile seconds and the median ms of `steps` train steps at size `name`."""
  run, record = build(name)
  return with_rates(record, median_ms(run, steps, warmup))


def anchor_runners(name: str, directory: str) -> tuple[dict, list[str]]:
  """{label: step callable} of the public anchors at size `name`, and notes on those skipped."""
  cd, shapes = size_config(name)
  m = cd.model
  if name in ("baby", "medium"):
    (batch, seq), = shapes.values()
    made = [anchors.make_lm1b(directory, m.num_decoder_layers, m.d_model, m.num_heads, m.mlp_dim,
                              seq, batch, VOCAB),
            anchors.make_nanogpt(directory, m.num_decoder_layers, m.d_model, m.num_heads, seq,
                                 batch, VOCAB)]
  elif name == "encdec":
    (batch, src), (_, tgt) = shapes["inputs"], shapes["targets"]
    made = [anchors.make_wmt(directory, m.num_decoder_layers, m.d_model, m.num_heads, m.mlp_dim,
                             src, tgt, batch, VOCAB)]
  else:
    return {}, [f"{name}: no public anchor at this size"]
  runners = {label.split(" ")[0]: run for run, label in made if run is not None}
  return runners, [label for run, label in made if run is None]


def against_anchors(args, sizes: list[str]) -> None:
  """Ours and the anchors at each size, alternating `--rounds` times; fastest median each."""
  peak = matmul_peak()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores; "
        f"float32 matmul peak {peak:.0f} GFLOP/s (same run); load {_load()}; "
        f"{anchors.describe(args.anchors)}")
  for name in sizes:
    ours, record = build(name)
    runners, notes = anchor_runners(name, args.anchors)
    runners = {"ours": ours, **runners}
    best = {who: float("inf") for who in runners}
    for run in runners.values():
      median_ms(run, 3)  # warm-up
    for _ in range(args.rounds):
      for who, run in runners.items():
        best[who] = min(best[who], median_ms(run, args.steps))
    r = with_rates(record, best["ours"])
    print(_show(r, peak))
    for who, ms in best.items():
      if who != "ours":
        share = record["flops"] / ms / 1e6 / peak
        print(f"        {who:8s} {ms:8.1f} ms/step  ours/{who} = {best['ours'] / ms:.2f}x  "
              f"({share:.0%} of peak)")
    for note in notes:
      print(f"        {note}")
    print("        compiled step: " + ", ".join(f"{op} {r['hlo'][op]}" for op in KEY_OPS
                                              if op in r["hlo"]))
  print(f"fastest median of {args.rounds} alternating rounds of {args.steps} steps each; "
        f"load at the end {_load()}")


def parse_variants(text: str) -> list[dict]:
  """'k=v,k=v|k=v' -> [{k: v, k: v}, {k: v}], values read as Python literals (else strings)."""
  variants = []
  for part in text.split("|"):
    overrides = {}
    for item in filter(None, part.split(",")):
      key, sep, value = item.partition("=")
      if not sep:
        raise SystemExit(f"--variants: {item!r} is not KEY=VALUE (a model config key)")
      try:
        overrides[key.strip()] = ast.literal_eval(value.strip())
      except (ValueError, SyntaxError):
        overrides[key.strip()] = value.strip()
    variants.append(overrides)
  return variants


def variants(args, sizes: list[str]) -> None:
  """Each size under each variant's model overrides, in one process, alternating."""
  chosen = parse_variants(args.variants)
  labels = [",".join(f"{k}={v}" for k, v in o.items()) or "(config as is)" for o in chosen]
  print(f"train step per variant: fastest median of {args.rounds} alternating rounds of "
        f"{args.steps} steps; load {_load()}")
  model_keys = size_config(sizes[0])[0].model
  for overrides in chosen:
    for key in overrides:
      if key not in model_keys and key != "rows":
        raise SystemExit(f"--variants: {key!r} is not a model config key (e.g. dropout_bits) "
                         "or rows")
    rows = overrides.get("rows", 1)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:  # True is no count
      raise SystemExit(f"--variants: rows={rows!r} is not a positive number of rows")
  for name in sizes:
    try:
      built = [build(name, **overrides) for overrides in chosen]
    except ConfigError as e:
      raise SystemExit(f"--variants: {e}") from None
    for run, _ in built:
      median_ms(run, 3)  # warm-up
    best = [float("inf")] * len(built)
    for _ in range(args.rounds):
      for i, (run, _) in enumerate(built):
        best[i] = min(best[i], median_ms(run, args.steps))
    first = with_rates(built[0][1], best[0])["tokens_per_s"]
    for label, (_, record), ms in zip(labels, built, best):
      r = with_rates(record, ms)
      print(f"  {name:7s} {label:32s} {ms:8.1f} ms/step  {r['tokens_per_s']:9.0f} tok/s  "
            f"{r['tokens_per_s'] / first:.2f}x the first's tokens/s")
  print(f"load at the end {_load()}")


def scan_compile(layer_counts: list[int]) -> None:
  """Compile seconds of the `baby` step with model.scan_layers=True at each layer count."""
  print(f"compile with model.scan_layers=True, baby widths; load {_load()}")
  for n in layer_counts:
    _, record = build("baby", scan_layers=True, num_decoder_layers=n)
    print(f"  {n:3d} layers: compile {record['compile_s']:.1f} s")


def _load() -> str:
  return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _show(r: dict, peak: float) -> str:
  return (f"{r['size']:7s} {r['ms']:8.1f} ms/step  {r['tokens_per_s']:9.0f} tok/s  "
          f"{r['gflops']:6.1f} GFLOP/s = {r['gflops'] / peak:4.0%} of peak  "
          f"(compile {r['compile_s']:.1f} s)")


def compare(args, sizes: list[str]) -> None:
  """This file at REV's tree and at this tree, alternating fresh processes."""
  best: dict[tuple[str, str], dict] = {}
  for who, _, record in alternate(os.path.abspath(__file__),
                                  [[f"--sizes={','.join(sizes)}", f"--steps={args.steps}"]],
                                  args.compare, args.rounds):
    for r in record["results"]:
      if (who, r["size"]) not in best or r["ms"] < best[who, r["size"]]["ms"]:
        best[who, r["size"]] = r | {"peak": record["peak"]}
  print(f"train step: fastest median of {args.rounds} alternating rounds, {args.compare} (before) "
        f"vs this tree (after); load {os.getloadavg()[0]:.2f}")
  for size in sizes:
    b, a = best["before", size], best["after", size]
    print(f"  {size:7s} {b['ms']:8.1f} -> {a['ms']:8.1f} ms/step  {b['ms'] / a['ms']:.2f}x  "
          f"({a['tokens_per_s']:.0f} tok/s, {a['gflops'] / a['peak']:.0%} of a "
          f"{a['peak']:.0f} GFLOP/s peak)")
    if "hlo" in b:  # older trees' benchmark may not report them
      print(f"          compiled step: {same_work(b['hlo'], a['hlo'])}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated: {SIZES}")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--compare", default="", help="a git revision to time against")
  parser.add_argument("--rounds", type=int, default=2, help="alternating rounds for --compare")
  parser.add_argument("--anchors", default=anchors.DEFAULT_DIR,
                      help="local checkouts of flax examples and nanoGPT (see benchmarks/anchors.py)")
  parser.add_argument("--no-anchors", action="store_true", help="time ours only")
  parser.add_argument("--variants", default="",
                      help="model overrides (and rows=N) per variant, e.g. 'dropout_bits=32|dropout_bits=8'")
  parser.add_argument("--scan-compile", default="",
                      help="comma-separated layer counts: compile seconds with scan_layers=True")
  parser.add_argument("--tree", default="", help=argparse.SUPPRESS)  # read by trees.tree_from_argv()
  parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # for --compare
  args = parser.parse_args()
  sizes = [s for s in args.sizes.split(",") if s]
  for s in sizes:
    if s not in SIZES:
      parser.error(f"--sizes: unknown size {s!r} (one of {', '.join(SIZES)})")
  if args.compare:
    compare(args, sizes)
    return
  if args.variants:
    variants(args, sizes)
    return
  if args.scan_compile:
    scan_compile([int(n) for n in args.scan_compile.split(",")])
    return
  if not (args.json or args.no_anchors):
    against_anchors(args, sizes)
    return
  peak = matmul_peak()
  results = [bench(s, args.steps) for s in sizes]
  if args.json:
    print(json.dumps({"peak": peak, "results": results}))
    return
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores; "
        f"float32 matmul peak {peak:.0f} GFLOP/s (same run); load {os.getloadavg()[0]:.2f}")
  for r in results:
    print(_show(r, peak))
    print("        compiled step: " + ", ".join(f"{op} {r['hlo'][op]}" for op in KEY_OPS
                                              if op in r["hlo"]))


if __name__ == "__main__":
  main()
