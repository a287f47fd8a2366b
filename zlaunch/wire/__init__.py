"""The ground: what crosses a process boundary, standard library only.

The one part of zlaunch that the runtime, the agents and the workers all import: the shared
names (`protocol`: frame and event kinds, signals, every ``ZLAUNCH_*`` variable), the frames
between controller and agents (`frames`), the typed events a worker sends (`events`), both
built on typed JSON records (`records`), the connect-back handshake (`handshake`), how long a
silent peer is allowed (`liveness`), Slurm hostlists (`hostlist`), the global batch kept when a
job restarts on another world size (`batch`), the metrics event checked (`metrics_check`) and
shown (`metrics_format`), and the bounded wait for gloo's threads before a process exits
(`gloo_idle`). Nothing here knows a policy; nothing here imports anything but the standard
library (`tests/unit/test_contract.py`).
"""

from __future__ import annotations

from zlaunch.wire import events, frames, handshake, liveness, protocol, records
from zlaunch.wire.batch import BatchError, BatchOverride, kept_batch, override_from_env
from zlaunch.wire.frames import line_bytes, line_text
from zlaunch.wire.gloo_idle import wait_for_idle_gloo_threads
from zlaunch.wire.handshake import MAX_LINE, Answer, HandshakeError, TokenMismatch
from zlaunch.wire.hostlist import HostlistError, compress, expand, first_host
from zlaunch.wire.liveness import BASE_HEARTBEAT_TIMEOUT, SilenceClock
from zlaunch.wire.metrics_check import checked_metrics
from zlaunch.wire.metrics_format import (
    META_KEYS,
    PARTS,
    breakdown_text,
    format_line,
    human_bytes,
    mfu_text,
    number,
    rate,
    split,
)
from zlaunch.wire.protocol import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_EVENT,
    COLLECTIVE_MISMATCH,
    COLLECTIVE_TIMEOUT_ENV,
    COLLECTIVES_EVENT,
    COLLECTIVES_FILE_ENV,
    CONFIG_ENV,
    EVENTS_FD_ENV,
    MFU_ENV,
    PEAK_TFLOPS_ENV,
    PROCESS_GROUP_EVENT,
    RESUME_ENV,
    RUNTIME_READY,
    SAVE_ACK_EVENT,
    SAVE_ON_ENV,
    SAVE_READY_EVENT,
    STACKS_DUMPED,
    STACKS_DUMPER_ENV,
    STACKS_FALLBACK_SIGNAL,
    STACKS_READY,
    STACKS_SIGNAL_ENV,
    STEP_BUSY_EVENT,
    TOTAL_STEPS_ENV,
)

__all__ = [
    "BatchError",
    "BatchOverride",
    "Answer",
    "BASE_HEARTBEAT_TIMEOUT",
    "CHECKPOINT_DIR_ENV",
    "CHECKPOINT_EVENT",
    "COLLECTIVES_EVENT",
    "COLLECTIVES_FILE_ENV",
    "COLLECTIVE_MISMATCH",
    "COLLECTIVE_TIMEOUT_ENV",
    "CONFIG_ENV",
    "EVENTS_FD_ENV",
    "HandshakeError",
    "HostlistError",
    "MAX_LINE",
    "META_KEYS",
    "MFU_ENV",
    "PARTS",
    "PEAK_TFLOPS_ENV",
    "PROCESS_GROUP_EVENT",
    "RESUME_ENV",
    "RUNTIME_READY",
    "SAVE_ACK_EVENT",
    "SAVE_ON_ENV",
    "SAVE_READY_EVENT",
    "STACKS_DUMPED",
    "STACKS_DUMPER_ENV",
    "STACKS_FALLBACK_SIGNAL",
    "STACKS_READY",
    "STACKS_SIGNAL_ENV",
    "STEP_BUSY_EVENT",
    "SilenceClock",
    "TOTAL_STEPS_ENV",
    "TokenMismatch",
    "breakdown_text",
    "checked_metrics",
    "compress",
    "expand",
    "first_host",
    "format_line",
    "events",
    "frames",
    "handshake",
    "kept_batch",
    "human_bytes",
    "line_bytes",
    "line_text",
    "liveness",
    "mfu_text",
    "number",
    "override_from_env",
    "protocol",
    "records",
    "rate",
    "split",
    "wait_for_idle_gloo_threads",
]
