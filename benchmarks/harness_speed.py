r"""lm-evaluation-harness requests per second: our `RunLM` against the harness's `hf` backend on
the same CPU, the same model and the same local tasks.

  flock /tmp/heavy.lock python benchmarks/harness_speed.py --out=docs/results/harness_speed

The model: a GPT-2 (d_model 256, 4 layers, 4 heads, 256 positions, random weights, a byte-pair
vocabulary of 100 trained here; hf_probabilities' builder's shape, larger) built in torch,
converted with `convert.from_hf`. The tasks, written to a temporary directory in the harness's
YAML format over local JSON lines: multiple choice (--docs questions, 4 choices each: 4 requests),
rolling perplexity (--docs // 8 documents of ~600 tokens: 3 windows each) and greedy generation
(--docs // 4 prompts, 16 tokens). The harness runs the same requests through HFLM (device="cpu",
float32) at its default batch size (1) and at each of --hf_batch_sizes, and through RunLM cold
(compiling its bucket shapes) and warm (a second pass). Requests per second: the task's requests
over the wall time of simple_evaluate on that one task. Both backends' answers are compared too:
the largest |log-likelihood difference|, the fraction of equal greedy flags and generations. Writes record.json under --out.
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
import torch  # noqa: E402
import transformers  # noqa: E402

import commands  # noqa: E402  (benchmarks/ is the script's directory)
import hf_probabilities  # noqa: E402
import transformer  # noqa: E402
from transformer import convert  # noqa: E402

TASKS = ("speed_choice", "speed_text", "speed_generate")
WORDS = (["the cat", "a dog", "my friend", "the old man", "she"],
         ["sees", "likes", "finds", "eats", "wants"],
         ["the mat.", "a red ball.", "some fish.", "the moon.", "it."])


def sentence(rnd: random.Random) -> str:
  """One sentence of the tiny corpus' kind."""
  return " ".join(rnd.choice(w) for w in WORDS)


