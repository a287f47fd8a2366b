"""The run directory, ``zlaunch_runs/<run-id>/``: its layout and reads (`layout`), the typed
records its files hold (`records`: run status, ranks.json, failure.json), the writer the
launcher drives (`recorder`), and the per-account index of runs (`index`). The readers (`ls`,
`logs`, `status`, `stop`, `stacks`) use the same records the writer writes."""

from __future__ import annotations

from zlaunch.rundir.index import default_log_dir, index_dir, indexed_run_paths
from zlaunch.rundir.layout import (
    RunDir,
    find_run,
    host_dirname,
    list_runs,
    lock_holder,
    new_run_id,
    process_identity,
    run_paths,
)
from zlaunch.rundir.recorder import Recorder
from zlaunch.rundir.records import (
    REASON_HANG,
    Failure,
    FailureReport,
    RankPhase,
    RankRow,
    RanksFile,
    RunStatus,
)

__all__ = [
    "Failure",
    "FailureReport",
    "REASON_HANG",
    "RankPhase",
    "RankRow",
    "RanksFile",
    "Recorder",
    "RunDir",
    "RunStatus",
    "default_log_dir",
    "find_run",
    "host_dirname",
    "index_dir",
    "indexed_run_paths",
    "list_runs",
    "lock_holder",
    "new_run_id",
    "process_identity",
    "run_paths",
]
