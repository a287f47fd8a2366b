"""The contract between controller, agent and workers lives in one stdlib-only module.

* ``zlaunch/wire/protocol.py`` (the shared names) and ``zlaunch/wire/frames.py`` (the frames between
  controller and agents) import only the standard library and each other, so workers and agents
  can import them anywhere;
* the runtime imports nothing of zlaunch but that module (the Slurm hostlist grammar lives in
  the runtime, torch-free, and the controller imports it from there);
* every ``ZLAUNCH_*`` variable that crosses a process boundary is named in protocol.py only:
  a literal elsewhere is a second spelling waiting to drift. The controller-local knobs below
  never reach a worker.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALLOWED_IN_RUNTIME = {"zlaunch.wire.protocol"}
CONTROLLER_LOCAL = {"ZLAUNCH_TRACE", "ZLAUNCH_LIVE", "ZLAUNCH_LOG_DIR", "ZLAUNCH_TEST_SLOW_SAVE"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "zlaunch":
                names.update(f"zlaunch.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize(
    "module,allowed",
    [("protocol", set()), ("frames", {"zlaunch.wire.protocol"}), ("gloo_idle", set())],
)
def test_the_contract_imports_only_the_standard_library(module, allowed):
    third_party = {
        name
        for name in _imports(REPO / "zlaunch" / f"{module}.py")
        if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__"
    }
    assert third_party == allowed


def test_runtime_imports_only_the_protocol_of_zlaunch():
    found = {}
    for path in (REPO / "runtime").rglob("*.py"):
        used = {n for n in _imports(path) if n == "zlaunch" or n.startswith("zlaunch.")}
        if used - ALLOWED_IN_RUNTIME:
            found[str(path.relative_to(REPO))] = sorted(used - ALLOWED_IN_RUNTIME)
    assert found == {}


def test_shared_variable_names_are_spelled_once():
    protocol = (REPO / "zlaunch" / "protocol.py").read_text()
    elsewhere = {}
    for package in ("zlaunch", "runtime"):
        for path in (REPO / package).rglob("*.py"):
            if path.name == "protocol.py" and path.parent.name == "zlaunch":
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


# The agent's whole folder, and the modules its nodes and workers load beside it.
AGENT_SIDE = [
    *sorted((REPO / "zlaunch" / "agent").glob("*.py")),
    *(
        REPO / "zlaunch" / name
        for name in (
            "worker_boot.py",
            "worker_group.py",
            "gloo_idle.py",
            "save_request.py",
            "frames.py",
            "protocol.py",
            "collective_records.py",
            "liveness.py",
            "connect_handshake.py",
            "python_start.py",
            "stack_dumper.py",
            "stack_dumps.py",
            "worker_args.py",
            "redact.py",
        )
    ),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_agent_side_imports_only_the_standard_library_and_itself():
    # The agent and the worker boot run on every node, under whatever Python is there: the
    # controller's dependencies (click, rich, fabric) may not be installed.
    assert len(AGENT_SIDE) >= 8, "the agent folder was not found"
    own = {"zlaunch", "zlaunch.agent"} | {_module_name(path) for path in AGENT_SIDE}
    found = {}
    for path in AGENT_SIDE:
        used = _imports(path)
        other = {
            n
            for n in used - own
            if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"
        }
        if other:
            found[str(path.relative_to(REPO))] = sorted(other)
    assert found == {}
