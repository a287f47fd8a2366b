"""Every relative link of the README, ARCHITECTURE.md and the pages under docs/ and benchmarks/
leads somewhere: the file exists, and a `#fragment` names a heading of that file (GitHub's
anchor: lower case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```|<!--.*?-->", re.S | re.M)


def pages() -> list[Path]:
    found = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "benchmarks" / "README.md"]
    return [p for p in found if p.is_file()] + sorted((REPO / "docs").glob("*.md"))


def anchor(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def broken_links() -> list[str]:
    broken = []
    for page in pages():
        text = _FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_leads_to_a_file_and_heading():
    assert broken_links() == []


def test_anchors_are_githubs():
    assert anchor("Where is it stuck: `zlaunch stacks`") == "where-is-it-stuck-zlaunch-stacks"
    assert anchor("`zero_optimization.offload_param`") == "zero_optimizationoffload_param"
    assert anchor("torch.compile") == "torchcompile"
