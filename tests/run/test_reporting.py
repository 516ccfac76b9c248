"""Tests for transformer/run/{reporting,provenance}.py: FLOP counts vs XLA and parameter shapes,
peaks, run files, provenance.json's data fingerprint and eval's warning when the data differs."""

import glob
import hashlib
import json
import os
import shutil
import struct
import subprocess
import time
import timeit
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorflow_datasets.proto import tf_example_pb2

import g2p_mini
from configs import base
from transformer import choices
from transformer.config import from_configdict, model_config, to_dict
from transformer.data import load_task
from transformer.infer import evaluation
from transformer.model.losses import cross_entropy
from transformer.model.models import build_model
from transformer.run import provenance, reporting

TINY = dict(vocab_size=512, source_vocab_size=512, d_model=128, num_heads=4, mlp_dim=256,
            num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0)


def init_shapes(cfg, b, s, t):
  """(model, params as ShapeDtypeStructs) of build_model(cfg) on [b, s] inputs / [b, t] targets."""
  model = build_model(cfg)
  inputs, targets = jnp.ones((b, s), jnp.int32), jnp.ones((b, t), jnp.int32)
  args = (inputs, targets) if cfg.arch == "encoder_decoder" else (targets,)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), *args))["params"]
  return model, nn.unbox(params)


@pytest.mark.parametrize("overrides", [
    dict(arch="encoder_decoder"),
    dict(arch="decoder_only", ffn="swiglu", num_kv_heads=2, head_dim=16, v_head_dim=48,
         tie_embeddings=False),
])
def test_flops_match_xla_cost_analysis(overrides):
  """XLA's FLOP count of a real forward+backward exceeds ours only by elementwise work (< 4%)."""
  cfg = model_config(**{**TINY, **overrides})
  b, s, t = 2, 12, 16
  model, shapes = init_shapes(cfg, b, s, t)
  inputs, targets = jnp.ones((b, s), jnp.int32), jnp.ones((b, t), jnp.int32)
  weights = jnp.ones((b, t), jnp.float32)

  def loss(params):
    args = (inputs, targets) if cfg.arch == "encoder_decoder" else (targets,)
    return cross_entropy(model.apply({"params": params}, *args), targets, weights)[0]

  cost = jax.jit(jax.grad(loss)).lower(shapes).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  ours = reporting.model_flops_per_step(cfg, b, s, t)
  assert 0.96 * cost["flops"] <= ours <= cost["flops"], (ours, cost["flops"])


@pytest.mark.parametrize("ffn", list(choices.FFNS))
def test_every_feed_forward_variants_flops_match_xla(ffn):
  """Each model.ffn (choices.FFNS: gated ones count three matrices, a mixture its router and top_k
  experts) against XLA's count of a tiny decoder-only model's forward+backward: ours is the
  matmuls, XLA's adds only elementwise work (< 4%: d_model 128 and mlp_dim 512 make the matmuls
  dominate). The mixture's capacity factor 1 gives each expert exactly t * top_k / experts slots,
  the work of the active experts (dropless lax.ragged_dot is counted by XLA as every expert's
  dense matmul). XLA's HloCostAnalysis of the lowered program, not the compiled one: the same
  matmul FLOPs, without a compilation of seconds per variant."""
  cfg = model_config(vocab_size=256, d_model=128, num_heads=4, mlp_dim=512, num_decoder_layers=1,
                     dropout_rate=0.0, arch="decoder_only", ffn=ffn, moe_num_experts=4,
                     moe_top_k=2, moe_capacity_factor=1.0)
  b, t = 2, 16
  model, shapes = init_shapes(cfg, b, t, t)
  targets, weights = jnp.ones((b, t), jnp.int32), jnp.ones((b, t), jnp.float32)

  def loss(params):
    logits, _ = model.apply({"params": params}, targets, mutable=["moe"])  # a mixture sows there
    return cross_entropy(logits, targets, weights)[0]

  cost = jax.jit(jax.grad(loss)).lower(shapes).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  ours = reporting.model_flops_per_step(cfg, b, t, t)
  assert 0.96 * cost["flops"] <= ours <= cost["flops"], (ours, cost["flops"])


