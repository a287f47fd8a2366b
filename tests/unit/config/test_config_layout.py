"""The config package's modules import one way: reading -> schema -> values, never back
(the "auto" values, checked around a whole load, on top)."""

from __future__ import annotations

import ast
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[3] / "runtime" / "config"

# Each module of runtime/config/ and the modules of the package it may import (the package's
# __init__ is the public face and imports them; nothing imports it back).
ALLOWED = {
    "values": set(),
    "optimizer_names": {"values"},
    "blocks": {"values", "optimizer_names"},
    "scheduler": {"values"},
    "monitors": {"values"},
    "schema": {"values", "blocks", "scheduler", "monitors"},
    "features": {"values"},
    "files": {"values"},
    "keys": {"values", "features"},
    "load": {"values", "blocks", "scheduler", "monitors", "schema", "features", "files", "keys"},
    "auto_values": {"values", "files", "load", "schema"},
}


def package_imports(path: Path) -> set[str]:
    """The sibling modules (and the package itself, as "__init__") that a module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found |= {a.name for a in node.names}
        elif node.level == 0 and (node.module or "") == "runtime.config":
            found.add("__init__")
        elif node.level == 0 and (node.module or "").startswith("runtime.config."):
            found.add(node.module.split(".")[2])
    return found


def test_every_module_of_the_package_is_in_the_table():
    modules = {p.stem for p in CONFIG.glob("*.py")} - {"__init__"}
    assert modules == set(ALLOWED)


def test_the_schema_knows_nothing_of_reading():
    for module, allowed in ALLOWED.items():
        extra = package_imports(CONFIG / f"{module}.py") - allowed
        assert not extra, f"runtime/config/{module}.py imports {sorted(extra)}"


def test_no_module_uses_another_ones_private_names():
    for path in [*CONFIG.parent.glob("*.py"), *CONFIG.parent.glob("*/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            inside = path.parent == CONFIG and node.level == 1
            if (
                inside
                or module.startswith("runtime.config")
                or (node.level and module.split(".")[0] == "config")
            ):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path} imports {private} from {module}"
