"""The README and docs/ link to files and sections that exist, and every page of docs/ can be
reached from the README, so a page moved or a heading renamed is found here and not by a reader.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\[(?:[^\]]|\n)*?\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
EXPLICIT_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: Counter[str] = Counter()
    found = set(EXPLICIT_ANCHOR.findall(text))
    for line in text.splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def links(page: Path) -> list[str]:
    """The relative links of a page, outside code blocks."""
    text = FENCE.sub("", page.read_text())
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def broken(page: Path) -> list[str]:
    found = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            found.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            found.append(f"{target}: no such section")
    return found


def test_every_relative_link_leads_to_a_file_and_section_that_exist() -> None:
    found = {page.relative_to(REPO).as_posix(): broken(page) for page in PAGES}
    assert {page: problems for page, problems in found.items() if problems} == {}


def test_every_page_of_docs_is_reached_from_the_readme() -> None:
    reached, queue = set(), [REPO / "README.md"]
    while queue:
        page = queue.pop()
        if page in reached or page.suffix != ".md" or not page.exists():
            continue
        reached.add(page)
        queue += [
            (page.parent / t.partition("#")[0]).resolve()
            for t in links(page)
            if t.partition("#")[0]
        ]
    assert [p.relative_to(REPO).as_posix() for p in PAGES if p not in reached] == []
