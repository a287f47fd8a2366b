"""Output of any size and bytes, big environments and NUL bytes never
end or hang a job. Each case runs the real ``zlaunch`` command on localhost."""

from __future__ import annotations

import pytest

from zlaunch.errors import UsageError
from zlaunch.job.envfile import parse_env_options, parse_env_text
from zlaunch.wire import frames

# Bytes a worker writes without a single newline: every invalid UTF-8 byte costs 6 bytes of
# JSON, so the old frames were ~6x this, far over the 8 MiB frame limit.


def test_agent_output_frames_stay_far_below_the_limit_whatever_the_bytes():
    # Worst case of one read: the piece limit plus a whole read, every byte escaped.
    from zlaunch.agent.output import READ_SIZE

    worst = bytes([0x80]) * (frames.MAX_PIECE_BYTES + READ_SIZE)
    frame = frames.Out(0, "o", [frames.line_text(worst)], partial=True)
    assert len(frames.encode(frame)) < frames.MAX_FRAME_BYTES // 2


def test_a_frame_over_the_limit_is_dropped_alone_and_reported_without_its_bytes():
    bad: list[str] = []
    reader = frames.FrameReader(on_bad=lambda err: bad.append(str(err)), limit=1000)
    secret = "hunter2" * 400
    data = (
        frames.encode(frames.Heartbeat())
        + frames.encode(
            frames.Spec(grace=1.0, heartbeat_timeout=1.0, env={"X": secret}, workers=[])
        )
        + b"{not json "
        + secret.encode()
        + b"\n"
        + frames.encode(frames.Bye())
    )
    got = []
    for i in range(0, len(data), 333):
        got.extend(reader.feed(data[i : i + 333]))
    got.extend(reader.finish())
    assert got == [frames.Heartbeat(), frames.Bye()]
    assert len(bad) == 2 and not any("hunter2" in b for b in bad)
    assert "bytes dropped" in bad[0]


@pytest.mark.parametrize(
    "text", ['K="a\x00b"\n', "K='a\x00b'\n", "export K=a\x00\n", 'K="line\nsecond\x00"\n']
)
def test_nul_bytes_in_env_text_are_refused_in_every_quoting(text):
    with pytest.raises(UsageError, match="NUL"):
        parse_env_text(text, origin="f")


def test_nul_bytes_in_env_options_are_refused():
    with pytest.raises(UsageError, match="NUL"):
        parse_env_options(["K=a\x00b"], {})
    with pytest.raises(UsageError, match="NUL"):
        parse_env_options(["K"], {"K": "a\x00b"})
