"""The tree is the architecture: its parts, their order, their faces; no import cycles.

* **No cycle.** Every import statement counts, also one inside a function: a deferred import
  that closes a cycle still ties two modules into one, and it fails the day someone moves it to
  the top. A package's face (``__init__``) is a node of its own; importing a submodule does not
  count as importing its package's face.
* **Nothing imports upward.** The parts stand in one order (`LAYERS`, the ground first); a
  module imports only from its own part and from the parts before it. The runtime's parts come
  before the controller's: zlaunch may use the runtime's torch-free parts (config checks, the
  estimator, checkpoint conversion), the runtime imports nothing of zlaunch but the ground
  (`tests/unit/test_contract.py`).
* **No face bypassed.** From outside a folder its modules are reached through its face: a name
  the face exports, or a module the face names as a namespace in its ``__all__`` (``from
  zlaunch.wire import protocol``). A folder's own modules, and the folders inside it, import
  its modules directly.
* **Faces hold nothing but names**: a docstring, imports, ``__all__``. A face whose names must
  load late (torch behind them, ``import runtime`` kept light for the controller's config
  checks) defers its imports to a ``__getattr__`` that only imports and returns (PEP 562).
* **No loose module** at the top of ``zlaunch/`` or ``runtime/`` but the faces, the entry points
  and the one-line aliases of public paths users write; no folder of more than 20 modules.
* The CLI's commands are reached only from the CLI.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("zlaunch", "runtime")
# DeepSpeed's own module paths, served for the Hugging Face integration: its `__init__` files
# are DeepSpeed's API (deepspeed.initialize, deepspeed.ops.adam.FusedAdam, ...), not our faces.
BUNDLED = REPO / "runtime" / "deepspeed_api" / "deepspeed"

# The parts, the ground first: a module may import its own part and the parts before it.
LAYERS = (
    "zlaunch.wire",  # the ground: names, frames, handshake, liveness, hostlists, batch arithmetic
    "runtime.errors",
    "runtime.config",
    "runtime.distributed",
    "runtime.optim",
    "runtime.observe",
    "runtime.zero",
    "runtime.checkpoint",
    "runtime.activation_checkpointing",
    "runtime.engine",
    "runtime",  # the face, and the aliases runtime.checkpointing, runtime.dist, ...
    "runtime.deepspeed_api",  # DeepSpeed's module paths over the runtime's face
    "zlaunch.errors",
    "zlaunch.text",
    "zlaunch.worker",
    "zlaunch.job",
    "zlaunch.agent",
    "zlaunch.transport",
    "zlaunch.rundir",
    "zlaunch.console",
    "zlaunch.launcher",
    "zlaunch.commands",
    "zlaunch",  # the face, the CLI and its entry points, the alias zlaunch.save_request
)

ENTRY_POINTS = {"zlaunch/__main__.py", "zlaunch/cli.py"}
ALIASES = {
    "zlaunch/save_request.py": "zlaunch.worker.save_request",  # README's SaveRequest import
    "runtime/dist.py": "runtime.distributed.script_comm",  # import runtime.dist (deepspeed.comm)
    "runtime/parallel_groups.py": "runtime.distributed.parallel_groups",  # ModelParallelGroups
    "runtime/checkpointing.py": "runtime.activation_checkpointing",  # deepspeed.checkpointing
}
MAX_MODULES = 20

# Imports the rules would refuse, each with its reason. Keep it short.
ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that ``name`` imports, wherever the statement stands."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(name, path, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def part_of(module: str) -> str:
    """The part a module belongs to: the longest entry of LAYERS it falls under."""
    return max(
        (part for part in LAYERS if module == part or module.startswith(part + ".")), key=len
    )


def upward(edges: dict[str, set[str]]) -> list[str]:
    rank = {part: i for i, part in enumerate(LAYERS)}
    found = []
    for name, targets in edges.items():
        for target in targets:
            if rank[part_of(target)] > rank[part_of(name)] and (name, target) not in ALLOWED:
                found.append(f"{name} -> {target} ({part_of(name)} is below {part_of(target)})")
    return sorted(found)


def face_exports(path: Path) -> set[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            names = set()
            for elt in getattr(node.value, "elts", []):
                if isinstance(elt, ast.Constant):
                    names.add(elt.value)
                elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Attribute):
                    names |= face_exports(path.parent / f"{elt.value.value.id}.py")
            return names
    return set()


def _within(package: str, folder: str) -> bool:
    return package == folder or package.startswith(folder + ".")


def bypasses(found: dict[str, Path]) -> list[str]:
    """Imports of a folder's module from outside the folder that its face does not offer."""
    packages = {name for name, path in found.items() if path.name == "__init__.py"}
    exports = {name: face_exports(found[name]) for name in packages}
    out = []
    for name, path in found.items():
        if BUNDLED in path.parents or _shown(path) in ALIASES:
            continue  # DeepSpeed's paths; an alias is the module itself under another name
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                reached = [(alias.name, True) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(name, path, node)
                if target in packages:
                    reached = [(f"{target}.{alias.name}", True) for alias in node.names]
                else:
                    reached = [(target, False)]
            else:
                continue
            for module, via_face in reached:
                folder = module.rpartition(".")[0]
                if module in packages or module not in found or _within(own, folder):
                    continue
                if via_face and module.rpartition(".")[2] in exports.get(folder, ()):
                    continue  # the face names the module as a namespace
                if (name, module) not in ALLOWED:
                    out.append(f"{_shown(path)}:{node.lineno}: {module} (not through {folder})")
    return sorted(out)


def _only_imports(body: list[ast.stmt]) -> bool:
    """A deferred face's body: ``if name in (...):`` blocks that import and return, a raise."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Return, ast.Raise)):
            continue
        if isinstance(node, ast.If) and not node.orelse and _only_imports(node.body):
            continue
        return False
    return True


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if REPO in path.parents else str(path)


def face_problems(path: Path) -> list[str]:
    """What in a face is not a docstring, an import, ``__all__`` or a deferred import."""
    problems = []
    has_all = False
    for i, node in enumerate(ast.parse(path.read_text()).body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = {node.target.id}
        else:
            names = set()
        if names == {"__all__"}:
            has_all = True
            continue
        if names == {"__version__"} and path == REPO / "zlaunch" / "__init__.py":
            continue
        if (
            isinstance(node, ast.FunctionDef)
            and node.name == "__getattr__"
            and _only_imports(node.body)
        ):
            continue
        problems.append(f"{_shown(path)}:{node.lineno}: {type(node).__name__}")
    if not has_all:
        problems.append(f"{_shown(path)}: no __all__")
    return problems


def faces() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("__init__.py")
        if BUNDLED not in path.parents and path.parent != BUNDLED
    )


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_every_folder_has_its_place_in_the_order():
    folders = {
        module_name(path)
        for path in faces()
        if path.parent.parent in (REPO / "zlaunch", REPO / "runtime")
    }
    assert folders - set(LAYERS) == set(), "a new folder: give it its place in LAYERS"
    assert set(LAYERS) - folders - set(PACKAGES) == set()


def test_the_upward_finder_finds_an_upward_import():
    assert upward({"zlaunch.wire.frames": {"zlaunch.console.terminal"}}) == [
        "zlaunch.wire.frames -> zlaunch.console.terminal (zlaunch.wire is below zlaunch.console)"
    ]
    assert upward({"zlaunch.console.terminal": {"zlaunch.wire.frames"}}) == []
    assert upward({"runtime.zero.partition": {"runtime.engine.engine"}}) != []


def test_nothing_imports_upward():
    assert upward(graph()) == []


def test_the_bypass_finder_finds_a_bypass(tmp_path):
    found = modules()
    found["zlaunch.launcher.probe"] = tmp_path / "probe.py"
    (tmp_path / "probe.py").write_text(
        "from zlaunch.console.terminal import Console\n"  # past the face
        "from zlaunch.console import Console as Shown\n"  # through it
        "from zlaunch.wire import protocol\n"  # a namespace the face names
        "from zlaunch.launcher.state import AttemptMachine\n"  # its own folder
    )
    assert [line.split(": ", 1)[1] for line in bypasses(found) if "probe" in line] == [
        "zlaunch.console.terminal (not through zlaunch.console)"
    ]


def test_no_face_is_bypassed():
    assert bypasses(modules()) == []


@pytest.mark.parametrize("path", faces(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_face_holds_only_names(path):
    assert face_problems(path) == []


def test_the_face_checker_refuses_code_and_accepts_deferred_imports(tmp_path):
    face = tmp_path / "__init__.py"
    face.write_text('"""A face."""\n\nimport os\n\n__all__ = ["f"]\n\n\ndef f():\n    return 1\n')
    assert [p.rsplit(": ", 1)[1] for p in face_problems(face)] == ["FunctionDef"]
    face.write_text('"""A face."""\n\nfrom os import sep\n\nX = 1\n')
    assert [p.rsplit(": ", 1)[1] for p in face_problems(face)] == ["Assign", "no __all__"]
    face.write_text(
        '"""A face."""\n\n__all__ = ["path"]\n\n\ndef __getattr__(name):\n'
        '    if name in ("path",):\n        import os\n\n        return os.path\n'
        "    raise AttributeError(name)\n"
    )
    assert face_problems(face) == []
    face.write_text(face.read_text().replace("        return", "        x = 1\n        return"))
    assert [p.rsplit(": ", 1)[1] for p in face_problems(face)] == ["FunctionDef"]


def test_no_loose_modules_at_the_top():
    loose = {
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in (REPO / package).glob("*.py")
        if path.name != "__init__.py"
    }
    assert loose - ENTRY_POINTS - set(ALIASES) == set()


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_is_the_module_itself_under_its_public_name(alias):
    import importlib

    tree = ast.parse((REPO / alias).read_text())
    kinds = [type(node).__name__ for node in tree.body[1:]]
    assert kinds == ["Import", "ImportFrom", "Assign"], "an alias holds only the alias"
    public = alias[: -len(".py")].replace("/", ".")
    assert importlib.import_module(public) is importlib.import_module(ALIASES[alias])


def test_no_folder_holds_more_than_twenty_modules():
    sizes = {
        str(path.parent.relative_to(REPO)): len(list(path.parent.glob("*.py"))) - 1
        for path in faces()
    }
    assert {folder: n for folder, n in sizes.items() if n > MAX_MODULES} == {}


def test_only_the_cli_imports_its_commands():
    outside = {
        name: sorted(n for n in targets if n.startswith("zlaunch.commands"))
        for name, targets in graph().items()
        if not name.startswith("zlaunch.commands") and name != "zlaunch.cli"
    }
    assert {k: v for k, v in outside.items() if v} == {}


def test_architecture_names_exactly_the_folders():
    # ARCHITECTURE.md gives each folder a part heading (### `zlaunch/wire/`) or, for a folder
    # inside a part, a bullet of its own (- `runtime/zero/stage3/`: ...); nothing else.
    text = (REPO / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"^### `((?:zlaunch|runtime)/[\w/]+)/`", text, re.M))
    named |= set(re.findall(r"^- `((?:zlaunch|runtime)/[\w/]+)/`:", text, re.M))
    folders = {
        str(path.parent.relative_to(REPO))
        for path in faces()
        if path.parent not in (REPO / "zlaunch", REPO / "runtime")
    }
    assert named == folders


def test_every_name_a_face_exports_is_there():
    # A deferred face names its modules in strings of code that only runs on use: a name
    # whose module moved or lost it would fail only in the script that asks for it.
    import importlib

    missing = []
    for path in faces():
        face = importlib.import_module(module_name(path))
        missing += [f"{face.__name__}.{name}" for name in face.__all__ if not hasattr(face, name)]
    assert missing == []
