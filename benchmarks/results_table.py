r"""The README's results table, generated from the records in docs/results/<name>/record.json.

  python benchmarks/results_table.py                     # print the table (markdown)
  python benchmarks/results_table.py --check README.md   # exit 1 if README.md's table differs
  python benchmarks/results_table.py --write README.md   # rewrite README.md's table

ROWS names the records shown, in order, and the metrics each row shows. A record holds one
result (its command, hardware, wall clock and metrics; the schema is `load_record`'s); the table
sits in README.md between the lines `<!-- results:begin -->` and `<!-- results:end -->`, and
tests/docs/test_results_table.py fails when it differs from what this script generates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join("docs", "results")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

# (record name, the metrics of its "metrics" shown in the row), in the table's order. A metric
# is its key, labelled as metric_label says, or (key, label).
Metric = str | tuple[str, str]
ROWS: tuple[tuple[str, tuple[Metric, ...]], ...] = (
    ("g2p_tiny", ("dev_wer", "dev_per")),
    ("g2p_decoder_only_tiny", ("dev_wer", "dev_per")),
    ("g2p_fast_nodrop", ("test_wer", "test_per")),
    ("g2p_best", ("test_wer", "test_per")),
    ("gpu_h200/fast", ("test_wer", "test_per")),
    ("gpu_h200/best_do", ("test_wer", "test_per")),
    ("gpu_h200/small", ("test_wer", "test_per")),
    ("g2p_phonetisaurus", ("test_wer", "test_per")),
    ("g2p_flagship_dofast", ("test_wer", "test_per")),
    ("sweep_positional", (("test_wer_sinusoidal", "test WER: sinusoidal"),
                          ("test_wer_rope", "RoPE"), ("test_wer_alibi", "ALiBi"),
                          ("test_wer_none", "none"))),
    ("encoder_only", (("test_accuracy_scratch_1pct", "test accuracy, 1% of the labels: scratch"),
                      ("test_accuracy_mlm3000_1pct", "pretrained"))),
    ("lm_nanogpt_cpu", (("dev_loss", "val loss (nats/char)"),)),
    ("moe_vs_dense", (("moe_dev_loss", "val loss: 8 experts top-2"),
                      ("dense_dev_loss", "dense"), ("step_time_ratio", "step time ratio"))),
    ("scaling_isoflop", (("a2_loss_error_pct", "held-out budget's best loss, error: Approach 2"),
                         ("a3_loss_error_pct", "Approach 3"),
                         ("a2_size_ratio", "best size, ratio: Approach 2"),
                         ("a3_size_ratio", "Approach 3"))),
    ("vit_digits", (("test_accuracy_tiny", "test accuracy: `:tiny`"),
                    ("test_accuracy_default", "default"), ("test_accuracy_svc", "SVC"))),
    ("gpu_h200", (("gpt2s_bfloat16_fused_mfu_pct", "GPT-2 small, bf16, cuDNN attention: MFU"),
                  ("gpt2s_bfloat16_fused_tokens_per_s", "tokens/s"))),
)
SHOWN_OVERRIDES = ("model.", "train.", "data.")  # the overrides the config cell shows

REQUIRED = ("name", "title", "task", "config", "hardware", "wall_clock_s", "metrics", "report")
PERCENT = ("wer", "per", "accuracy", "mfu", "pct")  # a key with one of these parts is in percent
UPPER = {"wer": "WER", "per": "PER", "mfu": "MFU", "f1": "F1", "bleu": "BLEU"}
HEADER = ("| task | config | hardware | wall clock | result | report |",
          "|---|---|---|---|---|---|")


class RecordError(ValueError):
  """A record that is missing or does not follow the schema; the message is one line."""


def record_path(name: str, repo: str = REPO) -> str:
  """The path of record `name`'s record.json."""
  return os.path.join(repo, RESULTS, name, "record.json")


def load_record(name: str, repo: str = REPO) -> dict[str, Any]:
  """Record `name`: a JSON object with at least REQUIRED's keys, "name" equal to its directory
  and "metrics" an object; anything else is a RecordError naming the file."""
  path = record_path(name, repo)
  rel = os.path.relpath(path, repo)
  if not os.path.exists(path):
    raise RecordError(f"{rel}: no such record")
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except json.JSONDecodeError as e:
    raise RecordError(f"{rel}:{e.lineno}: not JSON ({e.msg})") from None
  if not isinstance(record, dict):
    raise RecordError(f"{rel}: not a JSON object")
  missing = [k for k in REQUIRED if k not in record]
  if missing:
    raise RecordError(f"{rel}: missing key {missing[0]!r}")
  if record["name"] != name:
    raise RecordError(f"{rel}: name {record['name']!r} is not its directory {name!r}")
  if not isinstance(record["metrics"], dict):
    raise RecordError(f"{rel}: 'metrics' is not an object")
  return record


def metric_label(key: str) -> str:
  """'test_wer' -> 'test WER', 'dev_loss' -> 'dev loss'."""
  return " ".join(UPPER.get(part, part) for part in key.split("_"))


