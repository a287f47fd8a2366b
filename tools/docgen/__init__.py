"""The generated reference pages: docs/cli.md from the click commands, docs/config.md from the
config's dataclasses and their field docstrings.

`python -m tools.docgen` rewrites both; `python -m tools.docgen --check` exits 1 naming the
pages that differ from what the code says. They import only the public faces `zlaunch.cli`
and `runtime.config`, so moving modules behind those faces changes nothing here.
"""

from .cli_reference import render_cli
from .config_reference import render_config
from .pages import PAGES, stale_pages, write_pages

__all__ = ["PAGES", "render_cli", "render_config", "stale_pages", "write_pages"]
