"""Issue 25 (hardening, third pass): the reproductions that need no process, as unit tests.
Each failed before its fix: the agent's events parser, the controller's metrics check, a
signal during a failure's stop, and the frame decoder's numbers."""

from __future__ import annotations

import json
import math
import os
import re
import signal

import pytest

from tests.unit.launcher.test_job_state import running
from zlaunch.agent.events import MAX_EVENT_DEPTH, parse_event
from zlaunch.console.job_view import JobView
from zlaunch.launcher.restart_policy import GiveUp, RestartPolicy
from zlaunch.launcher.state import Ending, Note, RankExited, SignalReceived, StopRanks
from zlaunch.wire import frames, protocol
from zlaunch.wire.metrics_check import checked_metrics
from zlaunch.wire.metrics_format import format_line

# ---- item 2: what a rank writes to its events fd --------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b'{"kind": "x", "deep": ' + b"[" * 900 + b"]" * 900 + b"}",
    ],
    ids=["open-brackets", "closed-brackets", "nested-objects", "under-the-stack-limit"],
)
def test_deeply_nested_events_become_invalid_events_never_an_exception(raw):
    event = parse_event(raw)
    assert event["kind"] == protocol.INVALID_EVENT
    assert f"nested deeper than {MAX_EVENT_DEPTH} levels" in event["text"]
    frames.encode(frames.Event(0, [event]))  # and the frame carrying it encodes


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_an_event_that_is_not_an_object_is_invalid(raw):
    assert parse_event(raw) == {
        "kind": protocol.INVALID_EVENT,
        "text": f"event not a JSON object ({len(raw)} bytes): {raw.decode()}",
    }


def test_a_nested_event_within_the_bound_passes_unchanged():
    value: object = 1
    for _ in range(MAX_EVENT_DEPTH - 1):
        value = [value]
    raw = json.dumps({"kind": "x", "v": value}).encode()
    assert parse_event(raw) == json.loads(raw)


# ---- item 3: malformed metrics events --------------------------------------------------------

BAD_FIELDS = [
    ("memory_bytes", math.nan),
    ("memory_bytes", math.inf),
    ("comm_bytes", -math.inf),
    ("samples", 10**400),
    ("total_steps", "abc"),
    ("step_time", "[red]"),
    ("samples_per_s", {"a": 1}),
    ("memory_kind", ["x"]),
    ("report", "yes"),
]


@pytest.mark.parametrize(("key", "value"), BAD_FIELDS)
def test_a_bad_metrics_field_is_dropped_and_named(key, value):
    verdict = checked_metrics({"kind": "metrics", "step": 1, "loss": 2.5, key: value})
    assert verdict.row == {"kind": "metrics", "step": 1, "loss": 2.5}
    (problem,) = verdict.problems
    assert problem.startswith(f"{key} ")
    format_line(verdict.row, "  ")  # the line every view prints does not crash


@pytest.mark.parametrize("step", [[1], "1", -1, 1.5, None, True, 2**80])
def test_a_metrics_event_with_a_bad_step_is_dropped_whole(step):
    verdict = checked_metrics({"kind": "metrics", "step": step, "loss": 1.0})
    assert verdict.row is None and "step" in verdict.problems[0]


def test_a_diverged_loss_is_kept_it_is_news_not_garbage():
    event = {"kind": "metrics", "step": 3, "loss": math.nan, "grad_norm": math.inf}
    assert checked_metrics(event).row == event
    assert "loss nan" in format_line(event)


def test_checked_rows_survive_the_views_derived_numbers():
    event = {"kind": "metrics", "step": 2, "total_steps": "abc", "step_time": math.nan}
    view = JobView.__new__(JobView)  # only the fields eta() reads
    view.latest, view.latest_at = checked_metrics(event).row, None
    assert view.eta() is None


# ---- item 7: a second signal does not erase the root cause ----------------------------------


