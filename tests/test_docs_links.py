"""The docs' relative links: every one in README.md, docs/ and benchmarks/ names a file of the repository that exists,
and a link to a heading of a markdown file (``results.md#...``) names a heading it has, by GitHub's rule for the
anchor (lower case; punctuation other than hyphens and underscores dropped; spaces to hyphens). The results pages
are long and their sections get renamed: a README link to a renamed one goes nowhere on GitHub without a word."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]
FENCED = re.compile(r"```.*?```", re.S)  # code blocks hold no links, and their '#' lines are comments


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def prose(page: Path) -> str:
    """The page's text without its code blocks, read once however many links point into it."""
    return FENCED.sub("", page.read_text(encoding="utf-8"))


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    return frozenset(anchor(h) for h in re.findall(r"^#+ (.*)$", prose(page), re.M))


def links(page: Path) -> list[str]:
    """The page's relative link targets: web addresses (scheme:...) left out."""
    targets = re.findall(r"\]\(([^)\s]+)\)", prose(page))
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_the_anchor_rule_gives_githubs_anchors():
    assert anchor("Fashion at 6,000 steps: a second seed, the reference start, a 3x3 image convolution "
                  "(2026-11-27, night)") == ("fashion-at-6000-steps-a-second-seed-the-reference-start-a-3x3-image-"
                                             "convolution-2026-11-27-night")
    assert anchor("SegCaps' `capsule_norm` in the capsule generator") == "segcaps-capsule_norm-in-the-capsule-generator"


def test_the_pages_have_links_to_check():
    assert len(PAGES) >= 3 and sum(len(links(p)) for p in PAGES) >= 100  # the rule below found links at all


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_goes_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page):
        path, _, heading = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif heading and dest.suffix == ".md" and heading not in anchors(dest):
            broken.append(f"{target} (no such heading in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
