"""Records of one accelerator session (benchmarks/accelerator_session.sh): docs/results' schema,
written from the raw outputs of its parts, each record's raw output copied beside it.

  python benchmarks/session_records.py --work=WORK --out=OUT/results --command="..." --commit=SHA

WORK holds what the parts wrote: accelerator_gpt2s.json, accelerator_gpt2m.json and
accelerator_xla.json (benchmarks/accelerator.py --json_out), speed.json (its --train_g2p runs),
members.json (the 8-seed ratio, when measured) and quality/summary.json
(benchmarks/g2p_flagship.py). A part that left nothing gets no record and a line saying so.
Records, named after the device (e.g. gpu_h100_mfu):
  <dev>_mfu        MFU, ms/step, tokens/s and the ratio to the baseline of every lever at GPT-2
                   small's and medium's widths, and the XLA-flags run (xla_*: its ratio is to
                   the same variant without the flags) (raw.json: all three)
  <dev>_g2p_speed  configs/g2p.py:fast's steps/s trained by train.py at each steps_per_dispatch,
                   and its step alone on random batches (raw.json)
  <dev>_members    8 seeds in one program against one seed's wall clock (raw.json)
  <dev>_g2p_gpu    configs/g2p.py:gpu start to finish, one seed (summary.json)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil

TASK = "G2P (CMUdict)"


def device_slug(device_kind: str) -> str:
  """'NVIDIA H100 80GB HBM3' -> 'gpu_h100'; a CPU -> 'cpu'."""
  found = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]*)\b", device_kind or "")
  if device_kind.lower().startswith("cpu") or not found:
    return "cpu"
  return f"gpu_{found.group(1).lower()}"


def slug(text: str) -> str:
  """'causal_kernel=True,rows=32' -> 'causal_kernel_true_rows_32'."""
  return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _load(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def base_record(name: str, title: str, task: str, config: str | None, args, raw: dict | None,
                overrides: list[str] | None = None) -> dict:
  """The fields every record shares; hardware and versions from the raw output's device."""
  device = (raw or {}).get("device") or args.device
  return {"name": name, "title": title, "task": task, "config": config,
          "overrides": overrides or [], "command": args.command, "commit": args.commit or None,
          "hardware": f"1x {device}" if device and not device.lower().startswith("cpu")
                      else "x86_64 CPU",
          "versions": args.versions or None, "wall_clock_s": None, "rates": {}, "metrics": {},
          "seeds": [], "report": "docs/performance.md#gpu-targets"}


def variant_key(r: dict) -> str:
  """<size>_<dtype>_<attention>_<variant> of one accelerator.py result."""
  return f"{r['size']}_{r['dtype']}_{r['attention']}_{slug(r['variant'])}"


def step_metrics(raw: dict, prefix: str = "") -> dict:
  """Flat metrics of accelerator.py's results: <variant_key>_{mfu_pct,ms_per_step,...}; a
  result's ratio is against the first variant of its own run."""
  out = {}
  for r in raw.get("results", []):
    key = prefix + variant_key(r)
    out[f"{key}_ms_per_step"] = round(r["ms_per_step"], 3)
    out[f"{key}_tokens_per_s"] = round(r["tokens_per_s"])
    out[f"{key}_tflops"] = round(r["tflops"], 1)
    out[f"{key}_mfu_pct"] = round(100 * r["mfu"], 1) if r.get("mfu") is not None else None
    out[f"{key}_ratio"] = round(r["ratio_to_first"], 3)
    out[f"{key}_temp_gib"] = (round(r["temp_bytes"] / 2**30, 2)
                              if r.get("temp_bytes") is not None else None)
  for dtype, tflops in raw.get("matmul_tflops", {}).items():
    out[f"{prefix}matmul_{dtype}_tflops"] = round(tflops)
  return out


def mfu_record(args, work: str) -> tuple[dict, dict] | None:
  raws = {k: _load(os.path.join(work, f"accelerator_{k}.json")) for k in ("gpt2s", "gpt2m", "xla")}
  present = {k: v for k, v in raws.items() if v is not None}
  if not present:
    return None
  first = next(iter(present.values()))
  name = f"{args.prefix}{device_slug(first['device'])}_mfu"
  flags = (raws["xla"] or {}).get("xla_flags", "")
  record = base_record(name, f"Train steps on 1x {first['device']}: GPT-2 small's and medium's "
                       "widths in bfloat16, the baseline and each lever (MFU, same-run ratios)",
                       "Decoder-only LM train step (random ids)", None, args, first,
                       [f"XLA_FLAGS={flags} (xla_* metrics only)"] if flags else [])
  for key in ("gpt2s", "gpt2m"):
    if raws[key]:
      record["metrics"] |= step_metrics(raws[key])
  if raws["xla"]:
    record["metrics"] |= step_metrics(raws["xla"], prefix="xla_")
    # Its ratio: against the same variant without the flags (the gpt2s part, same machine).
    plain = {variant_key(r): r for r in (raws["gpt2s"] or {}).get("results", [])}
    for r in raws["xla"].get("results", []):
      match = plain.get(variant_key(r))
      record["metrics"][f"xla_{variant_key(r)}_ratio"] = (
          round(r["tokens_per_s"] / match["tokens_per_s"], 3) if match else None)
  best = max((r for k in ("gpt2s", "gpt2m") for r in (raws[k] or {}).get("results", [])
              if r["size"] == "gpt2s"), key=lambda r: r["tokens_per_s"], default=None)
  if best:
    record["rates"] = {"steps_per_s": round(1e3 / best["ms_per_step"], 2),
                       "tokens_per_s": round(best["tokens_per_s"])}
  return record, present


