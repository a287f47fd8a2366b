"""Text the controller shows and reads, pure: clipped values (`shorten`), rank ranges
("0-3,5": `ranks`) and hosts as a hostlist ("node[000-127]": `hosts`), what of argv and the
environment may be shown or written (`redact`), faulthandler dumps parsed and grouped
(`stack_dumps`)."""

from __future__ import annotations

from zlaunch.text.hosts import host_ranges
from zlaunch.text.ranks import rank_ranges
from zlaunch.text.redact import REDACTED, recorded_env_value, redact_argv, shown_env_value
from zlaunch.text.shorten import brief, clip
from zlaunch.text.stack_dumps import (
    DUMP_MARKER,
    FAULTHANDLER,
    MAIN_DUMPER,
    QUIET_AFTER,
    STACK_FRAME,
    STACK_HEADER,
    THREAD_DUMPER,
    dump_marker,
    group_ranks,
    parse_dump,
    parse_dump_by,
    stack_line_count,
)

__all__ = [
    "DUMP_MARKER",
    "FAULTHANDLER",
    "MAIN_DUMPER",
    "QUIET_AFTER",
    "REDACTED",
    "STACK_FRAME",
    "STACK_HEADER",
    "THREAD_DUMPER",
    "brief",
    "clip",
    "dump_marker",
    "group_ranks",
    "host_ranges",
    "parse_dump",
    "parse_dump_by",
    "rank_ranges",
    "recorded_env_value",
    "redact_argv",
    "shown_env_value",
    "stack_line_count",
]