def failed_then_signalled(signum: int):
    machine = running()
    machine.handle(RankExited(0, 100, 3, None, ("boom",)), now=1.0)
    return machine, machine.handle(SignalReceived(int(signum)), now=1.5)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_failures_stop_keeps_the_failure_as_the_root_cause(signum):
    machine, _ = failed_then_signalled(signum)
    outcome = machine.outcome()
    assert outcome.ending == Ending.RANKS_FAILED and outcome.exit_code == 3
    assert outcome.failures[0].rank == 0 and outcome.signal_while_stopping == signum
    # the user asked to stop: the failure is reported, no restart follows
    assert isinstance(RestartPolicy(max_restarts=3, min_nodes=None).after(outcome, (), 2.0), GiveUp)


def test_ctrl_c_during_a_failures_stop_kills_at_once():
    _, actions = failed_then_signalled(signal.SIGINT)
    assert actions == [Note("killing all ranks now", error=True), StopRanks(0.0)]


def test_the_first_ctrl_c_after_sigterm_kills_as_the_note_says():
    machine = running()
    first = machine.handle(SignalReceived(int(signal.SIGTERM)), now=1.0)
    assert "Ctrl-C again to kill now" in first[0].text
    assert machine.handle(SignalReceived(int(signal.SIGINT)), now=1.1)[-1] == StopRanks(0.0)
    assert machine.outcome().exit_code == 128 + signal.SIGTERM


# ---- item 10 (frames): a number a float cannot hold ----------------------------------------


@pytest.mark.parametrize("grace", ["9" * 400, "-" + "9" * 400, "NaN", "Infinity"])
def test_a_stop_frame_with_an_impossible_grace_is_a_protocol_error(grace):
    with pytest.raises(frames.ProtocolError, match=re.escape("'grace' must be a number (finite)")):
        frames.decode('{"t":"stop","grace":' + grace + "}")


# ---- item 9 and issue 29 item 6: redaction by token shape ------------------------------------

SHAPED = {
    "url-password-with-slash": (
        "postgres://app:pa/ss@db:5432/x",
        "postgres://app:<redacted>@db:5432/x",
    ),
    "url-password-with-at": ("https://u:p@ssw0rd@host/x", "https://u:<redacted>@host/x"),
    "azure-account-key": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9v+/YmFy==;EndpointSuffix=x",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=<redacted>;EndpointSuffix=x",
    ),
    "sas-sig": (
        "https://a.blob.core.windows.net/c/b?sv=2020-08-04&sr=b&sig=AbC%2Fdef%3D",
        "https://a.blob.core.windows.net/c/b?sv=2020-08-04&sr=b&sig=<redacted>",
    ),
    "slack-webhook": (
        "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXX",
        "https://hooks.slack.com/services/<redacted>",
    ),
    "hf-token": ("hf_" + "AbCdEfGhIj" * 3 + "KlMn", "<redacted>"),
    "hex-key": ("3f9a" * 10, "<redacted>"),
    "script-hf": ("hf_trainer.py", "hf_trainer.py"),
    "script-sk": ("sk-learn-baseline", "sk-learn-baseline"),
    "model-id": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
    "run-name": ("gpt2_medium_lr3e-4_bs32_run2", "gpt2_medium_lr3e-4_bs32_run2"),
}


@pytest.mark.parametrize("case", sorted(SHAPED))
def test_values_are_redacted_by_token_shape_not_word_prefix(case):
    from zlaunch.text.redact import redact_text, shown_env_value

    value, shown = SHAPED[case]
    assert redact_text(value) == shown
    assert shown_env_value("SOME_SETTING", value) == shown


def test_argv_secrets_by_flag_and_shape_and_a_script_path_is_never_one():
    from zlaunch.text.redact import REDACTED, redact_argv

    hexkey = "0123456789abcdef" * 3
    argv = ["python", "-u", "/work/hf_trainer.py", "-t", hexkey, "--hf_tok=abc", "--lr", "0.1"]
    assert redact_argv(argv) == [
        "python", "-u", "/work/hf_trainer.py", "-t", REDACTED, f"--hf_tok={REDACTED}", "--lr", "0.1"
    ]  # fmt: skip


