"""What runs inside every worker process around the user's script, standard library only.

`boot` (the worker's start, run by the agent: arms the stacks thread, starts the
collective-records thread, then runs the script as ``__main__``; this face does not import it,
so running it runs it once), `python_start` (how every interpreter zlaunch starts, agent or
worker, runs a module without the working directory on ``sys.path``), `argv` (a worker's
secret-looking arguments kept off its command line), `stack_dumper` (the worker's stacks
thread), `group` (which process group the script joined, and a clean exit from a gloo group),
`save_request` (a script answers zlaunch's save request), `collective_records` (every rank's
recent collectives, copied to a file the agent reads).
"""

from __future__ import annotations

from zlaunch.worker import argv, save_request
from zlaunch.worker.collective_records import RecordFiles, collective_key
from zlaunch.worker.python_start import module_argv, probe_code, without_empty_entries
from zlaunch.worker.save_request import SaveRequest
from zlaunch.worker.stack_dumper import FALLBACK_AFTER

__all__ = [
    "FALLBACK_AFTER",
    "RecordFiles",
    "SaveRequest",
    "argv",
    "collective_key",
    "module_argv",
    "probe_code",
    "save_request",
    "without_empty_entries",
]
