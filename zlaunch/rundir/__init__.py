"""The run directory, ``zlaunch_runs/<run-id>/``: its layout and reads (`layout`), the typed
records its files hold (`records`: run status, ranks.json, failure.json), the writer the
launcher drives (`recorder`), and the per-account index of runs (`index`). The readers (`ls`,
`logs`, `status`, `stop`, `stacks`) use the same records the writer writes."""

from zlaunch.rundir.layout import RunDir, find_run, host_dirname, list_runs, new_run_id
from zlaunch.rundir.records import Failure, FailureReport, RankPhase, RankRow, RanksFile, RunStatus

__all__ = [
    "Failure",
    "FailureReport",
    "RankPhase",
    "RankRow",
    "RanksFile",
    "RunDir",
    "RunStatus",
    "find_run",
    "host_dirname",
    "list_runs",
    "new_run_id",
]
