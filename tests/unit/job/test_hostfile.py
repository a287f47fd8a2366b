"""Hostfile grammar, its errors (file:line, exit 2) and the default localhost job."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlaunch.errors import HostfileError, UsageError
from zlaunch.job.hostfile import (
    Host,
    default_hosts,
    load_hostfile,
    parse_hostfile,
    visible_gpu_slots,
)

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "hostfiles")


def write(tmp_path, text: str, name: str = "hosts") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load_error(tmp_path, text: str) -> HostfileError:
    path = write(tmp_path, text)
    with pytest.raises(HostfileError) as info:
        load_hostfile(path)
    assert info.value.exit_code == 2
    return info.value


# ---- grammar ------------------------------------------------------------------------------


def test_every_feature_parses_in_file_order(tmp_path):
    path = write(
        tmp_path,
        "# cluster\n"
        "\n"
        "node1 slots=2\n"
        "   node2    slots=3   # trailing comment\n"
        "alice@node3 slots=1\n"
        "node4 slots=4 user=bob port=2222\n"
        "\t10.0.0.5 slots=1\n"
        "[::1] slots=2\n"
        "carol@[fe80::1%eth0] slots=1 port=22\n"
        "   # indented comment\n",
    )
    assert load_hostfile(path) == [
        Host("node1", (0, 1)),
        Host("node2", (0, 1, 2)),
        Host("node3", (0,), user="alice"),
        Host("node4", (0, 1, 2, 3), user="bob", port=2222),
        Host("10.0.0.5", (0,)),
        Host("::1", (0, 1)),
        Host("fe80::1%eth0", (0,), user="carol", port=22),
    ]


def test_keys_in_any_order_and_user_twice_when_equal():
    hosts = parse_hostfile("n1 port=22 slots=2 user=u\n")
    assert hosts == [Host("n1", (0, 1), user="u", port=22)]
    assert parse_hostfile("u@n1 slots=1 user=u") == [Host("n1", (0,), user="u")]


def test_crlf_line_endings():
    assert parse_hostfile("a slots=1\r\nb slots=2\r\n") == [Host("a", (0,)), Host("b", (0, 1))]


def test_example_hostfiles_parse():
    example = load_hostfile(os.path.join(EXAMPLES, "example"))
    assert [h.name for h in example] == [
        "node1",
        "node2",
        "node3",
        "node4",
        "10.0.0.5",
        "fe80::1%eth0",
    ]
    assert example[3] == Host("node4", (0, 1, 2, 3), user="bob", port=2222)
    assert load_hostfile(os.path.join(EXAMPLES, "localhost")) == [Host("localhost", (0, 1))]


def test_is_local_and_display():
    assert Host("localhost", (0,)).is_local
    assert Host("127.0.0.1", (0,)).is_local
    assert Host("::1", (0,)).is_local
    assert not Host("node1", (0,)).is_local
    # An explicit ssh user or port asks for ssh even to loopback.
    assert not Host("localhost", (0,), user="bob").is_local
    assert not Host("localhost", (0,), port=2222).is_local
    assert Host("::1", (0,)).display == "[::1]"
    assert Host("node1", (0,)).display == "node1"


NAME = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            NAME,
            st.integers(1, 16),
            st.none() | st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True),
            st.none() | st.integers(1, 65535),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
        unique_by=lambda t: t[0],
    )
)
def test_roundtrip_of_generated_hostfiles(entries):
    lines = ["# generated"]
    expected = []
    for name, slots, user, port, user_as_key in entries:
        dest = name if user is None or user_as_key else f"{user}@{name}"
        line = f"{dest} slots={slots}"
        if user is not None and user_as_key:
            line += f" user={user}"
        if port is not None:
            line += f"  port={port}  # ssh port"
        lines += [line, ""]
        expected.append(Host(name, tuple(range(slots)), user=user, port=port))
    assert parse_hostfile("\n".join(lines)) == expected


# ---- errors: each names file:line and says how to fix it ------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("node1 slots=2\nnode2 8\n", 2, "expected key=value"),
        ("node1\n", 1, "has no slots"),
        ("node1 port=22\n", 1, "has no slots"),
        ("node1 slots=0\n", 1, "slots must be a positive integer, got '0'"),
        ("node1 slots=-1\n", 1, "slots must be a positive integer, got '-1'"),
        ("node1 slots=two\n", 1, "slots must be a positive integer, got 'two'"),
        ("node1 slots=\n", 1, "slots must be a positive integer, got ''"),
        ("node1 slots=1.5\n", 1, "slots must be a positive integer"),
        ("\n# c\nnode1 slots=1 slots=2\n", 3, "slots given twice"),
        ("node1 slots=1 port=0\n", 1, "port must be a positive integer"),
        ("node1 slots=1 port=70000\n", 1, "port must be 1-65535, got 70000"),
        ("node1 slots=1 port=ssh\n", 1, "port must be a positive integer"),
        ("a@node1 slots=1 user=b\n", 1, "user given twice"),
        ("node1 slots=1 user=bad/name\n", 1, "bad user name"),
        ("::1 slots=2\n", 1, "bad host '::1'"),
        ("node1:22 slots=2\n", 1, "bad host 'node1:22'"),
        ("[::1 slots=2\n", 1, "IPv6 address in brackets"),
        ("[node1] slots=2\n", 1, "IPv6 address in brackets"),
        ("slots=2 node1\n", 1, "instead of a host name"),
        ("no!de slots=1\n", 1, "bad host name 'no!de'"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, text, line, words):
    err = load_error(tmp_path, text)
    path = str(tmp_path / "hosts")
    assert err.message.startswith(f"{path}:{line}: "), err.message
    assert words in err.message
    assert err.hint


def test_missing_slots_hint_shows_fixed_line(tmp_path):
    err = load_error(tmp_path, "node7\n")
    assert "node7 slots=8" in err.hint


def test_duplicate_host_names_both_lines(tmp_path):
    err = load_error(tmp_path, "node1 slots=2\n# x\nnode2 slots=1\nNODE1 slots=4\n")
    assert err.message == (f"{tmp_path / 'hosts'}:4: duplicate host NODE1 (first listed at line 1)")
    assert "once" in err.hint


def test_unknown_key_suggests_nearest(tmp_path):
    err = load_error(tmp_path, "node1 slot=2\n")
    assert err.message == f"{tmp_path / 'hosts'}:1: unknown key 'slot'"
    assert err.hint == "did you mean 'slots'?"
    assert load_error(tmp_path, "node1 slots=2 usr=bob\n").hint == "did you mean 'user'?"
    assert load_error(tmp_path, "node1 gpus=2\n").hint == "did you mean 'slots'?"
    far = load_error(tmp_path, "node1 slots=2 zone=b\n")
    assert "unknown key 'zone'" in far.message
    assert far.hint == "known keys are slots, port, user"


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n   # more\n"])
def test_empty_hostfile_is_an_error(tmp_path, text):
    err = load_error(tmp_path, text)
    assert err.message == f"hostfile {tmp_path / 'hosts'} has no hosts"
    assert "slots=" in err.hint


def test_missing_hostfile_is_an_error_not_a_local_run(tmp_path):
    path = str(tmp_path / "nope")
    with pytest.raises(HostfileError) as info:
        load_hostfile(path)
    assert info.value.exit_code == 2
    assert info.value.message == f"hostfile {path} not found"


def test_directory_and_binary_and_unreadable(tmp_path):
    with pytest.raises(HostfileError, match="is a directory"):
        load_hostfile(str(tmp_path))
    binary = tmp_path / "bin"
    binary.write_bytes(b"node1 slots=1\n\xff\xfe\n")
    with pytest.raises(HostfileError, match="not UTF-8"):
        load_hostfile(str(binary))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        locked.write_text("node1 slots=1\n")
        locked.chmod(0)
        with pytest.raises(HostfileError, match="cannot read"):
            load_hostfile(str(locked))
        locked.chmod(stat.S_IRUSR)


# ---- default hosts --------------------------------------------------------------------------


@pytest.fixture
def no_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_visible_gpus_from_cuda_visible_devices(no_nvidia_smi):
    assert visible_gpu_slots({"CUDA_VISIBLE_DEVICES": "2,3"}) == (2, 3)
    assert visible_gpu_slots({"CUDA_VISIBLE_DEVICES": " 0 , 5 "}) == (0, 5)
    assert visible_gpu_slots({"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}) == (0, 1)
    assert visible_gpu_slots({"CUDA_VISIBLE_DEVICES": ""}) is None
    assert visible_gpu_slots({"CUDA_VISIBLE_DEVICES": "-1"}) is None
    assert visible_gpu_slots({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == (1,)
    assert visible_gpu_slots({}) is None


def test_default_hosts(no_nvidia_smi):
    assert default_hosts(None, {}) == [Host("localhost", (0,))]
    assert default_hosts(4, {}) == [Host("localhost", (0, 1, 2, 3))]
    visible = {"CUDA_VISIBLE_DEVICES": "4,6"}
    assert default_hosts(None, visible) == [Host("localhost", (4, 6))]
    assert default_hosts(1, visible) == [Host("localhost", (4,))]
    assert default_hosts(None, {"CUDA_VISIBLE_DEVICES": ""}) == [Host("localhost", (0,))]
    with pytest.raises(UsageError, match="--num-gpus must be 1 or more, got 0"):
        default_hosts(0, {})
