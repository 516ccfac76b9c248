"""transformer/infer/harness: our lm-evaluation-harness LM equals the harness's reference `hf`
backend on the same weights, request for request, offline.

A tiny GPT-2, a tiny Llama and a tiny T5 (benchmarks/hf_probabilities.build: built in torch from
a config class, trained a few steps, no download; the Llama's tokenizer.json adds <s> and the
T5's </s> as real ones do) are converted with `convert.from_hf`; the harness's own HFLM
(device="cpu"; T5 through its seq2seq path: the context into the encoder) runs on the torch
model, `RunLM` on the converted workdir, both on the local tasks in harness_tasks/ (multiple
choice, rolling perplexity, generation). Every loglikelihood request's log-probability agrees to
1e-3 and its greedy flag exactly, every document's rolling log-likelihood to 1e-3, every
generation is the same string, and the task metrics are equal. The Llama and T5 cases are slow
(about 40 s each on 2 cores: `pytest -m slow tests/infer/test_harness.py`).
"""

import json
import os
import sys

import pytest

os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")  # before `datasets` is imported
lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.infer.harness import tasks as harness  # noqa: E402
from transformer.run.restore import EvaluationError  # noqa: E402
from bench_loader import load_benchmark  # noqa: E402

bench = load_benchmark("hf_probabilities")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TASKS_DIR = os.path.join(HERE, "harness_tasks")
TASKS = ["tiny_choice", "tiny_text", "tiny_generate"]


def hf_tokenizer(directory: str, tok, hf_config: dict):
  """transformers' tokenizer of the saved tokenizer.json, its BOS and EOS config.json's ids."""
  def name(key):
    return tok.id_to_token(hf_config[key]) if hf_config.get(key) is not None else None
  return transformers.PreTrainedTokenizerFast(
      tokenizer_file=os.path.join(directory, "tokenizer.json"), bos_token=name("bos_token_id"),
      eos_token=name("eos_token_id"))


# Each tokenizer.json's post-processor as a real one's: a Llama tokenizer puts <s> first, a T5
# tokenizer </s> last (their ids in hf_probabilities' tokenizers).
POST_PROCESSORS = {"llama2": ("<s> $A", ("<s>", 1)), "t5": ("$A </s>", ("</s>", 1))}


def converted(root, family: str):
  """(torch model, transformers tokenizer, our converted workdir) of a tiny trained `family`."""
  directory, workdir = str(root / family), str(root / f"{family}_run")
  model, tok = bench.build(family, True, directory)
  if family in POST_PROCESSORS:
    from tokenizers import processors
    single, special = POST_PROCESSORS[family]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[special])
    tok.save(os.path.join(directory, "tokenizer.json"))
  convert.from_hf(directory, workdir)
  if family == "t5":
    return model, transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(directory, "tokenizer.json"), eos_token="</s>",
        pad_token="<pad>", unk_token="<unk>"), workdir
  with open(os.path.join(directory, "config.json")) as f:
    return model, hf_tokenizer(directory, tok, json.load(f)), workdir


def reference_lm(family: str, model, tok, max_len: int):
  """The harness's HFLM on the torch model. T5 (its seq2seq path): batch size 1, where its
  generation length (context + max_gen_toks, the batch's longest context) is each request's own,
  our max_len (transformers' T5 config states none), and its untied head put back after HFLM's
  tie_weights() (transformers 5 ties a T5's head to the embeddings regardless of the config)."""
  from lm_eval.models.huggingface import HFLM
  if family != "t5":
    return HFLM(pretrained=model, tokenizer=tok, device="cpu", batch_size=4)
  head = model.lm_head.weight.detach().clone()
  lm = HFLM(pretrained=model, tokenizer=tok, device="cpu", batch_size=1, max_length=max_len)
  model.lm_head.weight = torch.nn.Parameter(head)
  return lm


@pytest.fixture(scope="module", params=["gpt2", pytest.param("llama2", marks=pytest.mark.slow),
                                        pytest.param("t5", marks=pytest.mark.slow)])
def both(request, tmp_path_factory):
  """(ours, reference, (RunLM, HFLM)): simple_evaluate's results with samples of each LM."""
  from lm_eval import simple_evaluate
  model, tok, workdir = converted(tmp_path_factory.mktemp("harness"), request.param)
  run = transformer.restore(workdir)
  ours_lm = harness.lm_of(run)
  ours = harness.run_tasks(ours_lm, TASKS, include_path=TASKS_DIR, standard_tasks=False,
                           log_samples=True)
  manager, loaded = harness.load_tasks(TASKS, TASKS_DIR, standard_tasks=False)
  tasks = [t for item in loaded for t in item["tasks"].values()]
  hflm = reference_lm(request.param, model, tok, run.config.model.max_len)
  reference = simple_evaluate(hflm, tasks=tasks, task_manager=manager, log_samples=True,
                              bootstrap_iters=0)
  return ours, reference, (ours_lm, hflm)


def responses(results, task):
  """Each document's responses (per request, the model's raw answer), in document order."""
  return [[r[0] for r in s["resps"]] for s in sorted(results["samples"][task],
                                                     key=lambda s: s["doc_id"])]


