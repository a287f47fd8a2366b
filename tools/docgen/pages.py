"""Which page each renderer writes, and the comparison the freshness test and `--check` make."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .cli_reference import render_cli
from .config_reference import render_config

__all__ = ["PAGES", "REPO", "stale_pages", "write_pages"]

REPO = Path(__file__).resolve().parents[2]
"""The repository root: tools/docgen/ is two folders below it."""

PAGES: dict[str, Callable[[], str]] = {
    "docs/cli.md": render_cli,
    "docs/config.md": render_config,
}
"""Each generated page, relative to the repository root, and the function that renders it."""


def stale_pages(root: Path = REPO) -> list[str]:
    """The pages whose file under `root` differs from what the code renders (or is missing)."""
    stale = []
    for name, render in PAGES.items():
        path = root / name
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current != render():
            stale.append(name)
    return stale


def write_pages(root: Path = REPO) -> list[str]:
    """Render every page into `root`; the names of those whose content changed."""
    changed = []
    for name, render in PAGES.items():
        path = root / name
        text = render()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed
