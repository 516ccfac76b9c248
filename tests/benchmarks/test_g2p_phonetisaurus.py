"""benchmarks/g2p_phonetisaurus.py: the published baseline on our split. What it trains on (our
training words, every variant, no validation or test word), how its output is read and scored (our
wer_per: any reference counts, a missing word is wrong), the one-line error without the wheel, and,
where the wheel is installed, a real Phonetisaurus round trip on a small lexicon."""

import sys

import pytest

from bench_loader import load_benchmark
import cmudict_data
from transformer.data import cmudict

baseline = load_benchmark("g2p_phonetisaurus")


def test_lexicon_is_the_training_split_with_every_variant(tmp_path):
  splits = cmudict.load_splits(stress=False)
  path = tmp_path / "train.lexicon"
  lines = baseline.write_lexicon(splits["train"], str(path))
  read = {}
  for line in path.read_text().splitlines():
    word, pron = line.split("\t")
    read.setdefault(word, []).append(pron)
  assert read == splits["train"]  # every word, every pronunciation, in CMU's variant order
  assert lines == cmudict_data.COUNTS["no_stress"]["train"][1]
  held_out = set(splits["validation"]) | set(splits["test"])
  assert not held_out & set(read)


def test_hypotheses_keep_the_first_line_of_each_word():
  text = "cat K AE T\ncat K AA T\n\ndog D AO G\nhmm\n"
  assert baseline.read_hypotheses(text) == {"cat": ["K", "AE", "T"], "dog": ["D", "AO", "G"],
                                            "hmm": []}


def test_score_accepts_any_reference_and_counts_a_missing_word_as_empty():
  words = {"either": ["IY DH ER", "AY DH ER"], "cat": ["K AE T"], "dog": ["D AO G"]}
  hyps = {"either": ["AY", "DH", "ER"], "cat": ["K", "AH", "T"]}  # dog missing
  res = baseline.score(words, hyps)
  assert res["words"] == 3 and res["missing"] == 1
  assert res["wer"] == pytest.approx(2 / 3)  # cat wrong, dog empty
  # PER: either 0 of 3, cat 1 of 3, dog 3 deletions of 3 -> 4 / 9
  assert res["per"] == pytest.approx(4 / 9)


def test_without_the_wheel_the_error_is_one_line(monkeypatch):
  monkeypatch.setitem(sys.modules, "phonetisaurus", None)
  with pytest.raises(SystemExit, match="pip install phonetisaurus==0.3.0"):
    baseline.environment()


def test_real_phonetisaurus_learns_its_training_words(tmp_path):
  """Trains the real binaries on 400 training words and decodes them back: a joint n-gram of
  order 8 nearly memorises its training set (3% WER measured; 92% on 200 unseen words), so WER
  < 10% separates a working pipeline from one that misreads or misaligns the output;
  proves the command lines, the file formats and the scoring glue against the real tool."""
  pytest.importorskip("phonetisaurus")
  env = baseline.environment()
  train = cmudict.load_splits(stress=False)["train"]
  words = {w: train[w] for w in sorted(train)[1000:1400]}
  lexicon = tmp_path / "small.lexicon"
  baseline.write_lexicon(words, str(lexicon))
  model = baseline.train(str(lexicon), str(tmp_path), 8, env)
  out = baseline.apply(model, sorted(words), str(tmp_path / "small.words"), env)
  res = baseline.score(words, baseline.read_hypotheses(out))
  assert res["missing"] == 0
  assert res["wer"] < 0.10, res


def test_a_failing_binary_is_a_one_line_error_naming_it(tmp_path):
  with pytest.raises(SystemExit, match=r"^g2p_phonetisaurus: false exited 1: no output$"):
    baseline._run(["false"], env={"PATH": "/usr/bin:/bin"})


def test_an_unknown_split_is_a_one_line_error(capsys):
  with pytest.raises(SystemExit):
    baseline.main(["--work_dir=unused", "--splits=test,train"])
  assert "--splits: ['train'] not among validation, test" in capsys.readouterr().err
