"""Running a job: `launch` (`job`: attempts until one ends the run), the attempt's state
machine (`state`, pure), what follows a failed attempt (`restart_policy`, `elastic`), the hang
watch (`hang`), the agent connections (`agent_links`) and where a rank's lines go
(`rank_output`), the checkpoint a job saved last (`saved_checkpoint`). Imported only when a job starts, so ``zlaunch --help`` stays fast."""

from __future__ import annotations

from zlaunch.launcher.hang import hang_failure
from zlaunch.launcher.hang_records import decode_records
from zlaunch.launcher.job import launch
from zlaunch.launcher.saved_checkpoint import latest_tag

__all__ = [
    "decode_records",
    "hang_failure",
    "latest_tag",
    "launch",
]
