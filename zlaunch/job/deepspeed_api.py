"""Which runtime serves ``import deepspeed`` in the workers: the installed DeepSpeed or the
bundled one (this project's runtime, through its compatibility package).

Hugging Face's Trainer, accelerate and TRL drive DeepSpeed themselves; they need ``import
deepspeed`` to work. When the job's Python has no DeepSpeed, zlaunch puts the runtime's
compatibility directory (``runtime/deepspeed_api``: a ``deepspeed/`` package over the runtime and
its distribution metadata) first on the workers' ``PYTHONPATH``. Nothing named deepspeed is ever
installed. With a real DeepSpeed present, ``--runtime`` chooses: the default keeps the installed
one; ``--runtime bundled`` shadows it for this job only, and says so on the start line.

`choose` is the decision (pure, table-tested); `find_installed` asks the job's interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from zlaunch.errors import UsageError
from zlaunch.worker import probe_code

__all__ = [
    "RUNTIME_CHOICES",
    "DeepSpeedApi",
    "Installed",
    "choose",
    "find_installed",
    "worker_pythonpath",
]

RUNTIME_CHOICES = ("auto", "bundled", "deepspeed")

# Run by the job's interpreter: where a real `deepspeed` would import from (nothing is
# imported: find_spec only locates it), and its distribution version. The bundled directory
# (on a PYTHONPATH the user set) is skipped: zlaunch itself decides whether workers get it.
_PROBE = """
import importlib.util, importlib.metadata, os, sys
bundled = sys.argv[1]
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != bundled]
spec = importlib.util.find_spec("deepspeed")
origin = getattr(spec, "origin", None) or ""
if spec is None or os.path.dirname(os.path.dirname(os.path.abspath(origin))) == bundled:
    print("none")
else:
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    print(version + "\\t" + os.path.dirname(origin))
"""


@dataclass(frozen=True)
class Installed:
    """A real DeepSpeed the job's Python imports: its version and package directory."""

    version: str
    location: str


@dataclass(frozen=True)
class DeepSpeedApi:
    """The decision: ``bundled`` (prepend `path` to the workers' PYTHONPATH) or ``deepspeed``
    (leave the path alone); `describe` is the start line's words."""

    kind: str
    path: str | None = None
    shadowed: Installed | None = None
    installed: Installed | None = None

    def describe(self) -> str:
        if self.kind == "deepspeed":
            assert self.installed is not None
            return f"DeepSpeed API: installed DeepSpeed {self.installed.version} ({self.installed.location})"
        text = "DeepSpeed API: zlaunch's bundled runtime"
        if self.shadowed is not None:
            return (
                f"{text} (--runtime bundled; the installed DeepSpeed {self.shadowed.version} "
                "is not used by this job)"
            )
        return f"{text} (no deepspeed package in the job's Python)"


def bundled_path() -> str:
    from runtime.deepspeed_api import PATH

    return PATH


def choose(requested: str, installed: Installed | None, path: str) -> DeepSpeedApi:
    """``--runtime`` (auto, bundled, deepspeed) and what the job's Python has -> the runtime."""
    if requested not in RUNTIME_CHOICES:
        raise UsageError(
            f"--runtime must be one of {', '.join(RUNTIME_CHOICES)}, got {requested!r}"
        )
    if requested == "deepspeed":
        if installed is None:
            raise UsageError(
                "--runtime deepspeed: the job's Python has no deepspeed package",
                hint="install DeepSpeed there (pip install deepspeed), or use --runtime "
                "bundled (this project's runtime serves the DeepSpeed API)",
            )
        return DeepSpeedApi("deepspeed", installed=installed)
    if requested == "bundled":
        return DeepSpeedApi("bundled", path=path, shadowed=installed)
    if installed is not None:
        return DeepSpeedApi("deepspeed", installed=installed)
    return DeepSpeedApi("bundled", path=path)


def find_installed(python: str, environ: dict[str, str] | None = None) -> Installed | None:
    """The real DeepSpeed that ``python`` (the job's interpreter, with the workers' PYTHONPATH)
    would import, or None. For zlaunch's own interpreter the answer is found in this process
    (its site-packages plus the workers' PYTHONPATH, searched without importing anything);
    another interpreter is asked in a subprocess (its site-packages are what workers see)."""
    env = dict(os.environ if environ is None else environ)
    if python == sys.executable:
        return _parse(_probe_here(bundled_path(), _worker_search_path(env.get("PYTHONPATH"))))
    try:
        done = subprocess.run(
            [python, "-c", probe_code(_PROBE), bundled_path()],  # in this directory: not from it
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UsageError(
            f"cannot ask {python} whether it has DeepSpeed: {err}",
            hint="give --runtime bundled or --runtime deepspeed to say which runtime serves "
            "the DeepSpeed API",
        ) from None
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not answer:
        raise UsageError(
            f"cannot ask {python} whether it has DeepSpeed (exit {done.returncode}: "
            f"{done.stderr.strip()[-300:]})",
            hint="give --runtime bundled or --runtime deepspeed",
        )
    return _parse(answer[0])


def _worker_search_path(pythonpath: str | None) -> list[str]:
    """The import path a worker of this interpreter gets: its PYTHONPATH, then this
    interpreter's own entries (sys.path without zlaunch's script directory and without the
    entries zlaunch's own PYTHONPATH added)."""
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    given = [p for p in (pythonpath or "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p and os.path.abspath(p) not in own]
    bundled = bundled_path()
    return [p for p in [*given, *rest] if os.path.abspath(p) != bundled]


def _probe_here(bundled: str, search_path: list[str]) -> str:
    """`_PROBE`'s answer for this interpreter and ``search_path``, without a subprocess and
    without importing anything."""
    import importlib.machinery
    import importlib.metadata

    spec = importlib.machinery.PathFinder.find_spec("deepspeed", search_path)
    origin = getattr(spec, "origin", None) or ""
    if spec is None or os.path.dirname(os.path.dirname(os.path.abspath(origin))) == bundled:
        return "none"
    found = next(iter(importlib.metadata.distributions(name="deepspeed", path=search_path)), None)
    version = found.version if found is not None else "unknown version"
    return version + "\t" + os.path.dirname(origin)


def _parse(answer: str) -> Installed | None:
    if answer == "none":
        return None
    version, _, location = answer.partition("\t")
    return Installed(version, location)


def worker_pythonpath(api: DeepSpeedApi, current: str | None) -> str | None:
    """The workers' PYTHONPATH: the bundled directory first when it serves the API, and not
    at all when the installed DeepSpeed does (a PYTHONPATH naming it would shadow the runtime
    the start line names)."""
    bundled = api.path or bundled_path()
    parts = [p for p in (current or "").split(os.pathsep) if p and os.path.abspath(p) != bundled]
    if api.kind == "bundled":
        return os.pathsep.join([bundled, *parts])
    if current is None:
        return None
    return os.pathsep.join(parts)
