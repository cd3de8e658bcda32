"""The documentation's links lead somewhere: every relative link and every ``docs/<page>.md`` a page names (README.md,
CHANGELOG.md, docs/) is a file of this repository. A reader who follows "see docs/reference.md section 4" finds it;
a page that cites a file outside the repository (as the external contract once was) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])

# [text](target) and ![alt](target), and reference definitions "[name]: target"
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
# a docs page named in prose or code: docs/reference.md, docs/api/x.md (not part of a longer path, such as
# ../shared/docs/x.md)
DOCS_PATH = re.compile(r"(?<![\w./-])docs/(?:[\w-]+/)*[\w.-]*\w\.md\b")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def links(text: str) -> list[str]:
    """The relative link targets of a Markdown page (code blocks left out: a link there is not a link)."""
    prose = FENCE.sub("", text)
    targets = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)
    return [t for t in targets if not EXTERNAL.match(t) and not t.startswith("#")]


def broken(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in links(text):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            problems.append(f"link ({target}) -> {(page.parent / path).resolve()} does not exist")
    for named in sorted(set(DOCS_PATH.findall(text))):
        if not (ROOT / named).is_file():
            problems.append(f"{named} is not a file of the repository")
    return problems


@pytest.mark.parametrize("page", [pytest.param(p, id=str(p.relative_to(ROOT))) for p in PAGES])
def test_every_link_and_docs_reference_resolves(page: Path) -> None:
    assert broken(page) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "see [ops](operations.md#settings) and ![x](img/a.png)",
            ["operations.md#settings", "img/a.png"],
            id="inline-and-image",
        ),
        pytest.param("[site](https://example.org) [top](#intro) [m](mailto:a@b.c)", [], id="external-and-anchors"),
        pytest.param("[ref]: ../CHANGELOG.md", ["../CHANGELOG.md"], id="reference-definition"),
        pytest.param("```\n[not a link](missing.md)\n```\n", [], id="code-block"),
    ],
)
def test_links_are_found_where_a_reader_would_follow_them(text: str, expected: list[str]) -> None:
    assert links(text) == expected


def test_a_page_citing_a_missing_file_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("As [the contract](../shared/CONTRACT.md) says, and docs/no-such-page.md too.\n")
    problems = broken(page)
    assert len(problems) == 2
    assert "CONTRACT.md" in problems[0] and "docs/no-such-page.md" in problems[1]
