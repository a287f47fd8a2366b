"""The contract between controller, agents, workers and the runtime stands on the standard
library alone.

* ``zlaunch/wire/`` (the ground: the shared names, the frames, the handshake, liveness,
  hostlists, the batch arithmetic, the gloo-idle wait) imports only the standard library and
  itself, so workers and agents can import it anywhere;
* ``zlaunch/text/`` (clipping, ranges, redaction, stack dumps: pure text) does too, and the
  ground;
* ``zlaunch/agent/`` and ``zlaunch/worker/`` (what runs on every node and in every rank, under
  whatever Python is there) import only the standard library, those two and each other;
* the runtime imports nothing of zlaunch but the ground;
* every ``ZLAUNCH_*`` variable that crosses a process boundary is named in
  ``zlaunch/wire/protocol.py`` only: a literal elsewhere is a second spelling waiting to drift.
  The controller-local knobs below never reach a worker.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WIRE = REPO / "zlaunch" / "wire"
PROTOCOL = WIRE / "protocol.py"
CONTROLLER_LOCAL = {"ZLAUNCH_TRACE", "ZLAUNCH_LIVE", "ZLAUNCH_LOG_DIR", "ZLAUNCH_TEST_SLOW_SAVE"}


def _imports(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (relative ones made absolute)."""
    parts = path.relative_to(REPO).with_suffix("").parts if REPO in path.parents else ("x",)
    package = ".".join(parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def _outside(path: Path, own: tuple[str, ...]) -> list[str]:
    """What ``path`` imports beyond the standard library and the packages in ``own``."""
    return sorted(
        name
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name != "__future__"
        and name != "zlaunch"
        and not any(name == p or name.startswith(p + ".") for p in own)
    )


@pytest.mark.parametrize("folder", ["wire", "text"])
def test_the_ground_and_text_import_only_the_standard_library(folder):
    found = {
        str(path.relative_to(REPO)): _outside(path, ("zlaunch.wire", f"zlaunch.{folder}"))
        for path in sorted((REPO / "zlaunch" / folder).glob("*.py"))
    }
    assert len(found) >= 5, f"zlaunch/{folder} was not found"
    assert {path: names for path, names in found.items() if names} == {}


@pytest.mark.parametrize("folder", ["agent", "worker"])
def test_the_agent_and_the_worker_side_import_only_the_standard_library(folder):
    # The agent and the worker boot run on every node, under whatever Python is there: the
    # controller's dependencies (click, rich, fabric) may not be installed.
    paths = sorted((REPO / "zlaunch" / folder).glob("*.py"))
    assert len(paths) >= 4, f"zlaunch/{folder} was not found"
    own = ("zlaunch.wire", "zlaunch.text", "zlaunch.agent", "zlaunch.worker")
    found = {str(path.relative_to(REPO)): _outside(path, own) for path in paths}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_checker_sees_a_third_party_import(tmp_path):
    assert _outside(PROTOCOL, ("zlaunch.wire",)) == []
    fake = tmp_path / "probe.py"
    fake.write_text(
        "import os\nimport torch\nfrom zlaunch.wire import frames\nfrom zlaunch import console\n"
    )
    assert _outside(fake, ("zlaunch.wire",)) == ["torch", "zlaunch.console"]


def test_runtime_imports_only_the_ground_of_zlaunch():
    found = {}
    for path in (REPO / "runtime").rglob("*.py"):
        used = {
            n
            for n in _imports(path)
            if (n == "zlaunch" or n.startswith("zlaunch."))
            and not (n == "zlaunch.wire" or n.startswith("zlaunch.wire."))
        }
        if used:
            found[str(path.relative_to(REPO))] = sorted(used)
    assert found == {}


def test_shared_variable_names_are_spelled_once():
    protocol = PROTOCOL.read_text()
    elsewhere = {}
    for package in ("zlaunch", "runtime"):
        for path in (REPO / package).rglob("*.py"):
            if path == PROTOCOL:
                continue
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for name in re.findall(r"^ZLAUNCH_[A-Z_]+$", node.value):
                        if name not in CONTROLLER_LOCAL:
                            elsewhere.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert elsewhere == {}
    for name in ("ZLAUNCH_EVENTS_FD", "ZLAUNCH_CONFIG", "ZLAUNCH_SAVE_ON", "ZLAUNCH_BATCH"):
        assert f'"{name}"' in protocol
