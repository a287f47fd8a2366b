"""The NVMe swapper against a real temporary directory: data back as written, order per key,
overlap across keys, short reads, a full disk (the file size limit), the private directory."""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import threading

import pytest
import torch

from runtime.zero.nvme import ALIGN, SwapDir, SwapError, Swapper, aligned_buffer, sweep_stale
from runtime.zero.nvme import swapper as swapper_module


@pytest.fixture(params=[None, False], ids=["direct-if-possible", "buffered"])
def swapper(request, tmp_path):
    s = Swapper(
        SwapDir(str(tmp_path), rank=3, run_id="t"),
        workers=4,
        block_size=2 * ALIGN,
        direct=request.param,
    )
    yield s
    s.close()


def _swap_dir(tmp_path):
    (entry,) = [e for e in os.listdir(tmp_path) if e.startswith(".zlaunch-swap-")]
    return tmp_path / entry


@pytest.mark.parametrize("numel", [1, 1023, 2048, 2 * ALIGN + 5, 40_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_what_is_written_reads_back_bit_for_bit(swapper, numel, dtype):
    t = torch.randn(numel).to(dtype)
    out = torch.full_like(t, 7)
    swapper.write("k", t).wait()
    swapper.read("k", out).wait()
    assert torch.equal(out, t)
    # Aligned memory goes without the bounce buffer; it must come back the same way.
    buf = aligned_buffer(t.numel() * t.element_size())
    aligned = torch.frombuffer(buf, dtype=dtype, count=numel)
    swapper.read("k", aligned).wait()
    assert torch.equal(aligned, t)


def test_direct_io_is_used_where_the_filesystem_takes_it(tmp_path):
    s = Swapper(SwapDir(str(tmp_path), rank=0), direct=None)
    try:
        # The test directory is on the machine's disk (ext4 here), which takes O_DIRECT;
        # tmpfs would not, and `direct=True` there is refused with the reason.
        assert s.direct is True
    finally:
        s.close()


def test_operations_on_one_key_run_in_the_order_issued(swapper):
    versions = [torch.full((30_000,), float(v)) for v in range(6)]
    outs = [torch.empty(30_000) for _ in versions]
    pendings = []
    for v, out in zip(versions, outs, strict=True):  # nothing waited for until all are issued
        pendings.append(swapper.write("k", v))
        pendings.append(swapper.read("k", out))
    for p in pendings:
        p.wait()
    assert [o.unique().tolist() for o in outs] == [[float(v)] for v in range(6)]


def test_a_read_of_one_key_completes_while_a_write_of_another_is_in_flight(tmp_path, monkeypatch):
    s = Swapper(SwapDir(str(tmp_path), rank=0), workers=4, block_size=ALIGN)
    try:
        b = torch.arange(5000, dtype=torch.float32)
        s.write("b", b).wait()
        gate = threading.Event()
        real = os.pwritev

        def held_write(fd, bufs, offset):
            assert gate.wait(10), "the test's gate was never opened"
            return real(fd, bufs, offset)

        monkeypatch.setattr(swapper_module.os, "pwritev", held_write)
        writing = s.write("a", torch.ones(3000))  # write-behind: held on the disk
        out = torch.empty_like(b)
        reading = s.read("b", out)  # read-ahead of another key
        reading.wait()
        assert torch.equal(out, b) and not writing.done()
        gate.set()
        writing.wait()
        back = torch.empty(3000)
        s.read("a", back).wait()
        assert torch.equal(back, torch.ones(3000))
    finally:
        s.close()


def test_partial_reads_from_the_kernel_are_continued(swapper, monkeypatch):
    t = torch.randn(20_000)
    swapper.write("k", t).wait()
    real = os.preadv

    def trickle(fd, bufs, offset):  # the kernel may return fewer bytes than asked
        (buf,) = bufs
        return real(fd, [buf[:ALIGN]], offset)

    monkeypatch.setattr(swapper_module.os, "preadv", trickle)
    out = torch.empty_like(t)
    swapper.read("k", out).wait()
    assert torch.equal(out, t)


def test_a_truncated_swap_file_is_a_clear_error_not_garbage(swapper):
    t = torch.randn(20_000)
    swapper.write("k", t).wait()
    os.ftruncate(swapper._entries["k"].fd, 3 * ALIGN)  # something outside cut the file
    with pytest.raises(SwapError, match=r"'k'.*nvme_path.*bytes short.*contents are lost"):
        swapper.read("k", torch.empty_like(t)).wait()


def test_reading_a_key_never_written_or_into_the_wrong_size_is_refused(swapper):
    with pytest.raises(RuntimeError, match="'nope' was never written"):
        swapper.read("nope", torch.empty(3))
    swapper.write("k", torch.ones(10)).wait()
    with pytest.raises(RuntimeError, match="holds 40 bytes; the buffer to read it into has 44"):
        swapper.read("k", torch.empty(11))


@pytest.fixture
def file_size_limit():
    """A real "disk full": the kernel refuses writes past RLIMIT_FSIZE with EFBIG (Python
    ignores SIGXFSZ, so the process lives to report it)."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)

    def limit(nbytes):
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old[1]))

    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, old)


def test_no_space_at_allocation_stops_at_setup_and_leaves_nothing(
    swapper, tmp_path, file_size_limit
):
    small = torch.randn(1000)
    swapper.allocate("small", small.numel() * 4)
    swapper.write("small", small).wait()
    file_size_limit(64 * ALIGN)
    with pytest.raises(
        SwapError, match=r"nvme_path '.*' cannot hold 'big' \(4194304 bytes\).*larger disk"
    ):
        swapper.allocate("big", 4 << 20)
    with pytest.raises(RuntimeError, match="'big' was never written"):
        swapper.read("big", torch.empty(1 << 20))
    out = torch.empty_like(small)
    swapper.read("small", out).wait()
    assert torch.equal(out, small)
    assert os.listdir(_swap_dir(tmp_path)) == ["owner"]


def test_no_space_during_a_write_fails_it_and_the_key_refuses_reads(swapper, file_size_limit):
    kept = torch.randn(2000)
    swapper.write("kept", kept).wait()
    big = torch.randn(1 << 20)
    file_size_limit(64 * ALIGN)
    with pytest.raises(SwapError, match=r"cannot hold 'big'.*File too large"):
        swapper.write("big", big).wait()
    # Part of "big" reached the file: none of it may be served as if it were whole.
    with pytest.raises(SwapError, match=r"'big' cannot be read: its last write failed"):
        swapper.read("big", torch.empty_like(big)).wait()
    out = torch.empty_like(kept)
    swapper.read("kept", out).wait()
    assert torch.equal(out, kept)
    # Written again in full (within the limit), the key is whole again.
    smaller = torch.randn(1000)
    swapper.write("big", smaller).wait()
    back = torch.empty_like(smaller)
    swapper.read("big", back).wait()
    assert torch.equal(back, smaller)


def test_the_swap_directory_is_private_unnamed_and_removed_at_close(tmp_path):
    s = Swapper(SwapDir(str(tmp_path), rank=1, run_id="run/7"), workers=2)
    d = _swap_dir(tmp_path)
    assert d.name.startswith(".zlaunch-swap-run_7-rank1-")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    s.write("k", torch.randn(50_000)).wait()
    # The data files have no name: a kill frees them, and nothing here looks like a checkpoint.
    assert os.listdir(d) == ["owner"]
    s.close()
    assert os.listdir(tmp_path) == []


def test_stale_directories_of_dead_processes_are_removed_at_the_next_start(tmp_path):
    def left(name, owner):
        d = tmp_path / f".zlaunch-swap-{name}"
        d.mkdir(mode=0o700)
        if owner is not None:
            (d / "owner").write_text(json.dumps(owner))
        return d

    here = socket.gethostname()
    dead = left("dead", {"host": here, "pid": os.getpid(), "start": -1})  # pid reused since
    noted_never = left("killed-at-birth", None)
    os.utime(noted_never, (0, 0))  # long ago: a directory being set up now is left alone
    starting = left("starting-now", None)
    elsewhere = left("other-host", {"host": here + "-not", "pid": 1, "start": -1})
    (tmp_path / "checkpoint").mkdir()
    s = Swapper(SwapDir(str(tmp_path), rank=0), workers=1)
    try:
        assert not dead.exists() and not noted_never.exists()
        assert elsewhere.exists() and starting.exists() and (tmp_path / "checkpoint").exists()
        # The live one (this process) survives a sweep by another starting rank.
        assert sweep_stale(str(tmp_path)) == []
        assert os.path.isdir(s.directory.path)
    finally:
        s.close()
