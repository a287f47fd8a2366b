"""Every ``deepspeed.X.Y`` a client's source reaches, found in its syntax tree (nothing runs).

Three kinds of entry: ``module`` (``import deepspeed.a.b``), ``name`` (``from deepspeed.a import
b``, an attribute or a submodule), ``attribute`` (``deepspeed.a.b`` in an expression, through the
names the file bound: ``import deepspeed.comm as dist`` makes ``dist.get_rank`` reach
``deepspeed.comm.get_rank``), and ``engine`` (``<...engine...>.attr`` where ``attr`` is one of
DeepSpeed's engine attributes, in a file that imports deepspeed).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator

__all__ = ["Use", "scan_file", "scan_tree"]

_ENGINE_RECEIVER = re.compile(r"engine|model_wrapped|deepspeed", re.IGNORECASE)

Use = tuple[str, str, int]  # (kind, name, line)


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when it is not a plain dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def scan_file(source: str, engine_names: Iterable[str] = ()) -> Iterator[Use]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    engine_names = frozenset(engine_names)
    bound: dict[str, str] = {}  # local name -> the deepspeed path it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "deepspeed" or alias.name.startswith("deepspeed."):
                    yield "module", alias.name, node.lineno
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["deepspeed"] = "deepspeed"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "deepspeed" or node.module.startswith("deepspeed."):
                yield "module", node.module, node.lineno
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    full = f"{node.module}.{alias.name}"
                    yield "name", full, node.lineno
                    bound[alias.asname or alias.name] = full
    if not bound:
        return
    # The longest dotted chain only: a.b.c, not also a.b.
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts = _chain(node)
        if parts and parts[0] in bound:
            yield "attribute", ".".join([bound[parts[0]], *parts[1:]]), node.lineno
        if node.attr in engine_names:
            receiver = ast.unparse(node.value)
            if _ENGINE_RECEIVER.search(receiver) and not receiver.startswith("deepspeed"):
                yield "engine", f"DeepSpeedEngine.{node.attr}", node.lineno


def scan_tree(root: str, engine_names: Iterable[str] = ()) -> Iterator[tuple[str, str, str, int]]:
    """(kind, name, path relative to root, line) for every .py file under root."""
    engine_names = frozenset(engine_names)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8", errors="replace") as f:
                source = f.read()
            if "deepspeed" not in source:
                continue
            for kind, name, line in scan_file(source, engine_names):
                yield kind, name, os.path.relpath(path, root), line
