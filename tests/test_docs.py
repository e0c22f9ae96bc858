"""The README and the pages of docs/ hold together: every relative link names a file of the repository (and, into a
Markdown page, one of its headings), and the README's picture is there and small."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
PICTURE = ROOT / "docs" / "img" / "readme-figure.png"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (not '-' or '_'), spaces to '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def shown(file: Path) -> str:
    return str(file.relative_to(ROOT)) if file.is_relative_to(ROOT) else str(file)


def broken(page: Path) -> list[str]:
    found = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not checked here
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            found.append(f"{target} (no {shown(file)})")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            found.append(f"{target} (no heading #{fragment} in {shown(file)})")
    return found


def test_every_relative_link_resolves():
    assert sum(len(links(page)) for page in PAGES) > 20  # the scan found the links
    problems = {str(page.relative_to(ROOT)): broken(page) for page in PAGES}
    assert {page: found for page, found in problems.items() if found} == {}


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A `section`, here\n")
    page.write_text("[ok](other.md#a-section-here) [gone](missing.md) [no anchor](other.md#nowhere)\n"
                    "```\n[in a code block](not-checked.md)\n```\n")
    assert [problem.split(" (")[0] for problem in broken(page)] == ["missing.md", "other.md#nowhere"]


def test_every_docs_page_is_linked_from_the_readme():
    readme = links(ROOT / "README.md")
    assert [page.name for page in PAGES[1:] if f"docs/{page.name}" not in readme] == []


def test_the_readme_picture_is_there_and_small():
    assert "docs/img/readme-figure.png" in links(ROOT / "README.md")
    assert PICTURE.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert PICTURE.stat().st_size < 300_000