def test_loglikelihood_equals_hf_backend(both):
  """Multiple choice: per request, log p(choice | question) within 1e-3 and the same greedy
  flag; accuracy and normalized accuracy equal."""
  ours, ref, _ = both
  got, want = responses(ours, "tiny_choice"), responses(ref, "tiny_choice")
  assert len(got) == len(want) == 14
  for doc_got, doc_want in zip(got, want):
    for (logp, greedy), (ref_logp, ref_greedy) in zip(doc_got, doc_want):
      assert abs(logp - ref_logp) <= 1e-3 and greedy == ref_greedy
  assert any(greedy for doc in want for _, greedy in doc)  # the flag is exercised both ways
  for metric in ("acc,none", "acc_norm,none"):
    assert ours["results"]["tiny_choice"][metric] == ref["results"]["tiny_choice"][metric]


def test_rolling_loglikelihood_equals_hf_backend(both):
  """Rolling perplexity: documents longer than the model's length (windows), each document's
  log-likelihood within 1e-3; word/byte perplexity and bits per byte within 1e-4 relative."""
  ours, ref, _ = both
  got, want = responses(ours, "tiny_text"), responses(ref, "tiny_text")
  assert len(got) == len(want) > 0  # every document scored
  for doc_got, doc_want in zip(got, want):
    assert abs(doc_got[0] - doc_want[0]) <= 1e-3
  for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
    assert ours["results"]["tiny_text"][metric] == pytest.approx(
        ref["results"]["tiny_text"][metric], rel=1e-4)


def test_generations_equal_hf_backend(both):
  """generate_until: our KV-cached greedy decoding cut at the stop string gives the hf backend's
  text, document for document."""
  ours, ref, _ = both
  got, want = responses(ours, "tiny_generate"), responses(ref, "tiny_generate")
  assert got == want and any(text for doc in want for text in doc)
  assert ours["results"]["tiny_generate"] == ref["results"]["tiny_generate"]


def test_the_scorer_compiles_once_per_bucket(both):
  """Every loglikelihood request of the three tasks (contexts of 4 to 64 tokens) was scored by
  at most one compiled program per bucket width (16, 32, 64 up to model.max_len), not one per
  request length."""
  _, _, (ours, _) = both
  if ours.backend != "causal":
    pytest.skip("a seq2seq scorer's buckets are (encoder, decoder) width pairs")
  widths = [width for width in (16, 32, 64, 128) if width < 2 * ours.max_length]
  assert 1 <= ours._scorer._cache_size() <= len(widths)  # pylint: disable=protected-access


def test_unknown_task_names_the_nearest():
  with pytest.raises(EvaluationError, match=r"unknown task 'tiny_choise' \(nearest: tiny_choice"):
    harness.load_tasks(["tiny_choise"], TASKS_DIR, standard_tasks=False)


def test_a_task_that_needs_the_hub_offline_is_one_line(tmp_path):
  """A task whose data set is on the Hub, run offline: one line naming the task and data set."""
  (tmp_path / "hub_task.yaml").write_text(
      "task: hub_task\ndataset_path: some-org/not-downloaded\noutput_type: loglikelihood\n"
      "test_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n")
  with pytest.raises(EvaluationError, match=r"^task 'hub_task' needs its data set "
                     r"'some-org/not-downloaded' from the Hugging Face Hub.*HF_DATASETS_CACHE"):
    harness.load_tasks(["hub_task"], str(tmp_path), standard_tasks=False)


def test_a_context_longer_than_the_model_is_cut_as_the_harness_cuts_it(both, caplog):
  """Requests longer than model.max_len: cut from the left as the hf backend cuts them (the same
  log-likelihoods), and said in one warning."""
  from lm_eval.api.instance import Instance
  _, _, (ours, reference) = both
  long = " ".join(["the old man sees the moon. a dog likes some fish."] * 40)
  requests = [Instance("loglikelihood", {}, (long, " it."), 0),
              Instance("loglikelihood", {}, (long + " she", " eats"), 1)]
  with caplog.at_level("WARNING"):
    got = ours.loglikelihood(requests, disable_tqdm=True)
  want = reference.loglikelihood(requests, disable_tqdm=True)
  assert len(got) == len(want) == 2
  for (logp, greedy), (ref_logp, ref_greedy) in zip(got, want):
    assert abs(logp - ref_logp) <= 1e-3 and greedy == ref_greedy
  said = [r.message for r in caplog.records if r.name == "transformer.infer.harness.lm"]
  assert len(said) == 1 and said[0].startswith("2 requests are longer than model.max_len=")


def test_harness_results_go_through_the_write_guard(tmp_path):
  """--out inside another run, or over a metrics.harness.json a user wrote, is one line before
  any model is restored, and the user's file is kept."""
  other = tmp_path / "other"
  (other / "checkpoints").mkdir(parents=True)  # a run's workdir
  with pytest.raises(EvaluationError, match=r"--out=.*other/sub .*inside the run"):
    harness.evaluate_workdir(str(tmp_path / "nowhere"), ["tiny_choice"],
                             out_dir=str(other / "sub"))
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / harness.RESULTS_FILE).write_text("my notes\n")
  with pytest.raises(EvaluationError, match=r"metrics.harness.json exists and was not written"):
    harness.evaluate_workdir(str(tmp_path / "nowhere"), ["tiny_choice"], out_dir=str(mine))
  assert (mine / harness.RESULTS_FILE).read_text() == "my notes\n"
