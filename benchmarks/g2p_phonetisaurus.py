r"""Phonetisaurus (joint-sequence n-gram WFST) on our `cmudict_g2p` split: the published baseline,
run on the same words and scored by the same WER/PER code as our models.

  pip install phonetisaurus==0.3.0        # prebuilt Phonetisaurus/OpenFst/MITLM binaries, x86-64
  python benchmarks/g2p_phonetisaurus.py --work_dir=runs/phonetisaurus
  python benchmarks/g2p_phonetisaurus.py --work_dir=runs/phonetisaurus --ngram_order=7

The literature quotes Phonetisaurus at 24.4% WER on the CMUdict split of the G2P papers (106,837
training words, 12,000 test words); the G2P goals (docs/g2p.md) are set against that number,
so this script measures what the same system scores on *our* split (`transformer/data/cmudict.py`:
the same cleaning, stress removed, the same salted-hash split, the training words alone for
training). The recipe is Phonetisaurus's own for CMUdict: `phonetisaurus-train --seq2_del` (EM
alignment with up to 2 letters to 2 phones per chunk, deletions on the phone side, an order-8
Kneser-Ney joint n-gram by MITLM), then the 1-best of `phonetisaurus-apply` for every word of the
validation and test splits. Scoring is `transformer.metrics.wer_per`, the function that scores our
models: a word is right if the hypothesis equals any of its reference pronunciations; a word that
gets no hypothesis counts as an empty one (wrong, every reference phone an error).

Prints one table row per split and writes `<work_dir>/results.json` (metrics, seconds, versions).
Runs on one core; its time is not a claim unless nothing else was running.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time

import commands  # benchmarks/ is the script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from transformer import metrics  # pylint: disable=wrong-import-position
from transformer.data import cmudict  # pylint: disable=wrong-import-position


def environment() -> dict[str, str]:
  """PATH / LD_LIBRARY_PATH of the `phonetisaurus` wheel's binaries, or a one-line exit."""
  try:
    import phonetisaurus  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise SystemExit("g2p_phonetisaurus: needs the phonetisaurus wheel: "
                     "pip install phonetisaurus==0.3.0") from None
  return phonetisaurus.guess_environment()


def write_lexicon(words: dict[str, list[str]], path: str) -> int:
  """Writes `word<TAB>phones` lines, one per pronunciation (every variant of a word), sorted by
  word; returns the number of lines."""
  lines = [f"{word}\t{pron}" for word in sorted(words) for pron in words[word]]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return len(lines)


def read_hypotheses(text: str) -> dict[str, list[str]]:
  """`phonetisaurus-apply` output (`word phone phone ...` per line, 1-best) -> word -> phones."""
  out = {}
  for line in text.splitlines():
    parts = line.split()
    if parts and parts[0] not in out:
      out[parts[0]] = parts[1:]
  return out


def score(words: dict[str, list[str]], hypotheses: dict[str, list[str]]) -> dict[str, float]:
  """WER / PER of `hypotheses` against every reference of `words` (a missing word: empty)."""
  order = sorted(words)
  wer, per = metrics.wer_per([hypotheses.get(w, []) for w in order],
                             [[p.split() for p in words[w]] for w in order])
  return {"wer": wer, "per": per, "words": len(order),
          "missing": sum(w not in hypotheses for w in order)}


def _run(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> str:
  """Runs one Phonetisaurus binary; its stdout, or a one-line exit naming it and its last line."""
  proc = commands.run(cmd, cwd=cwd, env=env)
  if proc.returncode:
    raise SystemExit(f"g2p_phonetisaurus: {cmd[0]} {commands.failure(proc)}")
  return proc.stdout


def train(lexicon: str, work_dir: str, ngram_order: int, env: dict[str, str]) -> str:
  """`phonetisaurus-train --seq2_del` on a lexicon file; returns the path of the model's FST."""
  _run(["phonetisaurus-train", "--lexicon", os.path.abspath(lexicon), "--seq2_del",
        "--ngram_order", str(ngram_order), "--dir_prefix", "train"], env, cwd=work_dir)
  model = os.path.join(work_dir, "train", "model.fst")
  if not os.path.exists(model):
    raise SystemExit(f"g2p_phonetisaurus: phonetisaurus-train wrote no {model}")
  return model


def apply(model: str, words: list[str], path: str, env: dict[str, str]) -> str:
  """The 1-best `phonetisaurus-apply` output for `words` (written to `path` first, one a line)."""
  with open(path, "w") as f:
    f.write("\n".join(words) + "\n")
  return _run(["phonetisaurus-apply", "--model", model, "--word_list", path, "--nbest", "1"], env)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--work_dir", required=True, help="lexicons, the model and results.json")
  parser.add_argument("--ngram_order", type=int, default=8)
  parser.add_argument("--splits", default="validation,test")
  args = parser.parse_args(argv)
  unknown = set(args.splits.split(",")) - {"validation", "test"}
  if unknown:
    parser.error(f"--splits: {sorted(unknown)} not among validation, test")
  env = environment()
  os.makedirs(args.work_dir, exist_ok=True)
  splits = cmudict.load_splits(stress=False)
  lexicon = os.path.join(args.work_dir, "train.lexicon")
  lines = write_lexicon(splits["train"], lexicon)
  start = time.time()
  model = train(lexicon, args.work_dir, args.ngram_order, env)
  trained = time.time()
  results = {"ngram_order": args.ngram_order, "train_lines": lines,
             "train_words": len(splits["train"]), "train_s": round(trained - start, 1),
             "phonetisaurus": importlib.metadata.version("phonetisaurus"), "splits": {}}
  print(f"trained on {len(splits['train'])} words ({lines} pronunciations) in "
        f"{trained - start:.0f} s; order {args.ngram_order}")
  print("| split | words | WER | PER | seconds |\n|---|---|---|---|---|")
  for split in args.splits.split(","):
    words = splits[split]
    t0 = time.time()
    out = apply(model, sorted(words), os.path.join(args.work_dir, f"{split}.words"), env)
    with open(os.path.join(args.work_dir, f"{split}.hyp"), "w") as f:
      f.write(out)
    res = score(words, read_hypotheses(out)) | {"seconds": round(time.time() - t0, 1)}
    results["splits"][split] = res
    print(f"| {split} | {res['words']} | {res['wer']:.2%} | {res['per']:.2%} | "
          f"{res['seconds']:.0f} |", flush=True)
  with open(os.path.join(args.work_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