@pytest.mark.parametrize("overrides", [
    dict(arch="encoder_decoder", ffn="geglu", num_kv_heads=1),
    dict(arch="decoder_only", head_dim=16, v_head_dim=48, tie_embeddings=False),
])
def test_flops_equal_six_n_d_from_parameter_shapes(overrides):
  """Exactly 6 x (kernel size x tokens it sees) summed over real kernels, plus attention scores.

  Independent of the closed form: every 'kernel' of the initialised model (and the tied
  embedding for the logits) is multiplied by the number of tokens it is applied to (source tokens
  for the encoder and cross-attention keys/values, target tokens otherwise).
  """
  cfg = model_config(**{**TINY, **overrides})
  b, s, t = 3, 10, 14
  _, shapes = init_shapes(cfg, b, s, t)
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    names = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
    if names[-1] == "kernel":
      on_source = names[0] == "encoder" or ("cross_attention" in names and names[-2] in (
          "kv", "key", "value"))
      total += 6 * b * (s if on_source else t) * int(np.prod(leaf.shape))
    elif names[-1] == "embedding" and cfg.tie_embeddings:
      total += 6 * b * t * int(np.prod(leaf.shape))  # the logits matmul uses the table
  n, h, hv = cfg.num_heads, cfg.head_dim, cfg.v_head_dim
  scores = lambda q, k: 3 * b * 2 * q * k * n * (h + hv)  # q.k and weights.v, fwd + bwd
  if cfg.arch == "encoder_decoder":
    total += cfg.num_encoder_layers * scores(s, s) + cfg.num_decoder_layers * (
        scores(t, t) + scores(t, s))
  else:
    total += cfg.num_decoder_layers * scores(t, t)
  assert reporting.model_flops_per_step(cfg, b, s, t) == total


def test_flops_need_a_vocabulary():
  """An unfilled vocab_size is a one-line error naming the key."""
  with pytest.raises(ValueError, match=r"model\.vocab_size is 0"):
    reporting.model_flops_per_step(model_config(**{**TINY, "vocab_size": 0}), 1, 4, 4)


def test_peak_flops_table_and_mfu():
  """Device kinds map to the documented bf16 peaks; CPU is None unless overridden; MFU arithmetic."""
  assert reporting.peak_flops("TPU v4") == 275e12
  assert reporting.peak_flops("TPU v5 lite") == 197e12
  assert reporting.peak_flops("TPU v5p") == 459e12
  assert reporting.peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
  assert reporting.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert reporting.peak_flops("NVIDIA H100 PCIe") == 756e12
  assert reporting.peak_flops("NVIDIA H200") == 989e12
  assert reporting.peak_flops("cpu") is None
  assert reporting.peak_flops("cpu", override=1e11) == 1e11
  assert reporting.mfu(2e12, 0.5, 4, 1e12) == pytest.approx(1.0)
  assert reporting.mfu(2e12, 0.5, 4, None) is None


def measure_matmul_flops(n: int = 1024, dtype: str = "float32", repeats: int = 5) -> float:
  """FLOP/s of one jitted n x n matmul on the default device, best of `repeats` (a CPU "peak")."""
  a = jax.numpy.ones((n, n), dtype)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()  # compile
  return 2 * n**3 / min(timeit.repeat(lambda: matmul(a).block_until_ready(), number=1,
                                      repeat=repeats))


def test_measured_matmul_peak_is_plausible():
  """The measured matmul rate is positive and below 10 TFLOP/s (it is a 2-core CPU)."""
  rate = measure_matmul_flops(n=128, repeats=2)
  assert 1e6 < rate < 1e13


