"""Run-directory commands on local jobs: stop from another process, follow a live job, and
the clear messages (missing matplotlib, no runs, bad --rank)."""

from __future__ import annotations

import pytest

from zlaunch.commands.logs import parse_ranks
from zlaunch.errors import UsageError


def test_rank_selection_grammar():
    assert parse_ranks(()) is None
    assert parse_ranks(("3", "0,4-5")) == {0, 3, 4, 5}
    for bad in ("x", "5-2", "1,,2"):
        with pytest.raises(UsageError, match="--rank"):
            parse_ranks((bad,))


def test_plot_shows_the_gradient_norm_when_the_loss_scale_never_moved():
    from zlaunch.commands.plot import fourth_panel

    assert fourth_panel([1.0, 1.0, 1.0]) == ("grad_norm", "gradient norm")  # fp32 / bf16
    assert fourth_panel([]) == ("grad_norm", "gradient norm")
    assert fourth_panel([65536.0, 32768.0]) == ("loss_scale", "loss scale")  # dynamic fp16
