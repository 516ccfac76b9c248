"""Docstrings, comments and the README point only to files (and headings) the project has."""

import os
import re

from test_records import anchors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Documents are named in capitals (e.g. README.md); lower-case names such as results.md are
# files the code writes.
_MD = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][\w.-]*\.md)\b")


def _sources():
  for top in ("transformer", "configs", "tests", "benchmarks", "notebooks"):
    for root, _, names in os.walk(os.path.join(REPO, top)):
      yield from (os.path.join(root, n) for n in names if n.endswith(".py"))
  yield from (os.path.join(REPO, n) for n in os.listdir(REPO) if n.endswith(".py"))


def test_markdown_files_named_in_code_exist():
  """Every document (`*.md` named in capitals) named in a .py file of the project exists: at that
  path from the repository root or from the naming file's directory, or by that name somewhere in
  the repository."""
  have = {n for _, _, names in os.walk(REPO) for n in names if n.endswith(".md")}
  missing = []
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        for name in _MD.findall(line):
          here = [os.path.join(REPO, name), os.path.join(os.path.dirname(path), name)]
          if not any(map(os.path.exists, here)) and os.path.basename(name) not in have:
            missing.append(f"{os.path.relpath(path, REPO)}:{n}: {name}")
  assert not missing, missing


def test_readme_links_point_to_files_and_headings_that_exist():
  """Every relative link of README.md names a file of the repository and, when it names a
  heading (`docs/g2p.md#gpu-runs`, `#results`), a heading of that file."""
  readme = os.path.join(REPO, "README.md")
  with open(readme, encoding="utf-8") as f:
    links = re.findall(r"\]\(([^)\s]+)\)", f.read())
  broken = []
  for link in links:
    if re.match(r"\w+://", link):
      continue
    path, _, heading = link.partition("#")
    target = os.path.join(REPO, path) if path else readme
    if not os.path.exists(target) or (heading and heading not in anchors(target)):
      broken.append(link)
  assert links and not broken, broken


_DOC_LINK = re.compile(r"\b(docs/[\w-]+\.md)(?:#([\w-]+))?")


def test_report_pages_and_anchors_named_in_code_exist():
  """Every report page (`docs/<page>.md`, with an optional `#anchor`) named in a .py file of the
  project exists, and the anchor is one of its headings."""
  missing = []
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        for page, anchor in _DOC_LINK.findall(line):
          target = os.path.join(REPO, page)
          if not os.path.exists(target) or (anchor and anchor not in anchors(target)):
            missing.append(f"{os.path.relpath(path, REPO)}:{n}: {page}{'#' * bool(anchor)}{anchor}")
  assert not missing, missing
