"""The README stays a front page (at most 15,000 bytes: what thicket is, the two commands, a first
sweep, the outputs, where to go next), and every relative link of the README and of docs/ leads to
a file that exists and, where it names an anchor, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_BYTES = 15_000
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no headings in code blocks
    return {anchor(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(page.read_text())
            if not re.match(r"[a-z]+:", target) and not target.startswith("#")]


def broken(page: Path) -> list[str]:
    """Each relative link of `page` whose file or anchor is not there."""
    out = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve()
        if not linked.exists():
            out.append(f"{target}: no such file")
        elif fragment and (linked.suffix != ".md" or fragment not in anchors(linked)):
            out.append(f"{target}: no heading with anchor #{fragment}")
    return out


def test_the_readme_is_a_front_page():
    assert len(README.read_bytes()) <= MAX_README_BYTES


def test_the_anchor_oracle_follows_github():
    assert anchor("Loading the model: the cache's throughput") == "loading-the-model-the-caches-throughput"
    assert anchor("`thicket eval`, pass@k") == "thicket-eval-passk"


def test_the_readme_links_the_docs_it_sends_readers_to():
    linked = {target.partition("#")[0] for target in relative_links(README)}
    assert {"docs/install.md", "docs/envs.md", "docs/kubernetes-walkthrough.md", "docs/kubernetes.md"} <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page) == []
