"""Where runs live, and a per-user index of them, so any directory finds them.

A run's directory is ``<log dir>/<run id>``: the log dir is ``--log-dir``, else
``$ZLAUNCH_LOG_DIR``, else ``./zlaunch_runs``. Every run the controller creates is also recorded
in the user's state directory (``$XDG_STATE_HOME/zlaunch/runs``, default
``~/.local/state/zlaunch/runs``) as a symlink named by its id that points at the run's
directory; ``zlaunch ls/logs/status/stop/stacks/plot`` without ``--log-dir`` read the index (and
``./zlaunch_runs``), so a run is found from any directory. A link whose run was deleted is
dropped when read.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

__all__ = [
    "LOG_DIR_ENV",
    "DEFAULT_LOG_DIR_NAME",
    "default_log_dir",
    "index_dir",
    "register",
    "indexed_run_paths",
]

LOG_DIR_ENV = "ZLAUNCH_LOG_DIR"
DEFAULT_LOG_DIR_NAME = "zlaunch_runs"
RUN_FILE = "run.json"


def default_log_dir(environ: Mapping[str, str] | None = None) -> str:
    """Absolute root of new run directories when --log-dir is not given."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR_NAME
    return os.path.abspath(os.path.expanduser(chosen))


def index_dir(environ: Mapping[str, str] | None = None) -> str:
    """The per-user index: ``$XDG_STATE_HOME/zlaunch/runs`` (XDG's default ~/.local/state)."""
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):  # XDG: a relative value is invalid and ignored
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "zlaunch", "runs")


def register(run_id: str, path: str, environ: Mapping[str, str] | None = None) -> str:
    """Record the run in the index (atomically: link to a temporary name, then rename).

    Raises OSError when the index cannot be written; the caller says so, the run goes on.
    """
    root = index_dir(environ)
    os.makedirs(root, mode=0o700, exist_ok=True)
    link = os.path.join(root, run_id)
    tmp = f"{link}.tmp.{secrets.token_hex(8)}"  # not guessable: nobody plants at it first
    try:
        os.symlink(os.path.abspath(path), tmp)
        os.replace(tmp, link)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return link


def indexed_run_paths(environ: Mapping[str, str] | None = None) -> list[str]:
    """Directories of the indexed runs that still exist; links to deleted runs are dropped."""
    root = index_dir(environ)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    paths = []
    for name in names:
        link = os.path.join(root, name)
        if ".tmp." in name:
            continue
        try:
            target = os.readlink(link)  # another listing may drop the link meanwhile
        except OSError:
            continue
        if os.path.isfile(os.path.join(target, RUN_FILE)):
            paths.append(target)
        elif _deleted(target):
            try:
                os.unlink(link)  # the run was deleted: forget it
            except OSError:
                pass
    return paths


def _deleted(run_path: str) -> bool:
    """The run directory is gone for good: its log root is there and readable, and the run
    is not in it. A root that is unreadable or unmounted right now deletes nothing."""
    try:
        os.stat(run_path)
        return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        os.listdir(os.path.dirname(run_path))
    except OSError:
        return False
    return True