def test_run_json_applies_the_dry_run_rules_on_top_of_its_allow_list():
    from zlaunch.text.redact import NOT_RECORDED, recorded_env_value, shown_env_value

    assert recorded_env_value("NCCL_IB_TOKEN", "s3cr3t") == NOT_RECORDED
    assert shown_env_value("NCCL_IB_TOKEN", "s3cr3t") == "<redacted>"
    assert recorded_env_value("PYTHONPATH", "/a:/b") == "/a:/b"
    url = "https://u:pw@host/simple"
    assert recorded_env_value("PYTHONPATH", url) == shown_env_value("PYTHONPATH", url)


# ---- item 8: run-directory readers ------------------------------------------------------------


def _run(root, run_id: str, record) -> None:
    path = root / run_id
    path.mkdir(parents=True, mode=0o700)
    (path / "run.json").write_text(json.dumps(record))


def test_runs_are_found_by_directory_name_not_by_what_run_json_says(tmp_path):
    from zlaunch.commands.runs_common import known_runs

    _run(tmp_path, "20260101-000000-aaaaaa", {"run_id": "../../elsewhere", "start_time": 5.0})
    _run(tmp_path, "20260101-000001-bbbbbb", {})
    _run(tmp_path, "20260101-000002-cccccc", [])
    runs, _ = known_runs(str(tmp_path))
    assert [(run.path, rec["run_id"]) for run, rec in runs] == [
        (str(tmp_path / "20260101-000001-bbbbbb"), "20260101-000001-bbbbbb"),
        (str(tmp_path / "20260101-000000-aaaaaa"), "20260101-000000-aaaaaa"),
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [("start_time", math.nan), ("start_time", 1e20), ("hosts", [1]), ("exit_code", "3"),
     ("plan", {"nodes": [{"host": "h", "workers": [{"rank": "x"}]}]}), ("controller_pid", -1)],
)  # fmt: skip
def test_a_bad_run_json_field_is_left_out_and_named(field, value):
    from zlaunch.rundir.run_record import checked_run_record

    record, problems = checked_run_record({field: value, "cwd": "/w"}, "20260101-000000-aaaaaa")
    assert record == {"cwd": "/w", "run_id": "20260101-000000-aaaaaa"}
    assert problems and problems[0].startswith(f"{field} is not ")


def test_a_fifo_run_json_is_a_bad_run_not_a_hang(tmp_path):
    from zlaunch.rundir.layout import RunDir

    (tmp_path / "r").mkdir()
    os.mkfifo(tmp_path / "r" / "run.json")
    with pytest.raises(ValueError, match="not a regular file"):
        RunDir(str(tmp_path / "r"), "r").record()


def test_an_unreadable_run_root_deletes_no_index_entry_and_a_gone_run_does(tmp_path, monkeypatch):
    from zlaunch.rundir import index as run_index

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _run(tmp_path / "root", "20260101-000000-aaaaaa", {})
    run_index.register("20260101-000000-aaaaaa", str(tmp_path / "root" / "20260101-000000-aaaaaa"))
    run_index.register("20260101-000001-gone00", str(tmp_path / "root" / "20260101-000001-gone00"))
    run_index.register("20260101-000002-unmnt0", str(tmp_path / "unmounted" / "x"))
    links = tmp_path / "state" / "zlaunch" / "runs"
    real_stat = os.stat

    def stat_denied(path, *args, **kwargs):  # the root unreadable for a moment
        if str(path).startswith(str(tmp_path / "root")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_denied)
    assert run_index.indexed_run_paths() == []
    assert len(os.listdir(links)) == 3  # nothing forgotten on a transient error
    monkeypatch.setattr(os, "stat", real_stat)
    assert run_index.indexed_run_paths() == [str(tmp_path / "root" / "20260101-000000-aaaaaa")]
    assert sorted(os.listdir(links)) == ["20260101-000000-aaaaaa", "20260101-000002-unmnt0"]


def test_a_link_removed_while_listing_is_skipped(tmp_path, monkeypatch):
    from zlaunch.rundir import index as run_index

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _run(tmp_path / "root", "20260101-000000-aaaaaa", {})
    run_index.register("20260101-000000-aaaaaa", str(tmp_path / "root" / "20260101-000000-aaaaaa"))

    def raced(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "readlink", raced)
    assert run_index.indexed_run_paths() == []