def format_value(key: str, value: float) -> str:
  """A metric as the docs write it: percentages with one decimal, large counts with thousands
  separators, others with three decimals."""
  if set(key.replace("_per_s", "").split("_")) & set(PERCENT):  # tokens_per_s is a rate
    return f"{value:.1f}%"
  if abs(value) >= 1000:
    return f"{value:,.0f}"
  return f"{value:.3f}"


def format_metric(record: dict[str, Any], metric: Metric) -> str:
  """'test WER 26.1% (25.3-26.8%)': the label, the value, and the seeds' range where the record
  has one."""
  key, label = (metric, metric_label(metric)) if isinstance(metric, str) else metric
  if key not in record["metrics"]:
    rel = f"{RESULTS}/{record['name']}/record.json"
    raise RecordError(f"{rel}: no metric {key!r} (has {', '.join(record['metrics']) or 'none'})")
  value = record["metrics"][key]
  if value is None:
    return f"{label} unknown"
  text = f"{label} {format_value(key, value)}"
  spread = (record.get("spread") or {}).get(key)
  if spread:
    low, high = (format_value(key, v) for v in spread)
    text += f" ({low.rstrip('%')}-{high})"
  return text


def format_wall_clock(seconds: float | None) -> str:
  """'200 s', '45.2 min', '2.2 h', or '-' when unknown."""
  if seconds is None:
    return "-"
  if seconds < 120:
    return f"{seconds:.0f} s"
  if seconds < 120 * 60:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


def format_config(record: dict[str, Any]) -> str:
  """'`g2p.py:fast`' and the model, train and data overrides without their `--config.` prefix;
  for a record without a config, the script its command runs."""
  config = record["config"]
  if config is None:
    scripts = [w for w in record["command"].split() if w.endswith((".py", ".sh"))]
    return f"`{scripts[0]}`" if scripts else "-"
  overrides = [o.removeprefix("--config.") for o in record.get("overrides") or []]
  shown = [o for o in overrides if o.startswith(SHOWN_OVERRIDES)]
  return " ".join(f"`{c}`" for c in [config.removeprefix("configs/"), *shown])


def row(record: dict[str, Any], keys: tuple[Metric, ...]) -> str:
  """One markdown row: task, config, hardware, wall clock, the metrics, links to the report
  and the record."""
  seeds = record.get("seeds") or []
  result = ", ".join(format_metric(record, k) for k in keys)
  if len(seeds) > 1:
    result += f"; {len(seeds)} seeds"
  page = record["report"].partition("#")[0]
  report = (f"[{os.path.splitext(os.path.basename(page))[0]}]({record['report']}), "
            f"[record]({RESULTS}/{record['name']}/record.json)")
  cells = (record["task"], format_config(record), record["hardware"],
           format_wall_clock(record["wall_clock_s"]), result, report)
  return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def table(rows: tuple[tuple[str, tuple[Metric, ...]], ...] | None = None,
          repo: str | None = None) -> str:
  """The markdown table of `rows` (default ROWS) from the records under `repo` (default REPO)."""
  rows, repo = rows or ROWS, repo or REPO
  return "\n".join([*HEADER, *(row(load_record(name, repo), keys) for name, keys in rows)])


def split_readme(text: str, path: str = "README.md") -> tuple[str, str, str]:
  """(before, the table between the markers, after); a RecordError when a marker is missing."""
  if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
    raise RecordError(f"{path}: needs one {BEGIN} line followed by one {END} line")
  before, _, rest = text.partition(BEGIN)
  inside, _, after = rest.partition(END)
  return before + BEGIN + "\n", inside.strip("\n"), "\n" + END + after


def difference(written: str, generated: str) -> str:
  """'' when equal, else one line naming the first differing row of the two tables."""
  old, new = written.splitlines(), generated.splitlines()
  for i in range(max(len(old), len(new))):
    a = old[i] if i < len(old) else "(no row)"
    b = new[i] if i < len(new) else "(no row)"
    if a != b:
      return f"line {i + 1} of the table: README has {a!r}, the records give {b!r}"
  return ""


def main(argv: list[str] | None = None) -> int:
  """Prints, checks or writes the table; 1 on a difference (--check) or a bad record."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--check", metavar="README", help="exit 1 if this file's table differs")
  group.add_argument("--write", metavar="README", help="rewrite this file's table")
  args = parser.parse_args(argv)
  try:
    generated = table()
    if not (args.check or args.write):
      print(generated)
      return 0
    path = args.check or args.write
    with open(path, encoding="utf-8") as f:
      text = f.read()
    before, written, after = split_readme(text, path)
  except (RecordError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if args.check:
    diff = difference(written, generated)
    if diff:
      print(f"{path}: results table differs from docs/results ({diff}); "
            f"run python benchmarks/results_table.py --write {path}", file=sys.stderr)
      return 1
    print(f"{path}: results table matches docs/results ({len(ROWS)} rows)")
    return 0
  with open(path, "w", encoding="utf-8") as f:
    f.write(before + generated + after)
  print(f"{path}: results table written ({len(ROWS)} rows)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
