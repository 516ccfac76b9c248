r"""An lm-evaluation-harness curve logged during training: a character LM on Tiny Shakespeare
(configs/lm.py:nanogpt_cpu, --steps steps) scores two harness tasks built from the validation
text (the last 10%, never trained on) at every evaluation (eval.harness_tasks).

  flock /tmp/heavy.lock python benchmarks/harness_curve.py --text_file=tinyshakespeare.txt

The tasks (the harness's YAML over local JSON lines, written to a temporary directory):
`shakespeare_cloze`, multiple choice: 48 characters of a validation passage, then which of 4
continuations of ~12 characters (the true one, 3 from elsewhere in the validation text) follows
(chance 0.25); `shakespeare_text`, rolling log-likelihood of 8 validation passages of 1,000
characters (bits per byte). Writes record.json under --out with each evaluation's numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time

os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")

import jax  # noqa: E402

import commands  # noqa: E402  (benchmarks/ is the script's directory)
import transformer  # noqa: E402
from configs import lm  # noqa: E402

CONTEXT, CONTINUATION = 48, 12


def _cut(text: str, at: int, length: int) -> str:
  """`length` characters of `text` from `at`, extended to the end of the word."""
  end = at + length
  while end < len(text) and not text[end].isspace():
    end += 1
  return text[at:end]


def write_tasks(directory: str, validation: str, docs: int, seed: int = 0) -> None:
  """shakespeare_cloze (`docs` questions) and shakespeare_text in `directory`."""
  rnd = random.Random(seed)
  os.makedirs(os.path.join(directory, "data"), exist_ok=True)
  starts = [i for i in range(CONTEXT, len(validation) - 40) if validation[i] == " "]
  cloze = []
  for _ in range(docs):
    at = rnd.choice(starts)
    others = [_cut(validation, rnd.choice(starts), CONTINUATION) for _ in range(3)]
    choices = [_cut(validation, at, CONTINUATION)] + others
    order = list(range(4))
    rnd.shuffle(order)
    cloze.append({"context": validation[at - CONTEXT:at], "choices": [choices[i] for i in order],
                  "answer": order.index(0)})
  passages = [{"text": validation[i:i + 1000]} for i in range(0, 8000, 1000)]
  for name, rows in (("cloze", cloze), ("text", passages)):
    with open(os.path.join(directory, "data", f"{name}.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
  common = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 1.0\n"
  with open(os.path.join(directory, "shakespeare_cloze.yaml"), "w") as f:
    f.write(f"task: shakespeare_cloze\n{common}dataset_kwargs:\n  data_files:\n    test: "
            "data/cloze.jsonl\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
            "doc_to_choice: '{{choices}}'\ndoc_to_target: answer\ntarget_delimiter: ''\n"
            "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
  with open(os.path.join(directory, "shakespeare_text.yaml"), "w") as f:
    f.write(f"task: shakespeare_text\n{common}dataset_kwargs:\n  data_files:\n    test: "
            "data/text.jsonl\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\n"
            "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: bits_per_byte\n")


def main(argv: list[str] | None = None) -> int:
  """Trains the LM with the harness tasks in its evaluations; writes record.json."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--text_file", default=os.path.join(commands.REPO, "..", "shared", "data",
                                                          "tinyshakespeare.txt"))
  parser.add_argument("--out", default=os.path.join(commands.REPO, "docs", "results",
                                                     "harness_curve"))
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--every", type=int, default=50)
  parser.add_argument("--docs", type=int, default=100)
  args = parser.parse_args(argv)
  start = time.time()
  with open(args.text_file, encoding="utf-8") as f:
    text = f.read()
  validation = text[int(0.9 * len(text)):]  # data.train_fraction=0.9: the split never trained on
  with tempfile.TemporaryDirectory() as root:
    write_tasks(os.path.join(root, "tasks"), validation, args.docs)
    cd = lm.get_config("nanogpt_cpu")
    cd.data.update(dataset="text_files", text_file=os.path.abspath(args.text_file),
                   data_dir=os.path.join(root, "tfds"))
    cd.train.update(num_steps=args.steps, log_every_steps=args.every)
    cd.eval.update(every_steps=args.every, harness_tasks="shakespeare_cloze,shakespeare_text",
                   harness_include_path=os.path.join(root, "tasks"))
    cd.checkpoint.update(every_steps=args.steps)
    workdir = os.path.join(root, "run")
    transformer.train_and_evaluate(cd, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      logged = [json.loads(line) for line in f]
  metrics = {}
  for row in logged:
    if "eval/harness/shakespeare_cloze/acc" in row:
      step = row["step"]
      metrics[f"cloze_acc_step{step}"] = row["eval/harness/shakespeare_cloze/acc"]
      metrics[f"cloze_acc_norm_step{step}"] = row["eval/harness/shakespeare_cloze/acc_norm"]
      metrics[f"text_bits_per_byte_step{step}"] = row["eval/harness/shakespeare_text/bits_per_byte"]
      metrics[f"dev_loss_step{step}"] = row["eval/loss"]
      print(f"step {step:5d} cloze acc {metrics[f'cloze_acc_step{step}']:.3f} text bits/byte "
            f"{metrics[f'text_bits_per_byte_step{step}']:.3f} dev loss {row['eval/loss']:.3f}")
  record = {
      "name": "harness_curve",
      "title": "Harness accuracy and bits per byte logged during training (eval.harness_tasks): "
               "character LM, Tiny Shakespeare, validation-text tasks",
      "task": "Character LM (tiny Shakespeare); lm-evaluation-harness tasks on the validation text",
      "config": "configs/lm.py:nanogpt_cpu",
      "overrides": ["--config.data.dataset=text_files",
                    "--config.data.text_file=tinyshakespeare.txt",
                    f"--config.train.num_steps={args.steps}",
                    f"--config.eval.every_steps={args.every}",
                    "--config.eval.harness_tasks=shakespeare_cloze,shakespeare_text"],
      "command": f"flock /tmp/heavy.lock python benchmarks/harness_curve.py --steps={args.steps}",
      "commit": commands.git_commit(), "hardware": "2-core x86_64 CPU (shared)",
      "versions": {"jax": jax.__version__, "lm_eval": commands.versions("lm-eval")["lm-eval"],
                   "python": platform.python_version()},
      "wall_clock_s": round(time.time() - start, 1), "rates": {}, "metrics": metrics,
      "seeds": [0], "report": "docs/evaluation.md#a-harness-curve-during-training"}
  print(f"wrote {commands.write_record(args.out, record)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