# ---- item 10: rank discovery and the Slurm hostlist -------------------------------------------

ENV_WORLD = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
SLURM = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
         "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_NUM_TASKS": "2"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({**ENV_WORLD, "MASTER_PORT": "0"}, "MASTER_PORT must be a TCP port (1-65535), got 0"),
        ({**ENV_WORLD, "MASTER_PORT": "-1"}, "MASTER_PORT must be a TCP port"),
        ({**ENV_WORLD, "MASTER_PORT": "99999"}, "MASTER_PORT must be a TCP port"),
        ({**ENV_WORLD, "LOCAL_RANK": "-1"}, "LOCAL_RANK must be 0 or more, got -1"),
        ({**ENV_WORLD, "RANK": "²"}, "RANK must be an integer"),
        ({**ENV_WORLD, "RANK": "9" * 5000}, "RANK must be an integer"),
        ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "-3"}, "must be 0 or more"),
        ({**SLURM, "SLURM_STEP_ID": "0", "SLURM_LOCALID": "-1"}, "SLURM_LOCALID must be 0 or more"),
    ],
)
def test_rank_discovery_refuses_impossible_values_by_name(env, words):
    from runtime.distributed.launch_env import DistInitError, discover_world

    with pytest.raises(DistInitError, match=re.escape(words)):
        discover_world(env)


def test_a_blank_master_port_with_open_mpi_is_unset_and_a_named_step_is_step_0():
    from runtime.distributed.launch_env import DEFAULT_PORT, discover_world, slurm_port

    assert discover_world({**OPENMPI, "MASTER_PORT": " "}).master_port == DEFAULT_PORT
    world = discover_world({**SLURM, "SLURM_STEP_ID": "²", "MASTER_ADDR": "n1"})
    assert world.master_port == slurm_port(5, 0)


@pytest.mark.parametrize(
    ("hostlist", "words"),
    [
        ("n[" + "9" * 4400 + "]", "has more than 18 digits"),
        ("n[1-" + "9" * 30 + "]", "has more than 18 digits"),
        ("n[1-2]" + "x" * 4300, "makes host names of 4302 characters (at most 255)"),
    ],
)
def test_the_hostlist_bounds_numbers_and_name_lengths(hostlist, words):
    from zlaunch.wire.hostlist import HostlistError, expand

    with pytest.raises(HostlistError, match=re.escape(words)):
        expand(hostlist)


def test_allocation_hosts_says_a_bad_hostlist_as_a_usage_error():
    from zlaunch.errors import UsageError
    from zlaunch.transport.slurm import allocation_hosts

    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[" + "9" * 4400 + "]"}
    with pytest.raises(UsageError, match="SLURM_JOB_NODELIST"):
        allocation_hosts(env)


@pytest.mark.parametrize(
    "fields,named",
    [({"statsu": "running"}, "statsu is not a field of run.json"),
     ({"exit_code": "1"}, "exit_code is not an exit code"),
     ({"hosts": ["a", 1]}, "hosts is not a list of host names")],
)  # fmt: skip
def test_the_writer_refuses_a_run_json_field_its_readers_would_drop(tmp_path, fields, named):
    from zlaunch.rundir.layout import RunDir

    run = RunDir.create(str(tmp_path / "runs"), "20260101-000000-aaaaaa", {"cwd": "/w"})
    before = (tmp_path / "runs" / "20260101-000000-aaaaaa" / "run.json").read_bytes()
    with pytest.raises(ValueError, match=named):
        run.update(**fields)
    # nothing was written: the file is the one before the refused update
    assert (tmp_path / "runs" / "20260101-000000-aaaaaa" / "run.json").read_bytes() == before
    assert run.update(exit_code=1, warnings=[{"attempt": 0, "text": "w"}])["exit_code"] == 1
    with pytest.raises(ValueError, match="warnings is not"):
        run.update(warnings=["w"])
