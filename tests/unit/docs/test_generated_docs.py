"""docs/cli.md and docs/config.md are what the code says: regenerated and compared.

The pages are rendered from the click commands and the config's dataclasses by tools.docgen;
a change to an option, a default or a field's docstring without `python -m tools.docgen`
fails here, naming the page. The reference has no empty rows either: every option has a help
text and every config key a docstring.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import click
import pytest

from runtime import config as schema
from tools.docgen import PAGES, stale_pages, write_pages
from tools.docgen.config_reference import field_docs
from tools.docgen.pages import REPO
from zlaunch.cli import cli


@pytest.mark.parametrize("page", sorted(PAGES))
def test_generated_page_matches_the_code(page):
    on_disk = (REPO / page).read_text(encoding="utf-8")
    assert on_disk == PAGES[page](), f"{page} is stale: run python -m tools.docgen"


def test_a_stale_or_missing_page_is_named_and_rewritten(tmp_path):
    (tmp_path / "docs").mkdir()
    assert stale_pages(tmp_path) == sorted(PAGES)  # none written yet
    assert sorted(write_pages(tmp_path)) == sorted(PAGES)
    assert stale_pages(tmp_path) == [] and write_pages(tmp_path) == []
    cli_page = tmp_path / "docs" / "cli.md"
    cli_page.write_text(cli_page.read_text().replace("--hang-timeout", "--hang-timeot"))
    assert stale_pages(tmp_path) == ["docs/cli.md"]


def test_every_option_of_every_command_says_what_it_does():
    ctx = click.Context(cli, info_name="zlaunch", **cli.context_settings)
    silent = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        sub = click.Context(command, info_name=name, parent=ctx)
        silent += [
            f"zlaunch {name} {param.opts[0]}"
            for param in command.get_params(sub)
            if isinstance(param, click.Option) and not param.hidden and not param.help
        ]
    assert silent == [], "options without help="


def _config_blocks():
    """Config and every block reachable from it."""
    seen, todo = [], [schema.Config]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for kind in typing.get_args(hint) or (hint,):
                if dataclasses.is_dataclass(kind) and kind not in seen + todo:
                    todo.append(kind)
    return seen


def test_every_config_key_has_a_docstring():
    blocks = _config_blocks()
    assert {schema.ZeroConfig, schema.OffloadConfig, schema.CheckpointConfig} <= set(blocks)
    undocumented = [
        f"{cls.__name__}.{name}"
        for cls in blocks
        for name, (_annotation, doc) in field_docs(cls).items()
        if not doc
    ]
    assert undocumented == []


@dataclasses.dataclass(frozen=True)
class _Sample:
    documented: Literal["a", "b"] = "a"
    """What it means."""
    bare: int = 0
    also: bool = False
    """Said after a bare field."""


def test_field_docs_pairs_each_field_with_the_string_under_it():
    assert field_docs(_Sample) == {
        "documented": ("Literal['a', 'b']", "What it means."),
        "bare": ("int", ""),
        "also": ("bool", "Said after a bare field."),
    }
