"""`zlaunch check --perf`: outliers against the fleet's median, named with figure and factor; the
table, --json and --write-hostfile from the hosts' figures (the probe itself replaced by figures
here; tests/integration/commands/test_check_perf.py runs the real one)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from zlaunch.commands import check
from zlaunch.commands.check import HostReport
from zlaunch.commands.check_perf import (
    hostfile_line,
    kept_hosts,
    link_outliers,
    outliers,
    ring_phases,
)
from zlaunch.errors import UsageError
from zlaunch.job import Host

FIGURES = {"gflops": 40.0, "write_mbs": 900.0, "read_mbs": 2000.0}


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        pytest.param({}, [], id="an even fleet: nobody"),
        pytest.param({"n3": {"gflops": 20.0}}, [("n3", "compute", 2.0)], id="half the compute"),
        pytest.param({"n3": {"gflops": 33.0}}, [], id="1.21x below: within the factor"),
        pytest.param({"n1": {"gflops": 400.0}}, [], id="a faster host is no outlier"),
        pytest.param(
            {"n2": {"write_mbs": 300.0}, "n4": {"gflops": 10.0}},
            [("n4", "compute", 4.0), ("n2", "checkpoint-dir write", 3.0)],
            id="two hosts, slowest first",
        ),
    ],
)
def test_outliers_against_the_median(changed, expected):
    perf = {h: {**FIGURES, **changed.get(h, {})} for h in ("n1", "n2", "n3", "n4")}
    found = outliers(perf)
    assert [(o.host, o.figure, round(o.factor, 2)) for o in found] == expected


def test_one_host_has_nothing_to_compare_with():
    assert outliers({"n1": {"gflops": 1.0}}) == []


def test_an_outlier_says_its_figure_the_median_and_the_factor():
    (found,) = outliers({"a": FIGURES, "b": FIGURES, "c": {**FIGURES, "gflops": 16.0}})
    assert found.text == "compute 16 GFLOP/s per slot, 2.50x below the median 40"


def test_hostfile_lines_keep_user_and_port():
    assert hostfile_line(Host("node1", (0, 1, 2))) == "node1 slots=3"
    assert hostfile_line(Host("::1", (0,), "bob", 2222)) == "[::1] slots=1 user=bob port=2222"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"n{i} slots=2\n" for i in range(1, 5)))

    def fake(hosts, ssh, *, python, cwd, master_port, perf=None):
        assert perf is not None and perf["dir"] == str(tmp_path)
        reports = []
        for host in hosts:
            figures = {**FIGURES, "gflops": 12.0 if host.name == "n3" else 40.0}
            facts = {"python_version": "3.11", "cwd_exists": True, "perf": figures}
            reports.append(HostReport(host.display, host.slots, True, facts))
        return reports

    def even_network(hosts, ssh, python):
        names = [h.display for h in hosts]
        links = [{"src": a, "dst": b, "mbs": 100.0, "latency_ms": 0.1}
                 for a, b in zip(names, names[1:] + names[:1], strict=True)]  # fmt: skip
        return {"backend": "gloo", "links": links}, {}

    monkeypatch.setattr(check, "check_hosts", fake)
    monkeypatch.setattr(check, "measure_network", even_network)
    return hostfile


def test_the_slow_host_is_named_left_out_of_the_written_hostfile_and_fails_the_check(
    fleet, tmp_path
):
    written = tmp_path / "healthy"
    args = ["-H", str(fleet), "--perf", "--checkpoint-dir", str(tmp_path), "--no-color"]
    result = CliRunner().invoke(check.command, [*args, "--write-hostfile", str(written)])
    assert result.exit_code == 1, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("n3 "))
    assert "compute 12 GFLOP/s per slot, 3.33x below the median 40" in row
    assert "3 of 4 hosts ready" in result.output
    assert written.read_text() == "n1 slots=2\nn2 slots=2\nn4 slots=2\n"

    as_json = CliRunner().invoke(check.command, [*args, "--json"])
    assert as_json.exit_code == 1
    report = json.loads(as_json.output)
    assert [(o["host"], o["figure"]) for o in report["outliers"]] == [("n3", "compute")]
    assert [h["ok"] for h in report["hosts"]] == [True, True, False, True]


def test_a_checkpoint_dir_without_perf_is_refused(fleet, tmp_path):
    result = CliRunner().invoke(check.command, ["-H", str(fleet), "--checkpoint-dir", "x"])
    assert isinstance(result.exception, UsageError), result.output  # the CLI prints it
    assert "add --perf" in str(result.exception)


LISTED = (Host("n1", (0, 1, 2, 3)), Host("n2", (0, 1, 2, 3), "bob", 2222), Host("n3", (0, 1)))


@pytest.mark.parametrize(
    "selected,passed,lines,include,exclude",
    [
        pytest.param(LISTED, {"n1", "n2", "n3"},
                     ("n1 slots=4", "n2 slots=4 user=bob port=2222", "n3 slots=2"), None, None,
                     id="whole-hosts"),
        pytest.param((Host("n1", (0, 1)), Host("n3", (0, 1))), {"n1"}, ("n1 slots=2",), None,
                     "n3", id="first-slots-are-a-count"),
        pytest.param((Host("n1", (2, 3)), Host("n2", (0, 2, 3), "bob", 2222), Host("n3", (0, 1))),
                     {"n1", "n2", "n3"},
                     ("n1 slots=4", "n2 slots=4 user=bob port=2222", "n3 slots=2"),
                     "n1:2-3@n2:0,2-3@n3", None, id="other-slots-kept-as-include"),
        pytest.param((Host("n1", (1,)), Host("n2", (0, 1), "bob", 2222)), {"n1"}, ("n1 slots=4",),
                     "n1:1", "n2", id="one-kept-on-slot-1"),
    ],
)  # fmt: skip
def test_the_written_hostfile_keeps_the_slots_checked(selected, passed, lines, include, exclude):
    kept = kept_hosts(LISTED, selected, passed)
    assert (kept.lines, kept.include, kept.exclude) == (lines, include, exclude)


def test_write_hostfile_with_slots_selected_says_the_include(fleet, tmp_path):
    written = tmp_path / "healthy"
    args = ["-H", str(fleet), "--include", "n1:1@n3:1@n4", "--perf", "--no-color"]
    args += ["--checkpoint-dir", str(tmp_path), "--write-hostfile", str(written)]
    result = CliRunner().invoke(check.command, args)
    assert result.exit_code == 1, result.output
    assert written.read_text() == "n1 slots=2\nn4 slots=2\n"
    assert "add --include 'n1:1@n4' to run on the slots checked here" in result.output
    assert "left out: --exclude 'n3' runs on the others" in result.output
    as_json = CliRunner().invoke(check.command, [*args, "--json"])
    report = json.loads(as_json.output)
    assert report["exclude"] == "n3" and report["write_hostfile"]["include"] == "n1:1@n4"


# ---- the network ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 1024])
def test_the_ring_is_measured_in_at_most_three_phases_of_disjoint_pairs(n):
    phases = ring_phases(n)
    links = [link for phase in phases for link in phase]
    expected = [] if n < 2 else [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]
    assert sorted(links) == sorted(expected)
    for phase in phases:
        ends = [host for link in phase for host in link]
        assert len(ends) == len(set(ends))  # no host carries two links at once
    assert len(phases) <= (2 if n % 2 == 0 else 3)


def ring(mbs: dict[tuple[str, str], float] | None = None, latency=None) -> list[dict]:
    """A ring of n1..n4 both ways, 100 MB/s and 0.1 ms, but what is given."""
    hosts = ["n1", "n2", "n3", "n4"]
    links = []
    for i, src in enumerate(hosts):
        for dst in (hosts[(i + 1) % 4], hosts[(i - 1) % 4]):
            links.append({"src": src, "dst": dst,
                          "mbs": (mbs or {}).get((src, dst), 100.0),
                          "latency_ms": (latency or {}).get((src, dst), 0.1)})  # fmt: skip
    return links


def test_an_even_ring_names_nothing():
    jitter = {("n1", "n2"): 90.0, ("n3", "n4"): 110.0}
    assert link_outliers(ring(jitter, {("n2", "n3"): 3.0})) == []  # 3 ms is not a slow link


def test_a_host_that_sends_slowly_both_ways_is_named_as_its_network():
    (found,) = link_outliers(ring({("n2", "n1"): 2.0, ("n2", "n3"): 2.5}))
    assert (found.host, found.dst, found.inbound, found.figure) == ("n2", None, False, "bandwidth")
    assert found.text == (
        "network of n2 (outbound): bandwidth 2-2.5 MB/s, 50.00x below the median 100 MB/s"
    )


def test_a_link_into_a_host_named_as_its_network_is_not_named_again():
    """Measured on the namespace cluster, node2's outbound held to 2 Mbit/s by tbf: the link
    node1 -> node2 read 1.38x below the median too (its replies queue behind node2's own
    traffic); the host is named once, as its network, and nothing else."""
    slow = {("n2", "n1"): 0.04, ("n2", "n3"): 0.04, ("n1", "n2"): 100 / 1.38}
    (found,) = link_outliers(ring(slow))
    assert (found.host, found.dst, found.inbound) == ("n2", None, False)


def test_one_slow_link_is_named_as_the_link_and_slow_latency_too():
    found = link_outliers(ring({("n3", "n4"): 10.0}, {("n1", "n4"): 8.0}))
    assert [o.text for o in found] == [
        "link n1 -> n4: latency 8 ms, 80.00x above the median 0.1 ms",
        "link n3 -> n4: bandwidth 10 MB/s, 10.00x below the median 100 MB/s",
    ]


def test_the_network_probe_takes_the_slow_host_out_of_the_written_hostfile(
    fleet, tmp_path, monkeypatch
):
    def fake_network(hosts, ssh, python):
        names = [h.display for h in hosts]
        links = [{"src": s, "dst": d, "mbs": 2.0 if s == "n4" else 100.0, "latency_ms": 0.1}
                 for i, s in enumerate(names) for d in (names[(i + 1) % 4], names[i - 1])]  # fmt: skip
        return {"backend": "gloo", "links": links}, {}

    monkeypatch.setattr(check, "measure_network", fake_network)
    written = tmp_path / "healthy"
    args = ["-H", str(fleet), "--perf", "--checkpoint-dir", str(tmp_path), "--no-color"]
    result = CliRunner().invoke(check.command, [*args, "--write-hostfile", str(written)])
    assert result.exit_code == 1, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("n4 "))
    assert "network of n4 (outbound): bandwidth 2 MB/s, 50.00x below the median 100" in row
    assert "network (gloo, a ring of 8 directions): median 100 MB/s, 0.1 ms" in result.output
    assert written.read_text() == "n1 slots=2\nn2 slots=2\n"  # n3 computes slowly, n4 sends
    report = json.loads(CliRunner().invoke(check.command, [*args, "--json"]).output)
    (outlier,) = report["network"]["outliers"]
    assert (outlier["host"], outlier["dst"], outlier["figure"]) == ("n4", None, "bandwidth")
