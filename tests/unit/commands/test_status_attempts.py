"""`zlaunch status`'s attempts table: each attempt's hosts, world size and batch, and the fleet
change that started it with what it cost, from run.json's entries as the job records them."""

from __future__ import annotations

from zlaunch.commands.status import attempt_rows


def test_each_attempt_says_its_fleet_change_and_what_it_cost():
    attempts = [
        {"attempt": 0, "hosts": ["node1", "node2", "node3"], "world_size": 3, "batch": None,
         "reason": "start", "start_time": None},
        {"attempt": 1, "hosts": ["node1", "node3"], "world_size": 2, "batch": "6,1,3",
         "reason": "node2 preempted: saved at step 8", "start_time": None,
         "change": {"kind": "preempted", "hosts": ["node2"], "saved_step": 8, "last_step": 8,
                    "steps_lost": 0, "deadline_missed": False, "notice_to_restart_s": 4.25}},
        {"attempt": 2, "hosts": ["node1"], "world_size": 1, "batch": "6,1,6",
         "reason": "node3 preempted: not saved", "start_time": None,
         "change": {"kind": "preempted", "hosts": ["node3"], "saved_step": None,
                    "last_step": 11, "steps_lost": None, "deadline_missed": True,
                    "notice_to_restart_s": 0.5}},
        {"attempt": 3, "hosts": ["node1", "node4"], "world_size": 2, "batch": "6,1,3",
         "reason": "rank 1 failed", "start_time": None,
         "change": {"kind": "lost", "hosts": ["node9"]}},
    ]  # fmt: skip
    rows = attempt_rows(attempts)
    assert [row[:5] for row in rows] == [
        ["0", "-", "node1,node2,node3", "3", "as configured"],
        ["1", "-", "node1,node3", "2", "6,1,3"],
        ["2", "-", "node1", "1", "6,1,6"],
        ["3", "-", "node1,node4", "2", "6,1,3"],
    ]
    assert [row[5] for row in rows] == [
        "start",
        "preempted node2; saved at step 8; 0 step(s) lost; 4.2 s from the notice to the restart",
        "preempted node3; deadline passed before the save: resumed from the previous "
        "checkpoint; 0.5 s from the notice to the restart",
        "lost node9",
    ]


def test_a_damaged_entry_is_shown_as_what_can_be_read():
    assert attempt_rows([{"attempt": 1, "change": "?"}, "junk"]) == [
        ["1", "-", "-", "-", "as configured", "-"]
    ]


def test_a_slow_host_taken_out_is_said_with_its_figure():
    why = "1.62x the median step for 30 steps"
    attempts = [
        {"attempt": 0, "hosts": ["node1", "node2"], "world_size": 2, "batch": None,
         "reason": "start", "start_time": None},
        {"attempt": 1, "hosts": ["node1"], "world_size": 1, "batch": "6,1,6",
         "reason": "node2 slow: taken out: saved at step 41", "start_time": None,
         "change": {"kind": "slow", "hosts": ["node2"], "slow": {"node2": why},
                    "saved_step": 41, "last_step": 41, "steps_lost": 0,
                    "deadline_missed": False, "notice_to_restart_s": 2.5}},
    ]  # fmt: skip
    assert attempt_rows(attempts)[1][5] == (
        f"slow node2 taken out (node2 {why}); saved at step 41; 0 step(s) lost; "
        "2.5 s from the notice to the restart"
    )


def test_a_host_that_joined_is_said_with_the_save_and_the_seconds_growing_cost():
    attempts = [
        {"attempt": 1, "hosts": ["node1", "node3"], "world_size": 2, "batch": "6,1,3",
         "reason": "rank 1 failed", "start_time": None,
         "change": {"kind": "lost", "hosts": ["node2"]}},
        {"attempt": 2, "hosts": ["node1", "node2", "node3"], "world_size": 3, "batch": None,
         "reason": "node2 joined: saved at step 9", "start_time": None,
         "change": {"kind": "joined", "hosts": ["node2"], "saved_step": 9, "last_step": 9,
                    "steps_lost": 0, "save_to_restart_s": 3.04}},
        {"attempt": 3, "hosts": ["node1", "node2", "node3", "node4"], "world_size": 4,
         "batch": "12,1,3", "reason": "node4 joined: not saved", "start_time": None,
         "change": {"kind": "joined", "hosts": ["node4"], "saved_step": None, "last_step": 12,
                    "steps_lost": None, "save_to_restart_s": None}},
    ]  # fmt: skip
    rows = attempt_rows(attempts)
    assert [row[2] for row in rows][1:] == ["node1,node2,node3", "node1,node2,node3,node4"]
    assert [row[5] for row in rows] == [
        "lost node2",
        "node2 joined; saved at step 9; 0 step(s) lost; 3.0 s from the save request to the restart",
        "node4 joined; not saved: resumed from the latest checkpoint",
    ]
