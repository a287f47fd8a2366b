"""Every module path the docs and docstrings name exists.

A module that moves leaves its old name behind in prose: ARCHITECTURE.md, the pages under
docs/, the README and the docstrings of the code and the tests. Checked here, without
importing anything:

* dotted names rooted at one of this repository's packages (`zlaunch.agent`,
  `runtime.zero.Init`, `python -m tests.cluster up`): the longest prefix must be a module or a
  package of the tree, and the next name, if any, must be defined or imported at its top (or
  be one of its submodules);
* file and folder paths (`runtime/config/`, `benchmarks/results/bound_*.md`): rooted at a
  top-level folder, they must exist (a glob must match). A relative module path
  (`zero/strategy.py`) must exist below some folder of the tree, and so must a relative folder
  (`zero/stage3/`) whose first folder is one of the tree's (`zlaunch_runs/` is not).

In Markdown the names are taken from code spans; in docstrings from ``code``, `code` and bare
dotted names rooted at a package.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("zlaunch", "runtime", "tests", "tools", "benchmarks", "examples")
"""Dotted names starting with one of these are this repository's modules."""
FOLDERS = (*PACKAGES, "docs", "hostfiles")
"""Paths starting with one of these are this repository's files."""
CODE_ROOTS = ("zlaunch", "runtime", "tools", "tests", "benchmarks", "examples")
"""Where the docstrings are read."""

