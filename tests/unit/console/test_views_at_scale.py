"""What the live panel, the plain view and the failure report show for 1,024 ranks on 128
hosts: summaries by host and rank range, never a row or a name per rank."""

from __future__ import annotations

import io
import time

from zlaunch.console.terminal import Console, format_failure
from zlaunch.launcher.hang import hang_failure
from zlaunch.launcher.hang_suspect import find_suspect
from zlaunch.rundir.records import FailureReport
from zlaunch.text.hosts import host_ranges
from zlaunch.wire import protocol

RANKS, PER_HOST = 1024, 8


def host(rank: int) -> str:
    return f"node{rank // PER_HOST:03d}"


def console() -> tuple[Console, io.BytesIO, io.StringIO]:
    out, err = io.BytesIO(), io.StringIO()
    return Console(color=False, out=out, err=err), out, err


def drawn(renderable) -> str:
    from rich.console import Console as RichConsole

    out = io.StringIO()
    RichConsole(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_the_live_panel_of_1024_ranks_is_a_few_lines_of_counts_and_ranges():
    from zlaunch.console.live_view import LiveView

    view = LiveView(console()[0], io.StringIO())
    try:
        view.start("run-x", {f"node{h:03d}": PER_HOST for h in range(RANKS // PER_HOST)})
        for rank in range(RANKS):
            view.rank_started(rank, host(rank))
            view.progress(rank, host(rank), protocol.STDERR, f"{rank % 100}%|##  | {rank % 100}/99")
        view.rank_exited(17, host(17), 1)
        for rank in range(24, 40):  # node003 and node004 lost
            view.rank_lost(rank, host(rank))
        for rank in range(0, RANKS, 32):  # one silent rank on every 4th host, the rest talk
            view.last_output[rank] = time.monotonic() - 100
        for rank in set(range(RANKS)) - set(range(0, RANKS, 32)):
            view.output_seen(rank)
        view.started_at -= 200
        text = drawn(view._panel())
    finally:
        view.close()
    assert len(text.splitlines()) <= 20, text
    assert "1007/1024 on 128 hosts, 125 complete" in text, text
    assert "node[003-004] 0/8" in text and "node002 7/8" in text, text
    assert "failed ranks: 17 " in text and "lost ranks: 24-39" in text, text
    # 8 bars drawn, the rest counted (rank 17 exited: its bar is gone)
    assert "... and 1015 more ranks (8-16,18-1023)" in text, text
    # 31 silent ranks (rank 32 is lost, not silent), a ragged set: cut, with its count
    quiet = next(line for line in text.splitlines() if "no output from ranks" in line)
    assert "ranks 0,64,96," in quiet and ",...,992 (31 ranks) for 1:40+" in quiet, text


def test_many_hosts_short_of_ranks_are_grouped_and_the_rest_counted():
    from zlaunch.console.live_view import LiveView

    per_host, hosts = 16, 64
    view = LiveView(console()[0], io.StringIO())
    try:
        view.start("run-x", {f"node{h:03d}": per_host for h in range(hosts)})
        for rank in range(per_host * hosts):
            h = rank // per_host
            if rank % per_host < h % 17:  # host h keeps h % 17 ranks: 16 counts short of 16
                view.rank_started(rank, f"node{h:03d}")
        text = drawn(view._panel())
    finally:
        view.close()
    # the emptiest first: hosts 0, 17, 34 and 51 have no rank alive
    assert "complete  node[000,017,034,051] 0/16  node[001,018,035,052] 1/16" in text, text
    assert "node[007,024,041,058] 7/16  and 29 more hosts short of ranks" in text, text
    assert "on 64 hosts, 3 complete" in text, text  # hosts 16, 33 and 50; 61 - 32 not named


def test_the_plain_view_prints_the_bars_of_eight_ranks_and_says_so_once():
    from zlaunch.console.live_view import PlainView

    con, out, err = console()
    view = PlainView(con)
    for rank in range(RANKS):
        view.progress(rank, host(rank), protocol.STDERR, "50%|#####     | 5/10")
    lines = out.getvalue().decode().splitlines()
    assert lines == [f"[{host(r)}:{r}]! 50%|#####     | 5/10" for r in range(8)]
    assert err.getvalue().count("more than 8 ranks draw a progress bar") == 1
    assert "ranks 0-7" in err.getvalue()


def test_the_failure_report_of_a_1024_rank_hang_names_ranges_not_a_thousand_ranks():
    hosts_of = {r: host(r) for r in range(RANKS)}
    step = (("main", ('File "train.py", line 10 in step', 'File "comm.py", line 5 in all_reduce')),)
    save = (("main", ('File "train.py", line 12 in save', 'File "ckpt.py", line 9 in write')),)
    # every 50th rank elsewhere; 30 more stack groups of one rank each; ranks 1020-1023 silent
    dumps = {r: save if r % 50 == 7 else step for r in range(1020)}
    for r in range(900, 930):
        dumps[r] = (("main", (f'File "train.py", line {r} in odd',)),)
    failure = hang_failure(
        900, 901.0, hosts_of, dumps, [], {}, {r: 10_000 + r for r in range(RANKS)}
    )
    report = FailureReport(
        run_id="run-x",
        exit_code=failure.exit_code,
        summary=f"hung, {RANKS} ranks stopped",
        root_cause=failure,
        failures=(failure,),
        stopped_ranks=tuple(range(RANKS)),
        log_dir="/runs/run-x",
    )
    text = format_failure(report)
    lines = text.splitlines()
    assert len(lines) < 60, text
    assert max(len(line) for line in lines) < 260, text
    assert "host node127  rank 1020-1023" in text, text
    assert "no stacks from rank(s) 1020-1023 " in text, text
    assert "Stopped by zlaunch: ranks 0-1023" in text, text
    biggest = next(line for line in lines if line.startswith("      ranks 0-6,8-56,"))
    # 1020 answered, 21 of them at save, 30 alone (one of which, 907, also % 50 == 7)
    assert biggest.endswith(f"({1020 - 21 - 30 + 1} ranks) (node[000-112,116-127]):"), biggest
    assert "... 24 more stack groups, ranks " in text, text  # 8 of 32 shown
    assert "`zlaunch stacks` shows them all" in text


def test_a_hang_sentence_names_a_thousand_waiting_ranks_as_ranges():
    hosts_of = {r: host(r) for r in range(RANKS)}
    waiting = {"group": "0", "seq": 57, "op": "all_reduce", "state": "issued", "ranks": []}
    done = {"group": "0", "seq": 56, "op": "all_reduce", "state": "completed", "ranks": []}
    records = {r: [done, waiting] for r in range(RANKS)}
    for r in (3, 4, 5, 6, 7, 900):  # not in the collective: the ones the others wait for
        records[r] = [done]
    suspect = find_suspect(hosts_of, records)
    assert suspect.ranks == (3, 4, 5, 6, 7, 900)
    assert suspect.message == (
        "ranks 3-7,900 on node000 and node112 not in a collective (last: ranks 3-7,900: "
        "all_reduce #56 (completed)); ranks 0-2,8-899,901-1023 on node[000-127] wait for "
        "them in all_reduce #57"
    )


def test_host_lists_are_hostlists_in_natural_order_and_cut_with_their_count():
    assert host_ranges(["n2", "n10", "n1", "x", "n2"]) == "n[1-2],n10,x"
    assert host_ranges([f"node{i:03d}" for i in range(128)]) == "node[000-127]"
    cut = host_ranges([f"node{i:03d}" for i in range(0, 256, 2)], limit=60)
    assert cut.startswith("node[000,002,") and cut.endswith("],... (128 hosts)") and len(cut) <= 60
