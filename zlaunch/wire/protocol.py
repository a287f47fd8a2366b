"""The names shared by the controller, the agents and the workers (standard library only).

Frame kinds, the streams of an output frame, the signals zlaunch forwards, the kinds of the
events workers send, and every environment variable that crosses a process boundary, each
named once. The frames themselves (their fields, encoding and decoding) are
``zlaunch/wire/frames.py``; the runtime imports this module and nothing else of zlaunch, so every
rank pays only for these names.
"""

from __future__ import annotations

import signal

__all__ = [
    "HELLO",
    "OUT",
    "STARTED",
    "EXITED",
    "EVENT",
    "ERROR",
    "BYE",
    "SPEC",
    "HEARTBEAT",
    "STOP",
    "SIGNAL",
    "STACKS_SIGNAL",
    "STACKS_SIGNAL_ENV",
    "STACKS_READY",
    "STACKS_DUMPED",
    "STACKS_FALLBACK_SIGNAL",
    "STACKS_DUMPER_ENV",
    "COLLECTIVES_EVENT",
    "COLLECTIVE_MISMATCH",
    "COLLECTIVES_FILE_ENV",
    "RUNTIME_READY",
    "METRICS_EVENT",
    "STEP_BUSY_EVENT",
    "INVALID_EVENT",
    "PROCESS_GROUP_EVENT",
    "SAVE_ACK_EVENT",
    "SAVE_READY_EVENT",
    "CHECKPOINT_EVENT",
    "PEAK_TFLOPS_ENV",
    "MFU_ENV",
    "RUN_ID_ENV",
    "ATTEMPT_ENV",
    "CONFIG_ENV",
    "EVENTS_FD_ENV",
    "CHECKPOINT_DIR_ENV",
    "RESUME_ENV",
    "SAVE_ON_ENV",
    "TOTAL_STEPS_ENV",
    "JOB_TAG_ENV",
    "JOB_ENV_NAMES",
    "SALLOC_ENV",
    "SALLOC_ARGS_ENV",
    "WORKER_ARGS_ENV",
    "COLLECTIVE_TIMEOUT_ENV",
    "BATCH_ENV",
    "CAUSE_NO_HEARTBEAT",
    "CAUSE_PREEMPTED",
    "STDOUT",
    "STDERR",
]

HELLO, OUT, STARTED, EXITED, EVENT, ERROR, BYE = (
    "hello",
    "out",
    "started",
    "exited",
    "event",
    "error",
    "bye",
)
SPEC, HEARTBEAT, STOP = "spec", "hb", "stop"
SIGNAL = "signal"  # controller -> agent: deliver {"sig": N} to every worker (or {"ranks": [...]})
STDOUT, STDERR = "o", "e"

# `zlaunch stacks`: sent to the controller, which forwards it to every rank whose runtime
# registered a stack dump on it (runtime/observe/stacks.py). A real-time signal: no script or cluster
# tool uses it for something else, as they do SIGUSR1/2.
STACKS_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
STACKS_SIGNAL_ENV = "ZLAUNCH_STACKS_SIGNAL"
STACKS_READY = "stacks_ready"  # event kind: this rank dumps its stacks on STACKS_SIGNAL
# A worker's boot dumps from a thread of its own under the GIL (zlaunch/worker/stack_dumper.py): its
# STACKS_READY says {"dumper": "thread"}, it answers with a STACKS_DUMPED event, and a rank
# that has not within a few seconds (its GIL is held in C code) gets STACKS_FALLBACK_SIGNAL,
# on which faulthandler dumps without the GIL. STACKS_DUMPER_ENV=faulthandler: faulthandler
# on STACKS_SIGNAL itself, as before the thread.
STACKS_DUMPED = "stacks_dumped"
STACKS_FALLBACK_SIGNAL = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1
STACKS_DUMPER_ENV = "ZLAUNCH_STACKS_DUMPER"
# A rank's recent collectives (zlaunch/worker/collective_records.py): the file its watch thread keeps
# for the agent, the event the agent sends with a stacks request, and the event of a rank
# that found its peers in another collective at the same position.
COLLECTIVES_FILE_ENV = "ZLAUNCH_COLLECTIVES_FILE"
COLLECTIVES_EVENT = "collectives"
COLLECTIVE_MISMATCH = "collective_mismatch"
RUNTIME_READY = "runtime_ready"  # event kind: runtime.initialize finished (hang watch arms)
METRICS_EVENT = "metrics"  # event kind: one row of step metrics (runtime/observe/metrics.py)
# event kind, from every rank every few optimizer steps: {"step": the first, "busy": its own
# seconds of that step and the next ones (wall time less the time it waited for its peers in
# collectives), "waited": those waits (absent from older runtimes)}, scored by
# zlaunch/launcher/stragglers.py
STEP_BUSY_EVENT = "step_busy"
INVALID_EVENT = "invalid"  # event kind the agent puts in place of a line that was not an event
# event kind, from zlaunch.worker.boot as the script ends: {"size": the largest default process
# group the rank joined (0: none), "accelerate": whether accelerate was loaded}
PROCESS_GROUP_EVENT = "process_group"
SAVE_ACK_EVENT = "save_ack"  # event kind: the runtime heard the save signal and will save
SAVE_READY_EVENT = "save_ready"  # event kind: the rank listens for the save signal from now on
# event kind: {"state": "saving" | "saved" | "failed", "step": N, "requested": true when the
# save signal asked for it}: a checkpoint the rank writes
CHECKPOINT_EVENT = "checkpoint"
COLLECTIVE_TIMEOUT_ENV = "ZLAUNCH_COLLECTIVE_TIMEOUT"  # seconds, for init_process_group
CAUSE_NO_HEARTBEAT = "no_heartbeat"  # ERROR frame "cause": the agent stopped, cut off
CAUSE_PREEMPTED = "preempted"  # ERROR frame "cause": the host got a preemption notice
BATCH_ENV = "ZLAUNCH_BATCH"  # "TRAIN_BATCH,MICRO,GAS" after a restart on another world size

