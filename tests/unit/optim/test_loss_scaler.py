"""runtime.optim.loss_scaler: DeepSpeed's dynamic loss scaling, step by step."""

import pickle

import pytest

from runtime.config import FP16Config
from runtime.optim.loss_scaler import (
    DynamicLossScaler,
    LossScaleAtMinimum,
    StaticLossScaler,
    build_loss_scaler,
)

T, F = True, False


def scales_after(scaler, pattern):
    out = []
    for overflow in pattern:
        scaler.update(overflow)
        out.append(scaler.scale)
    return out


def test_window_doubling_and_hysteresis():
    scaler = DynamicLossScaler(init_scale=16, scale_window=3, hysteresis=2, min_scale=1)
    pattern = [F, F, F, F, T, T, F, F, F, F, T, F, T]
    # it 0..2 clean: stable intervals 0, 1, 2; it 3 is the 3rd stable step after it 0 -> x2.
    # it 4 overflow: hysteresis 2 -> 1, scale kept; it 5 overflow: counter at 1 -> halve.
    # it 6..9 clean: doubles at it 9 (stable 3) and refills the counter to 2.
    # it 10 overflow: 2 -> 1; it 11 clean (no refill without consecutive_hysteresis);
    # it 12 overflow: counter at 1 -> halve.
    assert scales_after(scaler, pattern) == [16, 16, 16, 32, 32, 16, 16, 16, 16, 32, 32, 32, 16]
    assert scaler.iteration == 13 and scaler.last_overflow_iteration == 12
    assert scaler.hysteresis_left == 1


def test_consecutive_hysteresis_refills_on_every_clean_step():
    scaler = DynamicLossScaler(
        init_scale=16, scale_window=3, hysteresis=2, consecutive_hysteresis=True, min_scale=1
    )
    pattern = [F, F, F, F, T, T, F, F, F, F, T, F, T]
    # Same as above until it 11, whose clean step refills the counter: it 12 only decrements.
    assert scales_after(scaler, pattern) == [16, 16, 16, 32, 32, 16, 16, 16, 16, 32, 32, 32, 32]
    assert scaler.hysteresis_left == 1
    # T F T F ... never halves with consecutive hysteresis 2.
    assert scales_after(scaler, [F, T, F, T, F, T]) == [32] * 6


def test_hysteresis_one_halves_at_once_and_window_counts_from_last_overflow():
    scaler = DynamicLossScaler(init_scale=1024, scale_window=2, hysteresis=1, min_scale=1)
    pattern = [T, T, F, F, F, F, F, T]
    # it0, it1 overflow: halve twice. it2 stable 0, it3 stable 1, it4 stable 2 -> x2,
    # it5 stable 3, it6 stable 4 -> x2, it7 overflow -> halve.
    assert scales_after(scaler, pattern) == [512, 256, 256, 256, 512, 512, 1024, 512]


def test_default_window_doubles_after_window_clean_steps_past_the_first():
    scaler = DynamicLossScaler(init_scale=2.0**16, scale_window=1000, hysteresis=2)
    scales = scales_after(scaler, [F] * 1001)
    assert scales[999] == 2.0**16 and scales[1000] == 2.0**17


def test_min_scale_policy_raise():
    scaler = DynamicLossScaler(init_scale=3, scale_window=100, hysteresis=1, min_scale=2)
    scaler.update(True)
    assert scaler.scale == 2  # max(3 / 2, 2)
    with pytest.raises(LossScaleAtMinimum) as info:
        scaler.update(True)
    assert "minimum loss scale 2" in str(info.value)
    assert "bf16" in str(info.value)


def test_min_scale_policy_keep_going():
    scaler = DynamicLossScaler(
        init_scale=4, scale_window=100, hysteresis=2, min_scale=2, raise_at_minimum=False
    )
    assert scales_after(scaler, [T, T, T, T, T]) == [4, 2, 2, 2, 2]
    assert scaler.last_message == (
        "gradient overflow: skipping step, loss scale stays at its minimum 2"
    )


def test_messages_describe_each_overflow():
    scaler = DynamicLossScaler(init_scale=8, scale_window=10, hysteresis=2)
    scaler.update(True)
    assert scaler.last_message == (
        "gradient overflow: skipping step, loss scale stays 8 (hysteresis 2 -> 1)"
    )
    scaler.update(True)
    assert scaler.last_message == "gradient overflow: skipping step, loss scale 8 -> 4"
    scaler.update(False)
    assert scaler.last_message is None


def test_state_dict_round_trip_continues_identically():
    pattern = [F, T, F, F, T, T, F, F, F, F, F, T, F, F, F, F]
    a = DynamicLossScaler(init_scale=64, scale_window=3, hysteresis=2, min_scale=1)
    scales_after(a, pattern[:7])
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b = DynamicLossScaler(init_scale=2.0**16, scale_window=3, hysteresis=2, min_scale=1)
    b.load_state_dict(state)
    assert scales_after(a, pattern[7:]) == scales_after(b, pattern[7:])
    assert a.state_dict() == b.state_dict()


def test_static_scaler():
    scaler = StaticLossScaler(128)
    assert scales_after(scaler, [T, F, T]) == [128, 128, 128]
    other = StaticLossScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.scale == 128 and not other.dynamic


def test_build_from_config():
    assert build_loss_scaler(FP16Config()).scale == 1.0
    static = build_loss_scaler(FP16Config(enabled=True, loss_scale=512))
    assert isinstance(static, StaticLossScaler) and static.scale == 512
    dynamic = build_loss_scaler(
        FP16Config(
            enabled=True,
            initial_scale_power=5,
            loss_scale_window=7,
            hysteresis=3,
            consecutive_hysteresis=True,
            min_loss_scale=0.5,
        )
    )
    assert isinstance(dynamic, DynamicLossScaler)
    assert (dynamic.scale, dynamic.scale_window, dynamic.hysteresis) == (32.0, 7, 3)
    assert dynamic.consecutive_hysteresis and dynamic.min_scale == 0.5
