"""The one srun's tail says srun ended as soon as srun has exited, even while its watcher still
waits for the last output (a helper srun forked may hold the pipe open for a while): an agent
lost with srun is reported as lost with srun, not with an unexplained tail."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from zlaunch.transport.slurm_one_step import SlurmStep


def test_tail_names_the_end_of_srun_while_a_forked_helper_holds_its_output():
    # the shell exits at once; the sleep it leaves behind keeps the output pipe open, so the
    # reader sees no EOF and the watcher waits its full second for srun's last lines
    proc = subprocess.Popen(
        ["sh", "-c", "echo 'srun: warning: a last line'; sleep 5 & exit 3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        step = SlurmStep(proc, job="12", name="zlaunch-agents-test")
        deadline = time.monotonic() + 10
        while not step._exited():
            assert time.monotonic() < deadline, "the shell did not exit"
            time.sleep(0.01)
        tail = step.stderr_tail(0, lines=5)
        assert tail[-1] == "srun (the one step of every node's agent) ended: exit status 3", tail
        assert "srun: warning: a last line" in tail
        assert step.ended.is_set()
    finally:
        try:  # the sleep left behind, by its process group (the shell's own)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
