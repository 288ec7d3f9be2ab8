"""The docs run: every Python code block of README.md and of the pages in docs/.

The blocks are found with Sybil's Markdown lexers (a page added to docs/
is picked up by itself).  The rules, for whoever writes a page:

* a ```` ```python ```` block is a complete program: it runs alone, as a
  user would paste it into a file, in a fresh interpreter with one CPU
  device and a clean environment (no ``XLA_FLAGS``), and must exit with 0
  and write no traceback.  A block that needs several devices says so in
  its first lines, visibly, as a user on CPU would:
  ``os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"``
  before ``import jax``;
* its shown output, if any, is the fenced ```` ```text ```` block right
  after it (a line of prose such as "prints" may stand between them): the
  block's standard output must match it exactly, where a line ``...``
  (or ``...`` inside a line) stands for any text, as in doctest's
  ``ELLIPSIS``; blank lines at the end do not count;
* a block that cannot run here (several processes, a package the tests
  do not install, a fragment of the reader's own program) is preceded by
  ``<!-- skip: next "why" -->`` (Sybil's syntax), and a fragment also says
  so in words the reader sees;
* blocks in other languages (shell commands, HLO text) are not run.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from _helpers import REPO, hostcb_root

sybil = pytest.importorskip(
  "sybil",
  reason="sybil is not installed (the Makefile's deps line installs it)",
)
from sybil import Document, Region  # noqa: E402  (after the skip above)
from sybil.parsers.markdown.lexers import (  # noqa: E402
  DirectiveInHTMLCommentLexer,
  RawFencedCodeBlockLexer,
)

TIMEOUT = 300  # seconds per block
_FENCES = RawFencedCodeBlockLexer(
  info_pattern=re.compile(r"(?P<info>[^\n]*)\n"),
  mapping={"info": "info", "source": "source"},
)
_SKIPS = DirectiveInHTMLCommentLexer(
  directive="skip",
  arguments=r"next\s+\"(?P<reason>[^\"]+)\"",
  mapping={"arguments": "arguments"},
)


@dataclass
class Block:
  """A Python block of a page, with its shown output and why it is
  skipped (None: it runs)."""

  source: str
  output: str | None
  skip: str | None


def _parse(document: Document):
  """Sybil parser: one region per Python block."""
  fences = sorted(_FENCES(document), key=lambda r: r.start)
  skips = sorted(_SKIPS(document), key=lambda r: r.start)
  for i, region in enumerate(fences):
    if region.lexemes["info"].strip() != "python":
      continue
    output = None
    if i + 1 < len(fences):
      nxt = fences[i + 1]
      between = document.text[region.end : nxt.start].strip()
      if (
        nxt.lexemes["info"].strip() == "text"
        and "\n\n" not in between
        and len(between) < 80
      ):
        output = str(nxt.lexemes["source"])
    previous_end = fences[i - 1].end if i else 0
    reason = None
    for s in skips:
      if previous_end <= s.start and s.end <= region.start:
        m = re.match(r'next\s+"([^"]+)"', s.lexemes["arguments"])
        reason = m.group(1) if m else s.lexemes["arguments"]
    yield Region(
      region.start,
      region.end,
      Block(str(region.lexemes["source"]), output, reason),
      _evaluate,
    )


def _environment() -> dict:
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("XLA_FLAGS", "HOSTCB_TEST_DEVICES", "PYTHONPATH")
  }
  env.update({"PYTHONPATH": hostcb_root(), "JAX_PLATFORMS": "cpu"})
  return env


def _evaluate(example) -> str | None:
  """Runs the block; returns what went wrong (Sybil's evaluator
  protocol), or None."""
  block: Block = example.parsed
  proc = subprocess.run(
    [sys.executable, "-c", block.source],
    env=_environment(),
    cwd=example.namespace.get("cwd", REPO),
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  if proc.returncode != 0 or "Traceback" in proc.stderr:
    return (
      f"the block failed (exit {proc.returncode}):\n{proc.stderr}"
      f"\nstdout:\n{proc.stdout}"
    )
  if block.output is not None:
    checker = doctest.OutputChecker()
    want = block.output.rstrip("\n") + "\n"
    got = proc.stdout.rstrip("\n") + "\n"
    if not checker.check_output(want, got, doctest.ELLIPSIS):
      return (
        "the block's output differs from the page's:\n"
        + checker.output_difference(
          doctest.Example("", want), got, doctest.ELLIPSIS
        )
      )
  return None


def _pages() -> list[Path]:
  root = Path(REPO)
  return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _examples():
  params = []
  for page in _pages():
    document = Document.parse(str(page), _parse)
    for example in document.examples():
      name = f"{page.relative_to(REPO)}:{example.line}"
      marks = (
        [pytest.mark.skip(reason=example.parsed.skip)]
        if example.parsed.skip
        else []
      )
      params.append(pytest.param(example, id=name, marks=marks))
  return params


@pytest.mark.parametrize("example", _examples())
def test_doc_block_runs_and_prints_what_the_page_shows(example, tmp_path):
  example.namespace["cwd"] = str(tmp_path)  # what a block writes lands there
  failure = _evaluate(example)
  assert failure is None, failure


def test_every_page_is_collected():
  # docs/ is globbed: a new page needs no change here.
  names = {p.name for p in _pages()}
  assert {
    "README.md",
    "guide.md",
    "progress.md",
    "architecture.md",
    "migration.md",
    "speed.md",
    "hostcb.md",  # docs/api/
  } <= names


def test_the_readme_has_at_most_300_lines():
  # What it is, install, the two commands, the 30-second example, the API
  # table, one speed table and links; the rest is on the docs site.
  lines = Path(REPO, "README.md").read_text().splitlines()
  assert len(lines) <= 300, len(lines)


def test_every_docs_page_is_in_the_sites_nav():
  # mkdocs.yml's nav names each page by its path under docs/; a page left
  # out of it would be built but reachable from no menu.
  nav = Path(REPO, "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
  in_nav = set(re.findall(r":\s*(\S+\.md)\s*$", nav, re.M))
  docs = Path(REPO, "docs")
  pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
  assert pages == in_nav, (
    f"not in the nav: {sorted(pages - in_nav)}; "
    f"in the nav, not in docs/: {sorted(in_nav - pages)}"
  )


def test_the_readmes_list_of_public_names_is_hostcb_all_and_lazy_modules():
  import hostcb

  text = Path(REPO, "README.md").read_text()
  start = text.index("Public names: ")
  paragraph = text[start : text.index("\n\n", start)]
  # The names are the code spans that are plain identifiers, not the
  # dotted examples (hostcb.debug.print) in parentheses.
  names = set(re.findall(r"`([A-Za-z_]\w*)`", paragraph))
  # progress and metrics are modules imported on first use (progress
  # needs tqdm), so ``from hostcb import *`` leaves them out.
  assert names == set(hostcb.__all__) | {"progress", "metrics"}
  assert not {"progress", "metrics"} & set(hostcb.__all__)
