"""The frame decoder's numbers: a value a float cannot hold is a protocol error naming the
field, never an exception."""

from __future__ import annotations

import re

import pytest

from zlaunch.wire import frames


@pytest.mark.parametrize("grace", ["9" * 400, "-" + "9" * 400, "NaN", "Infinity"])
def test_a_stop_frame_with_an_impossible_grace_is_a_protocol_error(grace):
    with pytest.raises(frames.ProtocolError, match=re.escape("'grace' must be a number (finite)")):
        frames.decode('{"t":"stop","grace":' + grace + "}")
