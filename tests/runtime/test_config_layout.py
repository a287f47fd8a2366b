"""The config modules import one way: reading -> schema -> values, never back."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"

# Each module and the config modules it may import (runtime.config is the public face and
# imports them all; nothing imports it back).
ALLOWED = {
    "config_values": set(),
    "config_blocks": {"config_values"},
    "config_scheduler": {"config_values"},
    "config_monitors": {"config_values"},
    "config_schema": {"config_values", "config_blocks", "config_scheduler", "config_monitors"},
    "config_features": {"config_values"},
    "config_files": {"config_values"},
    "config_keys": {"config_values", "config_features"},
}


def config_imports(module: str) -> set[str]:
    tree = ast.parse((RUNTIME / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {n.split(".")[0] for n in names if n and n.startswith("config")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runtime.config"):
            found.add(node.module.split(".")[1])
    return found


def test_the_schema_knows_nothing_of_reading():
    for module, allowed in ALLOWED.items():
        extra = config_imports(module) - allowed
        assert not extra, f"runtime/{module}.py imports {sorted(extra)}"


def test_no_config_module_uses_another_ones_private_names():
    for path in RUNTIME.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("config", "runtime.config")
            ):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