def read_events(workdir):
  """All (tag, step, value) scalars of the TFRecord event files in workdir, parsed by hand."""
  out = []
  for name in os.listdir(workdir):
    if not name.startswith("events.out.tfevents"):
      continue
    data = open(os.path.join(workdir, name), "rb").read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for v in event.summary.value:
        out.append((v.tag, event.step, v.simple_value))
  return out


def test_reporter_writes_run_files(tmp_path):
  """config.json, provenance.json (git SHA of this code), metrics.jsonl and TensorBoard scalars."""
  workdir = str(tmp_path / "run")
  config = from_configdict(base.get_config())
  rep = reporting.Reporter(workdir, config, True, total_steps=10, mesh_shape={"data": 1},
                           show_progress=False)
  rep.write_scalars(1, {"train/loss": np.float32(2.5), "train/lr": 0.1})
  rep.write_scalars(2, {"train/loss": 2.0})
  rep.close()
  assert json.load(open(os.path.join(workdir, "config.json"))) == json.loads(
      json.dumps(to_dict(config)))
  prov = json.load(open(os.path.join(workdir, "provenance.json")))
  head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                        cwd=os.path.dirname(reporting.__file__)).stdout.strip()
  assert prov["git_sha"] == head and isinstance(prov["git_dirty"], bool)
  assert prov["packages"]["jax"] == jax.__version__ and prov["mesh_shape"] == {"data": 1}
  assert prov["num_devices"] == jax.device_count() and prov["process_count"] == 1
  lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  elapsed = [line.pop("time/elapsed_s") for line in lines]
  assert lines == [{"step": 1, "train/loss": 2.5, "train/lr": 0.1}, {"step": 2, "train/loss": 2.0}]
  assert 0 <= elapsed[0] <= elapsed[1]
  events = read_events(workdir)
  assert ("train/loss", 1, 2.5) in events and ("train/loss", 2, 2.0) in events


def test_resumed_reporter_drops_metrics_after_checkpoint(tmp_path):
  """A run resumed at step 3 removes metrics.jsonl lines logged after step 3 by the killed run."""
  workdir = str(tmp_path)
  rep = reporting.Reporter(workdir, {}, True, show_progress=False)
  for step in range(1, 6):
    rep.write_scalars(step, {"train/loss": float(step)})
  rep.close()
  rep = reporting.Reporter(workdir, {}, True, start_step=3, show_progress=False)
  rep.write_scalars(4, {"train/loss": 40.0})
  rep.close()
  steps = [json.loads(l)["step"] for l in open(os.path.join(workdir, "metrics.jsonl"))]
  assert steps == [1, 2, 3, 4]


