"""The one metrics line (zlaunch.wire.metrics_format): what ranks log and the controller prints."""

from __future__ import annotations

import pytest

from zlaunch.wire.metrics_format import (
    breakdown_text,
    format_line,
    human_bytes,
    number,
    rate,
    split,
)

EVENT = {
    "kind": "metrics", "source": "engine", "step": 20, "total_steps": 100, "loss": 2.345678,
    "lr": 0.00012346, "loss_scale": 1.0, "grad_norm": 0.5, "skipped_steps": 0,
    "step_time": 0.04, "samples_per_s": 1.5e6, "tokens_per_s": None, "memory_kind": "rss",
    "memory_bytes": 512, "comm_bytes": 3 * 2**10,
    "time_forward": 0.010, "time_backward": 0.024, "time_reduce_wait": 0.004,
    "time_allgather_wait": 0.002, "time_step": 0.006, "straggler": "node7 (rank 5)",
    "tflops": 123.0, "mfu": 0.395, "peak_source": "NVIDIA A100: datasheet",
}  # fmt: skip


def test_engine_line_with_split_straggler_and_mfu():
    assert format_line(EVENT) == (
        "step 20/100 | loss 2.346 | lr 0.0001235 | grad norm 0.5 | loss scale 1 | skipped 0"
        " | step time 40.0 ms | samples/s 1.50M | rss 512 B | comm 3.0 KiB"
        " | fwd 10.0ms bwd 18.0ms reduce wait 4.0ms gather wait 2.0ms step 6.0ms"
        " | slowest node7 (rank 5)"
        " | MFU 39.5%  123 TFLOP/s per device  (peak: NVIDIA A100: datasheet)"
    )


def test_the_controller_line_is_the_same_fields_two_spaces_apart():
    assert format_line(EVENT, sep="  ") == format_line(EVENT).replace(" | ", "  ")


def test_missing_numbers_print_as_dashes_not_errors():
    line = format_line({"kind": "metrics", "source": "engine", "step": 1})
    assert line == (
        "step 1 | loss - | lr - | grad norm - | loss scale - | skipped - | samples/s -"
        " | mem - | comm -"
    )


def test_script_values_skip_where_and_when():
    event = {"kind": "metrics", "source": "user", "step": 3, "rank": 0, "host": "n1", "acc": 0.5}
    assert format_line(event) == "step 3 | acc 0.5"
    assert format_line(event, sep="  ") == "step 3  acc 0.5"


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), ("x", "-"), (True, "-"), (1023, "1023 B"), (2**20, "1.0 MiB"),
     (1.5 * 2**30, "1.5 GiB")],
)  # fmt: skip
def test_human_bytes(value, text):
    assert human_bytes(value) == text


def test_rates_and_numbers():
    assert [rate(v) for v in (None, 9999.0, 32768.0, 2.5e6)] == ["-", "9999.0", "32.8k", "2.50M"]
    assert [number(v) for v in (None, 7, 0.123456, "x")] == ["-", "7", "0.1235", "x"]
    assert number(65536.0, "g") == "65536"


def test_split_adds_up_to_the_measured_step():
    parts = split(EVENT)
    total = EVENT["time_forward"] + EVENT["time_backward"] + EVENT["time_step"]
    assert sum(parts.values()) == pytest.approx(total)
    assert split({"time_forward": 1.0}) is None
    assert breakdown_text({"step": 1}) is None