# `zlaunch run --peak-tflops X`: the per-device peak (dense TFLOP/s) the runtime divides the
# measured FLOP rate by for MFU, instead of its table of known devices (runtime/observe/profiling).
PEAK_TFLOPS_ENV = "ZLAUNCH_PEAK_TFLOPS"
# `zlaunch run --mfu` ("1"): count one step's FLOPs for MFU without the flops_profiler's table
# (the count is a dispatch mode on every op of that step: asked for, not always on).
MFU_ENV = "ZLAUNCH_MFU"

# The environment zlaunch gives every worker and the runtime reads (plan.py sets the job's,
# the agent adds the events pipe): named here once, for both sides.
RUN_ID_ENV = "ZLAUNCH_RUN_ID"
ATTEMPT_ENV = "ZLAUNCH_ATTEMPT"
CONFIG_ENV = "ZLAUNCH_CONFIG"  # absolute path of the validated training config
EVENTS_FD_ENV = "ZLAUNCH_EVENTS_FD"  # write end of the pipe for JSON-line events
# Set by the agent for every worker, inherited by all they start: the agent finds (and ends)
# what a worker left behind, even outside its process group (zlaunch/agent/procs.py).
JOB_TAG_ENV = "ZLAUNCH_JOB_TAG"
CHECKPOINT_DIR_ENV = "ZLAUNCH_CHECKPOINT_DIR"
RESUME_ENV = "ZLAUNCH_RESUME"  # "1": load the latest checkpoint at initialize
SAVE_ON_ENV = "ZLAUNCH_SAVE_ON"  # signal name: save at the next step and exit 0
TOTAL_STEPS_ENV = "ZLAUNCH_TOTAL_STEPS"  # the script's planned steps, for the live view's ETA

# `--slurm-mode one-step`: the per-job secret each agent proves it knows when it connects back
# to the controller (zlaunch/wire/handshake.py). Passed through srun's environment, never on
# a command line (argv is visible to every user); the agent removes it before any worker starts.
CONNECT_TOKEN_ENV = "ZLAUNCH_CONNECT_TOKEN"

# `zlaunch --nodes N` on a login node re-runs itself under salloc with this set to "1": inside
# that allocation --nodes/--partition/--time/--account were already used (commands/run.py).
SALLOC_ENV = "ZLAUNCH_SALLOC"
# ... and with its whole arguments (a JSON list) here: salloc's command line, which every user
# and Slurm's job record see, carries them redacted (zlaunch/commands/allocation_args.py).
SALLOC_ARGS_ENV = "ZLAUNCH_SALLOC_ARGS"
# A Python worker's script arguments (a JSON list) when some look secret: its command line shows
# them redacted, the boot takes them from here (zlaunch/worker/argv.py).
WORKER_ARGS_ENV = "ZLAUNCH_WORKER_ARGS"

# Every variable zlaunch sets for every worker (a user's value for one is overridden): the
# launcher conventions scripts read (torchrun's and DeepSpeed's) and zlaunch's own.
JOB_ENV_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "NUM_NODES",
        "GROUP_RANK",
        "CROSS_RANK",
        "CROSS_SIZE",
        "LOCAL_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        RUN_ID_ENV,
        ATTEMPT_ENV,
        CONFIG_ENV,
        EVENTS_FD_ENV,
        JOB_TAG_ENV,
        CHECKPOINT_DIR_ENV,
        RESUME_ENV,
        SAVE_ON_ENV,
        STACKS_SIGNAL_ENV,
        COLLECTIVES_FILE_ENV,
        COLLECTIVE_TIMEOUT_ENV,
        BATCH_ENV,
    }
)
