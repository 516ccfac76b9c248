"""Every result's record (docs/results/**/record.json) is well formed and points to its report."""

import collections
import glob
import json
import os
import re

import pytest

from record_schema import OPTIONAL, REQUIRED

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "docs", "results")
RECORDS = sorted(glob.glob(os.path.join(RESULTS, "**", "record.json"), recursive=True))
RATES = ("steps_per_s", "tokens_per_s")


def anchor(heading: str) -> str:
  """GitHub's anchor of a heading: link text kept, lower case, punctuation but '-' and '_' dropped,
  spaces to '-'."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
  text = re.sub(r"[^\w\- ]", "", text.lower())
  return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
  """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
  seen, out = collections.Counter(), set()
  fenced = False
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.lstrip().startswith("```"):
        fenced = not fenced
      m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
      if m:
        a = anchor(m.group(1))
        out.add(a if not seen[a] else f"{a}-{seen[a]}")
        seen[a] += 1
  return out


def test_anchor_rules():
  """The anchor function follows GitHub's rules on the headings the reports use."""
  assert anchor("Best: 18,000 steps") == "best-18000-steps"
  assert anchor("`:tiny` and the prefix-LM") == "tiny-and-the-prefix-lm"
  assert anchor("What [EMA](x.md) buys_now") == "what-ema-buys_now"


def test_every_result_directory_has_a_record():
  """Each directory of docs/results that holds raw outputs directly has a record.json."""
  assert RECORDS, "no records under docs/results"
  for entry in sorted(os.listdir(RESULTS)):
    path = os.path.join(RESULTS, entry)
    if os.path.isdir(path):
      assert glob.glob(os.path.join(path, "**", "record.json"), recursive=True), \
          f"docs/results/{entry} has no record.json"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: os.path.relpath(os.path.dirname(p), RESULTS))
def test_record(path):
  """A record parses, has the required keys with their types, names its directory, and its report
  file and anchor exist."""
  with open(path, encoding="utf-8") as f:
    rec = json.load(f)
  where = os.path.relpath(path, REPO)
  for key, types in REQUIRED.items():
    assert key in rec, f"{where}: no {key!r}"
    assert isinstance(rec[key], types), f"{where}: {key!r} is {type(rec[key]).__name__}"
  for key, types in OPTIONAL.items():
    if key in rec:
      assert isinstance(rec[key], types), f"{where}: {key!r} is {type(rec[key]).__name__}"
  unknown = set(rec) - set(REQUIRED) - set(OPTIONAL)
  assert not unknown, f"{where}: unknown keys {sorted(unknown)}"
  assert rec["name"] == os.path.relpath(os.path.dirname(path), RESULTS).replace(os.sep, "/"), where
  assert all(isinstance(o, str) and o.startswith("--") for o in rec["overrides"]), where
  assert set(rec["rates"]) <= set(RATES), f"{where}: rates {sorted(rec['rates'])}"
  for value in list(rec["rates"].values()) + list(rec["metrics"].values()):
    assert isinstance(value, (int, float)) and not isinstance(value, bool), where
  assert rec["metrics"], f"{where}: no metrics"
  assert all(isinstance(s, int) for s in rec["seeds"]), where
  for key, (lo, hi) in rec.get("spread", {}).items():
    assert key in rec["metrics"], f"{where}: spread of {key!r}, which is not a metric"
    assert lo <= rec["metrics"][key] <= hi, f"{where}: {key} outside its spread"
  for goal, entry in rec.get("goals", {}).items():
    assert "bound" in entry, f"{where}: goal {goal!r} states no bound"
    for approach, outcome in entry.items():
      if isinstance(outcome, dict):
        assert isinstance(outcome.get("met"), bool), f"{where}: {goal}/{approach}: no met"
  for approach, why in rec.get("refused", {}).items():
    assert isinstance(why.get("reason"), str), f"{where}: {approach} refused without a reason"
  if rec["commit"] is not None:
    assert re.fullmatch(r"[0-9a-f]{40}", rec["commit"]), f"{where}: commit {rec['commit']!r}"
  report, _, frag = rec["report"].partition("#")
  assert os.path.exists(os.path.join(REPO, report)), f"{where}: no report {report}"
  assert frag in anchors(os.path.join(REPO, report)), f"{where}: no heading #{frag} in {report}"


REPORTS = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


@pytest.mark.parametrize("path", REPORTS, ids=os.path.basename)
def test_report_links_resolve(path):
  """Every relative link and image of a report names a file that exists, and its #anchor a heading
  of that file."""
  text, fenced = [], False
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.lstrip().startswith("```"):
        fenced = not fenced
      elif not fenced:
        text.append(re.sub(r"`[^`]*`", "", line))
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", "".join(text)):
    if re.match(r"[a-z]+:", target):
      continue
    file, _, frag = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(dest):
      broken.append(target)
    elif frag and frag not in anchors(dest):
      broken.append(target)
  assert not broken, f"{os.path.relpath(path, REPO)}: {broken}"
