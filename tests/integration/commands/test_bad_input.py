"""Each bad input makes the real ``zlaunch`` command exit 2 with
one short message naming the place, never a traceback, a MemoryError or a silent acceptance."""

from __future__ import annotations

import pytest

from tests.integration.commands.hostile_input import assert_usage_error, write_script, zlaunch

HUGE = "x" * (10 * 1024 * 1024)

# (hostfile text or None, .zlaunch_env text or None, extra args, words the message holds)
CASES = {
    "slots=100000000": ("node1 slots=100000000\n", None, [], ["hosts:1", "slots must be 1-4096"]),
    "slots=²": ("node1 slots=²\n", None, [], ["hosts:1", "slots must be a positive integer"]),
    "port=³": ("node1 slots=1 port=³\n", None, [], ["hosts:1", "port"]),
    "[a:22] host": ("[a:22] slots=1\n", None, [], ["hosts:1", "IPv6"]),
    "[::1%] host": ("[1::2::3] slots=1\n", None, [], ["hosts:1", "IPv6"]),
    "--include node1:²": ("node1 slots=2\n", None, ["--include", "node1:²"], ["bad slot"]),
    "--ranks ²": (None, None, ["--ranks", "²"], ["--ranks: bad rank"]),
    "--ranks 5000 digits": (None, None, ["--ranks", "9" * 5000], ["--ranks: bad rank"]),
    "--grace-period nan": (None, None, ["--grace-period", "nan"], ["--grace-period"]),
    "--grace-period inf": (None, None, ["--grace-period", "inf"], ["--grace-period"]),
    "--python -c": (None, None, ["--python", "-c"], ["--python", "interpreter"]),
    "--num-gpus 100000000": (None, None, ["--num-gpus", "100000000"], ["--num-gpus"]),
    "10 MB hostfile line": (f"node1 slots=1 {HUGE}\n", None, [], ["hosts:1", "characters)"]),
    "10 MB hostfile host": (f"{HUGE}:1 slots=1\n", None, [], ["hosts:1", "characters)"]),
    "10 MB env line": (None, f"A=1\n{HUGE}\n", [], [".zlaunch_env:2", "characters)"]),
    "10 MB env name": (None, f"{HUGE}-=1\n", [], [".zlaunch_env:1", "characters)"]),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_one_short_usage_error(tmp_path, case):
    hostfile, env_file, args, words = case
    if hostfile is not None:
        (tmp_path / "hosts").write_text(hostfile)
        args = ["--hostfile", "hosts", *args]
    if env_file is not None:
        (tmp_path / ".zlaunch_env").write_text(env_file)
    script = write_script(tmp_path, "w.py", "pass\n")
    result = zlaunch(tmp_path, "--dry-run", *args, script, timeout=60)
    err = assert_usage_error(result, *words)
    assert len(err) < 600, err[:1000]  # never the whole input back
    assert err.count("error:") == 1