def write_tasks(directory: str, docs: int, seed: int = 0) -> None:
  """The three tasks' YAML and data files in `directory`."""
  rnd = random.Random(seed)
  os.makedirs(os.path.join(directory, "data"), exist_ok=True)
  rows = {
      "choice": [{"question": f"{rnd.choice(WORDS[0])} {rnd.choice(WORDS[1])}",
                  "choices": rnd.sample(WORDS[2], 4), "answer": rnd.randrange(4)}
                 for _ in range(docs)],
      "text": [{"text": " ".join(sentence(rnd) for _ in range(150))} for _ in range(docs // 8)],
      "generate": [{"prompt": " ".join(sentence(rnd) for _ in range(3)), "answer": ""}
                   for _ in range(docs // 4)]}
  for name, items in rows.items():
    with open(os.path.join(directory, "data", f"{name}.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in items)
  common = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 1.0\n"
  specs = {
      "choice": "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
                "doc_to_choice: '{{choices}}'\ndoc_to_target: answer\n"
                "metric_list:\n  - metric: acc\n",
      "text": "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
              "metric_list:\n  - metric: bits_per_byte\n",
      "generate": "output_type: generate_until\ndoc_to_text: '{{prompt}}'\n"
                  "doc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: ['\\n\\n']\n"
                  "  max_gen_toks: 16\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n"}
  for name, spec in specs.items():
    with open(os.path.join(directory, f"speed_{name}.yaml"), "w") as f:
      f.write(f"task: speed_{name}\n{common}dataset_kwargs:\n  data_files:\n"
              f"    test: {os.path.join(directory, 'data', name + '.jsonl')}\n{spec}")


def build_model(directory: str) -> tuple[torch.nn.Module, object]:
  """(the GPT-2, its transformers tokenizer), saved in `directory` with tokenizer.json."""
  torch.manual_seed(0)
  tok = hf_probabilities.tokenizer("gpt2", hf_probabilities.corpus())
  eot = tok.token_to_id(hf_probabilities.EOT)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=tok.get_vocab_size(), n_positions=256, n_embd=256, n_layer=4, n_head=4,
      bos_token_id=eot, eos_token_id=eot, resid_pdrop=0.0, embd_pdrop=0.0,
      attn_pdrop=0.0)).eval()
  model.save_pretrained(directory)
  tok.save(os.path.join(directory, "tokenizer.json"))
  hf_tok = transformers.PreTrainedTokenizerFast(
      tokenizer_file=os.path.join(directory, "tokenizer.json"), bos_token=hf_probabilities.EOT,
      eos_token=hf_probabilities.EOT)
  return model, hf_tok


def timed(lm, task: str, manager, tasks: dict) -> tuple[float, int, dict]:
  """(seconds, requests, results) of simple_evaluate of one task."""
  from lm_eval import simple_evaluate
  start = time.perf_counter()
  results = simple_evaluate(lm, tasks=[tasks[task]], task_manager=manager, log_samples=True,
                            bootstrap_iters=0)
  seconds = time.perf_counter() - start
  requests = sum(len(s["resps"]) for s in results["samples"][task])
  if task == "speed_text":  # a rolling request is a document; count its windows' passes too
    requests = len(results["samples"][task])
  return seconds, requests, results


def summarize(metrics: dict, names: list[str], outputs: dict) -> None:
  """Adds each task's best hf batch size and rate, our speedups, and |ours - hf|."""
  for task in TASKS:
    hf = {n: metrics[f"{task}_{n}_requests_per_s"] for n in names if n.startswith("hf_")}
    best = max(hf, key=hf.get)
    metrics[f"{task}_hf_best_requests_per_s"] = hf[best]
    metrics[f"{task}_hf_best_batch_size"] = int(best.removeprefix("hf_bs"))
    metrics[f"{task}_speedup_warm_vs_hf_default"] = round(
        metrics[f"{task}_ours_warm_requests_per_s"] / hf["hf_bs1"], 2)
    metrics[f"{task}_speedup_warm_vs_hf_best"] = round(
        metrics[f"{task}_ours_warm_requests_per_s"] / hf[best], 2)
    metrics[f"{task}_speedup_cold_vs_hf_best"] = round(
        metrics[f"{task}_ours_cold_requests_per_s"] / hf[best], 2)
    for key, value in outputs[("ours_warm", task)].items():  # the same numbers from both
      metrics[f"{key.replace('/', '_')}_abs_diff_ours_vs_hf"] = abs(
          value - outputs[("hf_bs1", task)][key])
    ours, hf = outputs[("ours_warm", task, "answers")], outputs[("hf_bs1", task, "answers")]
    if task == "speed_generate":
      metrics[f"{task}_same_text_fraction"] = sum(a == b for a, b in zip(ours, hf)) / len(hf)
      continue
    logp = [(a[0], b[0]) if task == "speed_choice" else (a, b) for a, b in zip(ours, hf)]
    metrics[f"{task}_max_abs_loglikelihood_diff"] = max(abs(a - b) for a, b in logp)
    if task == "speed_choice":
      same = sum(a[1] == b[1] for a, b in zip(ours, hf))
      metrics[f"{task}_same_greedy_fraction"] = same / len(hf)


def main(argv: list[str] | None = None) -> int:
  """Measures every backend on every task; writes record.json."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(commands.REPO, "docs", "results",
                                                     "harness_speed"))
  parser.add_argument("--docs", type=int, default=120)
  parser.add_argument("--hf_batch_sizes", default="16,64")
  args = parser.parse_args(argv)
  from lm_eval.models.huggingface import HFLM
  from transformer.infer.harness import tasks as harness
  start = time.time()
  metrics, rates = {}, {}
  with tempfile.TemporaryDirectory() as root:
    write_tasks(os.path.join(root, "tasks"), args.docs)
    model, hf_tok = build_model(os.path.join(root, "gpt2"))
    convert.from_hf(os.path.join(root, "gpt2"), os.path.join(root, "run"))
    manager, loaded = harness.load_tasks(list(TASKS), os.path.join(root, "tasks"), False)
    tasks = {name: t for item in loaded for name, t in item["tasks"].items()}
    ours = harness.lm_of(transformer.restore(os.path.join(root, "run")))
    backends = [("ours_cold", ours), ("ours_warm", ours), ("hf_bs1", HFLM(
        pretrained=model, tokenizer=hf_tok, device="cpu", batch_size=1))]
    backends += [(f"hf_bs{b}", HFLM(pretrained=model, tokenizer=hf_tok, device="cpu",
                                    batch_size=int(b))) for b in args.hf_batch_sizes.split(",")]
    outputs = {}
    for name, lm in backends:
      for task in TASKS:
        seconds, requests, results = timed(lm, task, manager, tasks)
        metrics[f"{task}_{name}_requests_per_s"] = round(requests / seconds, 2)
        metrics[f"{task}_requests"] = requests
        outputs[(name, task)] = harness.flat_metrics(results)
        outputs[(name, task, "answers")] = [r[0] for d in sorted(
            results["samples"][task], key=lambda d: d["doc_id"]) for r in d["resps"]]
        print(f"{task:15s} {name:9s} {requests:4d} requests {seconds:7.2f} s "
              f"{requests / seconds:8.2f} /s {outputs[(name, task)]}", flush=True)
  summarize(metrics, [n for n, _ in backends], outputs)
  record = {
      "name": "harness_speed",
      "title": "lm-evaluation-harness requests per second: RunLM against the harness's hf backend "
               "(batch size 1 and its best), same CPU, model and tasks",
      "task": "lm-evaluation-harness local tasks (multiple choice, rolling perplexity, greedy "
              "generation) on a converted GPT-2 (d_model 256, 4 layers, random weights)",
      "config": None, "overrides": [],
      "command": "flock /tmp/heavy.lock python benchmarks/harness_speed.py",
      "commit": commands.git_commit(), "hardware": "2-core x86_64 CPU (shared)",
      "versions": {"jax": jax.__version__, "torch": torch.__version__,
                   "transformers": transformers.__version__,
                   "lm_eval": commands.versions("lm-eval")["lm-eval"],
                   "python": platform.python_version()},
      "wall_clock_s": round(time.time() - start, 1), "rates": rates, "metrics": metrics,
      "seeds": [0], "report": "docs/evaluation.md#speed"}
  print(f"wrote {commands.write_record(args.out, record)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