def speed_record(args, work: str) -> tuple[dict, dict] | None:
  raw = _load(os.path.join(work, "speed.json"))
  if raw is None:
    return None
  name = f"{args.prefix}{device_slug(raw['device'])}_g2p_speed"
  record = base_record(name, f"configs/g2p.py:fast's steps/s on 1x {raw['device']}: train.py at "
                       "each train.steps_per_dispatch (data.prefetch 2), and its step alone",
                       TASK, "configs/g2p.py:fast", args, raw)
  for run in raw.get("g2p_train", []):
    k, rate = run["steps_per_dispatch"], run["steps_per_s"]
    record["metrics"][f"fast_k{k}_steps_per_s"] = round(rate, 1) if rate is not None else None
  for r in raw.get("results", []):
    record["metrics"][f"fast_step_{slug(r['variant'])}_steps_per_s"] = round(
        1e3 / r["ms_per_step"], 1)
  rates = [run["steps_per_s"] for run in raw.get("g2p_train", []) if run["steps_per_s"]]
  if rates:
    record["rates"] = {"steps_per_s": round(max(rates), 1)}
  return record, raw


def members_record(args, work: str) -> tuple[dict, dict] | None:
  raw = _load(os.path.join(work, "members.json"))
  if raw is None:
    return None
  name = f"{args.prefix}{device_slug(args.device)}_members"
  record = base_record(name, f"{raw['members']} seeds of configs/g2p.py:fast in one program "
                       "against one seed's wall clock (train.py, the same steps)", TASK,
                       "configs/g2p.py:fast", args, None)
  one, all_ = raw["one_done"] - raw["start"], raw["all_done"] - raw["one_done"]
  record["metrics"] = {"members_wall_clock_ratio": round(all_ / one, 3)}
  record["wall_clock_s"] = round(all_, 1)
  return record, raw


def quality_record(args, work: str) -> tuple[dict, dict] | None:
  summary = _load(os.path.join(work, "quality", "summary.json"))
  if summary is None or not summary.get("seeds"):
    return None
  seeds = sorted(summary["seeds"].values(), key=lambda e: e["seed"])
  name = f"{args.prefix}{device_slug(args.device)}_g2p_gpu"
  record = base_record(name, f"configs/g2p.py:gpu on 1x {args.device}, start to finish "
                       "(train with dev evaluations, the best checkpoint on test)", TASK,
                       summary["config"], args, None, summary.get("extra"))
  entry = seeds[0]
  pct = lambda v: round(100 * v, 2) if v is not None else None
  record["metrics"] = {"dev_wer": pct(entry["validation"].get("wer")),
                       "dev_per": pct(entry["validation"].get("per")),
                       "test_wer": pct(entry["test"].get("wer")),
                       "test_per": pct(entry["test"].get("per"))}
  record["wall_clock_s"] = entry["wall_clock_s"]
  ensembles = summary.get("ensembles") or {}
  if ensembles:  # seeds as one members program (g2p_flagship.py --members --ensemble): the largest
    largest = max(ensembles.values(), key=lambda e: len(e["seeds"]))
    record["metrics"] |= {"dev_wer_ensemble": pct(largest["validation"].get("wer")),
                          "test_wer_ensemble": pct(largest["test"].get("wer")),
                          "test_per_ensemble": pct(largest["test"].get("per")),
                          "ensemble_size": len(largest["seeds"])}
    record["wall_clock_s"] = largest["wall_clock_s"]
  record["seeds"] = [e["seed"] for e in seeds]
  record["report"] = "docs/g2p.md"
  return record, summary


def write(out: str, record: dict, raw: dict, raw_name: str) -> str:
  """record.json and the raw output under out/<name>/; returns the record's path."""
  directory = os.path.join(out, record["name"])
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, raw_name), "w") as f:
    json.dump(raw, f, indent=1)
  path = os.path.join(directory, "record.json")
  with open(path, "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
  return path


def main(argv: list[str] | None = None) -> list[str]:
  """Writes every record the raw outputs allow; returns their paths."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--work", required=True, help="the parts' raw outputs")
  parser.add_argument("--out", required=True, help="records go to OUT/<name>/record.json")
  parser.add_argument("--command", default="", help="the session's command, as run")
  parser.add_argument("--commit", default="")
  parser.add_argument("--device", default="", help="the device's name (nvidia-smi)")
  parser.add_argument("--versions", default="{}", help="JSON {package: version}")
  parser.add_argument("--prefix", default="", help="prefixed to every record's name (smoke_)")
  args = parser.parse_args(argv)
  args.versions = json.loads(args.versions)
  written = []
  for label, make, raw_name in (("mfu", mfu_record, "raw.json"),
                                ("g2p speed", speed_record, "raw.json"),
                                ("members", members_record, "raw.json"),
                                ("g2p quality", quality_record, "summary.json")):
    made = make(args, args.work)
    if made is None:
      print(f"session_records: {label}: no raw output in {args.work}; no record")
      continue
    written.append(write(args.out, made[0], made[1], raw_name))
    print(f"session_records: {label}: {written[-1]}")
  return written


if __name__ == "__main__":
  main()
