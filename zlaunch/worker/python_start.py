"""How zlaunch starts a Python module without the working directory on ``sys.path`` (stdlib only).

``python -m MODULE`` puts the working directory first on ``sys.path`` before it imports anything:
measured with every standard module's name planted in the directory, 3.10 imports ``runpy``
from there, 3.11 the module's own package (``zlaunch/``), 3.12 ``importlib``. In a shared
working directory (a group project folder on a cluster) a ``zlaunch/`` folder or a ``json.py``
left by another user would run in every rank as the job's user. ``-P`` refuses that from 3.11
on, but 3.10 has no such flag, and a node's interpreter version is not known where its command
line is built. So every interpreter zlaunch starts (the agents, the workers' boot, the
controller re-run under ``salloc``) runs ``python -c CODE`` instead: `SAFE_PATH` drops the
``''`` entry that ``-c`` puts first, before any import, and then ``runpy`` runs the module
exactly as ``-m`` does (``_run_module_as_main`` is the function ``-m`` itself calls: the same
``__main__``, ``sys.argv[0]`` and error for a missing module, on 3.10 to 3.13).

What ``-c`` never reads: ``PYTHONSTARTUP`` and ``PYTHONINSPECT``'s prompt (interactive runs only;
the workers' stdin is not a terminal). What no command line can refuse: an empty entry in
``PYTHONPATH`` (``:/opt/lib``) is the working directory while the interpreter starts, before
any of its code runs (a planted ``encodings.py`` is imported there): the plan drops such
entries from the workers' ``PYTHONPATH`` (zlaunch/job/plan.py) and the agent from whatever its
node adds (zlaunch/agent/workers.py).
"""

from __future__ import annotations

__all__ = ["SAFE_PATH", "module_argv", "module_code", "probe_code", "without_empty_entries"]

SAFE_PATH = 'import sys; sys.path[:1] == [""] and sys.path.pop(0)'  # no ' : reads well quoted
"""Python that drops the working directory ``-c`` puts first on sys.path (nothing when
``PYTHONSAFEPATH`` kept it off). It imports nothing but the built-in ``sys``."""


def module_code(module: str) -> str:
    """``-c`` code that runs ``module`` as ``python -m module`` would, less the working
    directory on sys.path."""
    if not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"not a module name: {module!r}")
    return f'{SAFE_PATH}; import runpy; runpy._run_module_as_main("{module}")'


def module_argv(
    python: str, module: str, *args: str, flags: tuple[str, ...] = ("-u",)
) -> list[str]:
    """``python FLAGS -m module ARGS...`` without the working directory on sys.path."""
    return [python, *flags, "-c", module_code(module), *args]


def probe_code(code: str) -> str:
    """A ``-c`` script that may import anything: the working directory is off sys.path first."""
    return f"{SAFE_PATH}\n{code}"


def without_empty_entries(pythonpath: str, sep: str = ":") -> tuple[str, bool]:
    """``PYTHONPATH`` without its empty entries (each one is the working directory), and
    whether there were any. ``.`` still means the working directory: that one was written."""
    if not pythonpath:  # set but empty: Python reads no entry from it at all
        return pythonpath, False
    parts = pythonpath.split(sep)
    kept = [p for p in parts if p]
    return sep.join(kept), len(kept) != len(parts)