def test_resume_drops_a_metrics_row_cut_short(tmp_path):
  """A metrics.jsonl whose last row a kill cut half way: the resume drops that row (it is not
  readable) and the rows it appends stay readable, one per line."""
  workdir = str(tmp_path)
  rep = reporting.Reporter(workdir, {}, True, show_progress=False)
  for step in range(1, 4):
    rep.write_scalars(step, {"train/loss": float(step)})
  rep.close()
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text[:-10])  # the row of step 3 cut short, no newline
  rep = reporting.Reporter(workdir, {}, True, start_step=2, show_progress=False)
  rep.write_scalars(3, {"train/loss": 30.0})
  rep.close()
  rows = [json.loads(l) for l in open(path)]
  assert [(r["step"], r["train/loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_elapsed_time_is_wall_clock_and_continues_across_a_resume(tmp_path, monkeypatch):
  """time/elapsed_s (the x axis of the time-to-quality plots) is time.time() minus the run's
  start, and a resumed run adds the elapsed time its killed predecessor logged up to the resume
  step (not what it logged after it): checked against a fake clock."""
  clock = [1000.0]
  monkeypatch.setattr(reporting.time, "time", lambda: clock[0])
  workdir = str(tmp_path)
  rep = reporting.Reporter(workdir, {}, True, show_progress=False, started=990.0)
  for step in range(1, 6):
    clock[0] += 10
    rep.write_scalars(step, {"train/loss": 1.0})  # elapsed 20, 30, 40, 50, 60
  rep.close()
  clock[0] = 5000.0  # the resumed process starts much later; step 3 was logged at 40 s
  rep = reporting.Reporter(workdir, {}, True, start_step=3, show_progress=False, started=4995.0)
  rep.write_scalars(4, {"train/loss": 1.0})
  rep.close()
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [(r["step"], r["time/elapsed_s"]) for r in rows] == [(1, 20), (2, 30), (3, 40), (4, 45)]


def test_non_main_process_writes_nothing(tmp_path):
  """Reporter on a non-main process creates no files and its calls are no-ops."""
  workdir = str(tmp_path / "other")
  rep = reporting.Reporter(workdir, {}, False, total_steps=5)
  rep.add_tokens(10, 5)
  rep.progress(1)
  rep.write_scalars(1, {"train/loss": 1.0})
  rep.close()
  assert not os.path.exists(workdir)


def test_throughput_and_mfu_rates(tmp_path):
  """Tokens/s and non-padding tokens/s are counts over wall time; MFU = flops*steps/time/peak."""
  rep = reporting.Reporter(str(tmp_path), {}, True, flops_per_step=1e9,
                           peak_flops_per_device=1e12, num_devices=2, show_progress=True,
                           total_steps=10)
  rep.reset_throughput()
  start = time.perf_counter()
  for step in range(1, 4):
    rep.add_tokens(100, 60)
    rep.progress(step)
  time.sleep(0.05)
  rates = rep.throughput()
  elapsed = time.perf_counter() - start
  assert 300 / elapsed <= rates["perf/tokens_per_sec"] <= 300 / 0.05
  assert rates["perf/nonpad_tokens_per_sec"] == pytest.approx(
      0.6 * rates["perf/tokens_per_sec"])
  assert rates["perf/mfu"] == pytest.approx(
      1e9 * rates["perf/steps_per_sec"] / (2 * 1e12))
  assert rep.throughput() == {}  # a new, empty window
  rep.write_scalars(3, {"train/loss": 1.0, **rates})
  rep.close()


def test_profile_context_traces_the_step_range(tmp_path):
  """maybe_profile writes a trace for steps [start, start + num) and nothing when off."""
  train = from_configdict(base.get_config()).train
  on = type("T", (), {"profile_start_step": 2, "profile_num_steps": 2})()
  logdir = str(tmp_path / "trace")
  for step in range(1, 5):
    with reporting.maybe_profile(step, on, logdir):
      jnp.ones((8, 8)).sum().block_until_ready()
  assert any(files for _, _, files in os.walk(logdir))
  with reporting.maybe_profile(1, train, str(tmp_path / "off")):
    pass
  assert not os.path.exists(tmp_path / "off")


def test_profile_context_resumed_inside_the_window(tmp_path):
  """A run resumed inside the profiling window traces from its first step and stops cleanly
  (no stop_trace without a start_trace)."""
  on = type("T", (), {"profile_start_step": 2, "profile_num_steps": 3})()
  logdir = str(tmp_path / "resumed")
  for step in range(3, 6):  # resumed at step 3: the window is 2, 3, 4
    with reporting.maybe_profile(step, on, logdir):
      jnp.ones((8, 8)).sum().block_until_ready()
  assert any(files for _, _, files in os.walk(logdir))
  assert not reporting._tracing  # pylint: disable=protected-access


def records_sha256_of_tsv(path):
  """The reference: (records, sha256) of a TSV file's pairs as tf.Examples built here, each with
  its `source` and `target` text features and serialized deterministically, in file order."""
  digest, count = hashlib.sha256(), 0
  with open(path, encoding="utf-8") as f:
    for line in f:
      source, target = line.rstrip("\n").split("\t")
      example = tf_example_pb2.Example()
      example.features.feature["source"].bytes_list.value.append(source.encode())
      example.features.feature["target"].bytes_list.value.append(target.encode())
      digest.update(example.SerializeToString(deterministic=True))
      count += 1
  return count, digest.hexdigest()


def test_training_records_the_fingerprint_of_the_data_it_read(tmp_path_factory):
  """A trained run's provenance.json holds the dataset, builder version and, per split, the
  number and sha256 of the records it read: equal to those of tf.Examples built here from the
  TSV files the data was prepared from, so the fingerprint is the records' content."""
  workdir = g2p_mini.trained_run(tmp_path_factory)
  data = json.load(open(os.path.join(workdir, "provenance.json")))["data"]
  cfg = json.load(open(os.path.join(workdir, "config.json")))["data"]
  assert data["dataset"].startswith("tsv_pairs/") and data["version"] == "1.1.0"
  assert set(data["splits"]) == {"train", "validation", "test"}
  tsv = {"train": cfg["train_file"], "validation": cfg["dev_file"], "test": cfg["test_file"]}
  for split, got in data["splits"].items():
    records, sha = records_sha256_of_tsv(tsv[split])
    assert got["files"] == 1 and (got["records"], got["records_sha256"]) == (records, sha)


def serialized_in_order(example, keys) -> bytes:
  """`example` serialized with its feature map's entries in the order of `keys`, as a preparing
  process may write it: each entry is a length-delimited field 1 of Features, and Features is
  field 1 of Example, so concatenating one-entry Features gives the same map in that order."""
  body = b""
  for key in keys:
    one = type(example.features)()
    one.feature[key].CopyFrom(example.features.feature[key])
    body += one.SerializeToString()
  length, size = b"", len(body)
  while True:  # the body's length as a protobuf varint
    length += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
    size >>= 7
    if not size:
      break
  return b"\x0a" + length + body


def test_the_same_records_in_other_bytes_have_one_fingerprint(tmp_path_factory, tmp_path):
  """The known flake's cause: protobuf (upb) serializes a tf.Example's feature map in an order
  that varies from process to process, so the same TSV prepared twice can give files that differ
  byte for byte. Here the trained run's test split is rewritten with every record's map in the
  other order (each record's bytes differ, checked, and each parses to the same Example): the
  fingerprint must equal the one the run recorded, and data_difference must see no difference."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  recorded = json.load(open(os.path.join(g2p_mini.trained_run(tmp_path_factory),
                                         "provenance.json")))["data"]
  copy = str(tmp_path / "copy")
  shutil.copytree(recorded["dir"], copy)
  [shard] = glob.glob(os.path.join(copy, "*-test.array_record-*"))
  reader = array_record_module.ArrayRecordReader(shard)
  raws = reader.read(0, reader.num_records())
  reader.close()
  writer = array_record_module.ArrayRecordWriter(shard, "group_size:1")
  for raw in raws:
    example = tf_example_pb2.Example.FromString(raw)
    keys = sorted(example.features.feature)
    other = serialized_in_order(example, keys)
    if other == raw:
      other = serialized_in_order(example, keys[::-1])
    assert other != raw and tf_example_pb2.Example.FromString(other) == example
    writer.write(other)
  writer.close()
  dataset = types.SimpleNamespace(root=copy, name=recorded["dataset"],
                                  splits=list(recorded["splits"]))
  now = provenance.data_fingerprint(types.SimpleNamespace(dataset=dataset), ["test"])
  assert now["splits"]["test"]["records"] == len(raws) > 0
  content = lambda split: (split["files"], split["records"], split["records_sha256"])  # noqa: E731
  assert content(now["splits"]["test"]) == content(recorded["splits"]["test"])
  assert provenance.data_difference(recorded, now, "test") is None


def test_eval_warns_in_one_line_when_the_data_differs_from_the_runs(tmp_path_factory, tmp_path,
                                                                     caplog):
  """evaluate() on the same data prepared in another data_dir says nothing; on a test split with
  one pronunciation changed it logs one warning line naming the split and provenance.json."""
  workdir = str(tmp_path / "run")
  shutil.copytree(g2p_mini.trained_run(tmp_path_factory), workdir)  # evaluate writes files

  def evaluate_on(directory, edit=None):
    cfg = from_configdict(g2p_mini.config(str(directory)))
    if edit:
      with open(cfg.data.test_file) as f:
        lines = f.readlines()
      with open(cfg.data.test_file, "w") as f:
        f.writelines([edit(lines[0])] + lines[1:])
    caplog.clear()
    task = load_task(cfg, workdir, process_index=0, process_count=1)
    evaluation.evaluate_split(workdir, "test", task=task, verbose=False)
    return [r.getMessage() for r in caplog.records if "not the run's" in r.getMessage()]

  assert evaluate_on(tmp_path / "same") == []
  warnings = evaluate_on(tmp_path / "edited", lambda line: line.replace("\t", "\tAH "))
  assert len(warnings) == 1 and "\n" not in warnings[0]
  assert " test (" in warnings[0] and "provenance.json" in warnings[0]


def test_data_difference_compares_content_not_location():
  """Two fingerprints of a split differ by their content (records, else files, bytes, sha256),
  not by the directory or the dataset's name (tsv_pairs names hold the files' paths); a split
  either side lacks, or no fingerprint, is nothing to compare. With records hashed on both
  sides, the files' bytes are not compared (the same records prepared twice may differ in
  bytes); against a run written before records were hashed, the keys both hold are."""
  split = {"files": 1, "bytes": 10, "sha256": "ab" * 32}
  run = {"dataset": "d/c", "version": "1.1.0", "dir": "/a", "splits": {"test": split}}
  moved = run | {"dir": "/b", "dataset": "d/e"}
  assert provenance.data_difference(run, moved, "test") is None
  assert provenance.data_difference(run, moved | {"splits": {"test": split | {"bytes": 11}}},
                                    "test")
  assert provenance.data_difference(
      run, moved | {"splits": {"test": split | {"sha256": "cd" * 32}}}, "test").endswith(
          "test (1 files, 10 bytes, sha256 abababababab)")
  assert provenance.data_difference(run, moved, "validation") is None
  assert provenance.data_difference(None, moved, "test") is None
  records = {"files": 1, "bytes": 10, "records": 5, "records_sha256": "ef" * 32}
  new = run | {"splits": {"test": records}}
  assert provenance.data_difference(new, new | {"splits": {"test": records | {"bytes": 12}}},
                                    "test") is None
  changed = new | {"splits": {"test": records | {"records_sha256": "01" * 32}}}
  assert provenance.data_difference(new, changed, "test").endswith(
      "test (1 files, 10 bytes, 5 records, records sha256 efefefefefef)")
  assert provenance.data_difference(run, new, "test") is None  # old run: files and bytes agree
  assert provenance.data_difference(run, new | {"splits": {"test": records | {"bytes": 12}}},
                                    "test")

def test_moe_flops_count_the_active_experts():
  """8 experts top-2 of hidden f: the router plus twice a dense FFN of hidden f (one shared
  expert: three times), the experts' other kernels idle."""
  common = dict(arch="decoder_only", vocab_size=13, d_model=16, num_heads=2, num_decoder_layers=1,
                mlp_dim=8)
  dense = model_config(**common, ffn="swiglu")
  one = reporting.model_flops_per_step(dense, 2, 4, 4)
  attention_and_head = one - 3 * 2 * (2 * 4) * 16 * 8 * 3  # fwd + bwd, 8 tokens, 3 d x f kernels
  for shared in (0, 1):
    moe = model_config(**common, ffn="moe", moe_num_experts=8, moe_top_k=2,
                       moe_num_shared_experts=shared)
    router = 3 * 2 * (2 * 4) * 16 * 8  # [d, experts]
    want = attention_and_head + (2 + shared) * (one - attention_and_head) + router
    assert reporting.model_flops_per_step(moe, 2, 4, 4) == want
