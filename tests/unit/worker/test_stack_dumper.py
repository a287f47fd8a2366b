"""The worker's stacks thread's dump and the agent's fallback, as pure pieces: the dump in
faulthandler's words, which dump of several is the answer, and when faulthandler stands in."""

from __future__ import annotations

import sys
import threading

import pytest

from zlaunch.agent.stack_requests import StackRequests, fallback_marker
from zlaunch.console.stacks import StackDumpFilter
from zlaunch.text.stack_dumps import dump_marker, parse_dump, parse_dump_by
from zlaunch.worker.stack_dumper import format_stacks


def test_the_dump_reads_as_faulthandlers_main_thread_first_the_dumper_left_out():
    started, release = threading.Event(), threading.Event()

    def helper_waits():
        started.set()
        release.wait(10)

    helper = threading.Thread(target=helper_waits)
    helper.start()
    started.wait(10)
    try:
        # Only the two threads this test made; a pytest-xdist worker has threads of its own.
        mine = (helper.ident, threading.get_ident())
        frames = {ident: f for ident, f in sys._current_frames().items() if ident in mine}
        text = "\n".join(format_stacks(frames, main=helper.ident, skip=threading.get_ident()))
    finally:
        release.set()
        helper.join()
    dump = parse_dump(text)
    # the helper stands as "main" here (it was named main), this thread is left out
    assert [kind for kind, _ in dump] == ["main"]
    assert any("in helper_waits" in frame for frame in dump[0][1]), dump
    assert "test_the_dump_reads_as" not in text


def test_names_that_hold_control_characters_cannot_forge_lines():
    code = compile(
        "import sys\nframe = sys._getframe()",
        "evil\nThread 0x1 (most recent call first):\x1b[2K",
        "exec",
    )
    space: dict = {}
    exec(code, space)
    text = "\n".join(format_stacks({1: space["frame"]}, main=1))
    assert "\x1b" not in text and '"evil\\x0aThread 0x1 (most recent call first):\\x1b[2K"' in text
    dump = parse_dump(text)
    assert len(dump) == 1 and "evil" in dump[0][1][0]  # one thread: no header was forged


MAIN_AT = (
    'Current thread 0x00007f0000000001 (most recent call first):\n  File "/t.py", line {} in f\n'
)


@pytest.mark.parametrize(
    ("text", "line", "by"),
    [
        (dump_marker(7, "its stacks thread") + "\n" + MAIN_AT.format(3), 3, "its stacks thread"),
        (MAIN_AT.format(4), 4, "faulthandler"),  # no marker: the runtime's faulthandler
        # faulthandler stood in; the thread answered once the GIL was free: the first counts
        (fallback_marker(7) + "\n" + MAIN_AT.format(5) + dump_marker(7, "its stacks thread")
         + "\n" + MAIN_AT.format(9), 5, "faulthandler"),
        # a stopped rank resumed: the agent's marker, then the thread's dump first
        (fallback_marker(7) + "\n" + dump_marker(7, "its stacks thread") + "\n"
         + MAIN_AT.format(6) + MAIN_AT.format(8), 6, "its stacks thread"),
    ],
)  # fmt: skip
def test_the_first_dump_is_the_answer_and_says_who_made_it(text, line, by):
    dump, found_by = parse_dump_by("ordinary line\n" + text)
    assert found_by == by
    assert dump[0][1][0] == f'File "/t.py", line {line} in f'


def test_the_console_holds_back_the_marker_lines_with_the_dump():
    shown = StackDumpFilter()
    shown.expect([3], now=0.0)
    lines = [fallback_marker(9), *MAIN_AT.format(1).splitlines(), "", "still training"]
    assert shown.keep(3, lines, now=1.0) == ["still training"]


def test_faulthandler_stands_in_once_for_an_unanswered_request():
    requests = StackRequests(after=2.0)
    assert requests.next_due(0.0) is None
    requests.asked(0, 100, now=10.0)
    requests.asked(1, 101, now=10.5)
    requests.asked(0, 100, now=11.0)  # asked again while waiting: the first clock counts
    assert requests.next_due(10.5) == pytest.approx(1.5)
    requests.answered(1, 999)  # not the process asked
    requests.answered(0, 100)
    assert requests.due(12.0) == []
    assert requests.due(12.5) == [(1, 101)]
    assert requests.due(20.0) == [] and requests.next_due(20.0) is None
    requests.asked(2, 102, now=30.0)
    requests.forget(2)  # the rank exited
    assert requests.due(40.0) == []


def test_the_files_a_dump_leaves_out_are_zlaunchs_own_modules():
    # stack_dumps recognises the boot's frames and zlaunch's threads by their path under the
    # package (zlaunch/worker/boot.py): a module that moves must take its path along
    from pathlib import Path

    import zlaunch.worker.boot
    import zlaunch.worker.collective_records
    import zlaunch.worker.group
    import zlaunch.worker.stack_dumper
    from zlaunch.text import stack_dumps

    own = [zlaunch.worker.collective_records, zlaunch.worker.group, zlaunch.worker.stack_dumper]

    def under_the_package(module) -> str:
        return "/".join(Path(module.__file__).parts[-3:])

    assert {under_the_package(m) for m in own} == set(stack_dumps._OWN_THREADS)
    assert under_the_package(zlaunch.worker.boot) in stack_dumps._BOOT_FILES