_DOTTED = re.compile(r"(?<![\w./-])(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"(?<![\w./~$-])(?:[\w.*-]+/)+[\w.*-]*")


def markdown_files() -> list[Path]:
    pages = [REPO / "ARCHITECTURE.md", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [page for page in pages if page.is_file()]


def python_files() -> list[Path]:
    return [path for root in CODE_ROOTS for path in sorted((REPO / root).rglob("*.py"))]


def code_spans(text: str) -> list[str]:
    """The fenced blocks and inline code spans of a Markdown text."""
    fence = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    inline = re.findall(r"``(.+?)``|`([^`\n]+)`", fence.sub("", text))
    return [*fence.findall(text), *(a or b for a, b in inline)]


def docstrings(path: Path) -> list[str]:
    """Every string statement of a module: module, class and function docstrings, and the
    docstrings written under attributes and fields."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]


def names_in(text: str, *, markdown: bool) -> set[str]:
    """The dotted names and paths of `text` that this test checks."""
    spans = code_spans(text) if markdown else [*re.findall(r"`{1,2}([^`]+)`{1,2}", text), text]
    found = set()
    for span in spans:
        found.update(_DOTTED.findall(span))
        if markdown or span is not text:
            found.update(p for p in _PATH.findall(span) if _checkable_path(p))
    return found


def _checkable_path(path: str) -> bool:
    first = path.split("/")[0]
    if first in FOLDERS or path.endswith(".py"):
        return True
    # A folder relative to some part of the tree (`zero/stage3/`), not one a job writes.
    return path.endswith("/") and first in _tree_folder_names()


@functools.cache
def _defined(module: Path) -> frozenset[str]:
    """The names a module defines or imports (or lists in `__all__`, for a module whose
    `__getattr__` loads them on first use)."""
    tree = ast.parse(module.read_text(encoding="utf-8"), str(module))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names.update(
                e.value for e in getattr(node.value, "elts", ()) if isinstance(e, ast.Constant)
            )
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
            source = _star_source(module, node)  # a face that re-exports a module whole
            names.update(_defined(source) if source else ())
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def _star_source(module: Path, node: ast.ImportFrom) -> Path | None:
    """The file `from ... import *` in `module` reads, absolute or relative."""
    if node.level == 0:
        parts = (node.module or "").split(".")
    else:
        package = module.parent.relative_to(REPO).parts
        parts = [*package[: len(package) - node.level + 1], *(node.module or "").split(".")]
    found = _module_file([p for p in parts if p])
    return found if found is not None and found.is_file() else None


def _module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    if base.is_dir() and parts[0] in ("tests", "benchmarks", "examples", "tools"):
        return base  # a folder of scripts or tests without __init__.py
    return None


@functools.cache
def _alias_target(module: Path) -> str | None:
    """The module an alias module stands for: one that imports another module and puts it in
    its own place (`sys.modules[__name__] = module`), so that an old import path keeps
    working."""
    tree = ast.parse(module.read_text(encoding="utf-8"), str(module))
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            imported.update({a.asname or a.name: a.name for a in node.names})
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Subscript)
            and ast.unparse(node.targets[0]) == "sys.modules[__name__]"
            and isinstance(node.value, ast.Name)
        ):
            return imported.get(node.value.id)
    return None


def dotted_exists(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:]
        if not rest or module.is_dir():
            return not rest
        target = _alias_target(module)
        if target is not None:
            return dotted_exists(".".join([target, *rest]))
        return rest[0] in _defined(module)
    return False


@functools.cache
def _tree_folders() -> tuple[Path, ...]:
    roots = [REPO / root for root in FOLDERS if (REPO / root).is_dir()]
    return tuple(d for root in roots for d in (root, *root.rglob("*")) if d.is_dir())


@functools.cache
def _tree_folder_names() -> frozenset[str]:
    return frozenset(folder.name for folder in _tree_folders())


def path_exists(path: str) -> bool:
    if path.split("/")[0] in FOLDERS:
        return bool(list(REPO.glob(path.rstrip("/")))) if "*" in path else (REPO / path).exists()
    return any((folder / path).exists() for folder in _tree_folders())


def exists(name: str) -> bool:
    return path_exists(name) if "/" in name else dotted_exists(name)


def _where(path: Path) -> str:
    return str(path.relative_to(REPO))


def broken_names() -> list[str]:
    broken = []
    for page in markdown_files():
        for name in sorted(names_in(page.read_text(encoding="utf-8"), markdown=True)):
            if not exists(name):
                broken.append(f"{_where(page)}: {name}")
    for source in python_files():
        for text in docstrings(source):
            for name in sorted(names_in(text, markdown=False)):
                if not exists(name):
                    broken.append(f"{_where(source)}: {name}")
    return sorted(set(broken))


def test_every_module_path_named_in_the_docs_and_docstrings_exists():
    assert broken_names() == []


@pytest.mark.parametrize(
    ("name", "real"),
    [
        ("zlaunch.cli", True),
        ("zlaunch.cli.main", True),
        ("zlaunch.cli.no_such_name", False),
        ("zlaunch.no_such_module", False),
        ("runtime.config.load_config", True),
        ("runtime/config/", True),
        ("runtime/config/no_such.py", False),
        ("benchmarks/results/*.md", True),
        ("benchmarks/results/no_such_*.md", False),
        ("config/load.py", True),
        ("zero/stage3/", True),
        ("no_such_folder/load.py", False),
        ("runtime.zero.Init", True),
        ("runtime.config.ZeroConfig", True),  # re-exported by the face with import *
    ],
)
def test_a_name_is_found_only_where_it_is(name, real):
    assert exists(name) is real


def test_names_are_taken_from_code_spans_and_rooted_dotted_names():
    page = "Run `python -m zlaunch.agent` and see `runtime/config/`; zlaunch.cli in prose.\n"
    assert names_in(page, markdown=True) == {"zlaunch.agent", "runtime/config/"}
    doc = "Reads ``runtime.config.load`` and the agent (zlaunch.agent.loop), not out/ckpt-4."
    assert names_in(doc, markdown=False) == {"runtime.config.load", "zlaunch.agent.loop"}
    written = "Saves under `zlaunch_runs/` and `global_stepN/`, reads `config/no_such.py`."
    assert names_in(written, markdown=True) == {"config/no_such.py"}


def test_an_alias_module_stands_for_the_module_it_puts_in_its_place(tmp_path):
    alias = tmp_path / "old_name.py"
    alias.write_text(
        '"""The old path."""\n\nimport sys\n\nfrom runtime.config import load\n\n'
        "sys.modules[__name__] = load\n"
    )
    assert _alias_target(alias) == "runtime.config.load"
    plain = tmp_path / "plain.py"
    plain.write_text("import sys\n\nVALUE = sys.maxsize\n")
    assert _alias_target(plain) is None
