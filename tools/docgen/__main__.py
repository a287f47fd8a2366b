"""`python -m tools.docgen [--check]`: rewrite docs/cli.md and docs/config.md from the code, or
(`--check`) exit 1 naming the pages that are stale."""

from __future__ import annotations

import sys

from .pages import PAGES, stale_pages, write_pages


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python -m tools.docgen [--check]", file=sys.stderr)
        return 2
    if argv == ["--check"]:
        stale = stale_pages()
        for name in stale:
            print(f"{name} is stale: run python -m tools.docgen", file=sys.stderr)
        return 1 if stale else 0
    changed = write_pages()
    for name in PAGES:
        print(f"{name}: {'rewritten' if name in changed else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
