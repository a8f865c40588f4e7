"""The README stays a short user's guide, and every relative link in README.md and docs/ resolves.

Checks: README.md has at most 300 lines and none of the lab-notebook headings it used to carry; every
relative markdown link or image target in README.md and docs/**/*.md (fenced code and inline code
ignored, `#fragment` stripped) names an existing file or directory relative to its markdown file; every
docs/*.md page is linked from README.md or docs/README.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 300

# Headings of the lab-notebook README whose content now lives in docs/ (issue 19).
NOTEBOOK_HEADINGS = (
    "Results on the demo pair",
    "The pair (",
    "Distilling the draft",
    "The shipped heads",
    "Decoding: `acchead-bench`",
    "Decoding speed",
    "How it works",
)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target); the target may be <...> and may carry a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")  # http:, https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _prose(text: str) -> str:
    """`text` without fenced code blocks and inline code spans (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def link_targets(text: str) -> list[str]:
    """Every link and image target in markdown `text`, outside code."""
    prose = _prose(text)
    found = INLINE_LINK.findall(prose) + REFERENCE_DEF.findall(prose)
    return [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in found]


def relative_paths(text: str) -> list[str]:
    """The link targets that name a local file: no scheme, not a bare #anchor, fragment stripped."""
    paths = []
    for target in link_targets(text):
        if not target or target.startswith("#") or EXTERNAL.match(target):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path:
            paths.append(path)
    return paths


def test_link_parser_sees_links_and_skips_code() -> None:
    text = (
        "[a](docs/a.md#x) ![img](results/p.png) [web](https://example.org) [top](#intro)\n"
        "`[not](in-code.md)`\n```\n[nor](in-fence.md)\n```\n[ref]: <other file.md>\n"
    )
    assert relative_paths(text) == ["docs/a.md", "results/p.png", "other file.md"]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}); move studies to docs/"
    )


def test_readme_has_no_notebook_headings() -> None:
    headings = [
        line.lstrip("#").strip()
        for line in _prose(README.read_text(encoding="utf-8")).splitlines()
        if line.startswith("#")
    ]
    leftovers = [h for h in headings if h.startswith(NOTEBOOK_HEADINGS)]
    assert not leftovers, f"README.md headings that belong in docs/: {leftovers}"


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md: Path) -> None:
    broken = [
        target
        for target in relative_paths(md.read_text(encoding="utf-8"))
        if not (md.parent / target).exists()
    ]
    assert not broken, f"{md.relative_to(ROOT)} links to missing paths: {broken}"


def test_every_docs_page_is_linked_from_an_index() -> None:
    linked: set[Path] = set()
    for index in (README, DOCS / "README.md"):
        for target in relative_paths(index.read_text(encoding="utf-8")):
            linked.add((index.parent / target).resolve())
    pages = [p for p in sorted(DOCS.glob("*.md")) if p.name != "README.md"]
    assert pages, "docs/ holds no pages"
    unlinked = [p.name for p in pages if p.resolve() not in linked]
    assert not unlinked, f"docs pages linked from neither README.md nor docs/README.md: {unlinked}"
    assert (DOCS / "README.md").resolve() in linked, "README.md does not link docs/README.md"
