"""Properties of every boundary a rank or a file crosses into the controller: what a rank
writes to its events fd, the fields of a metrics event, the run directory's records as every reader meets
them. Anything goes in; only the project's own outcomes come out (an event, a checked row, a
rendered command with its exit code), never an exception. Bounded example counts keep the
file to seconds."""

from __future__ import annotations

import contextlib
import io
import json
import math
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zlaunch.agent.events import parse_event
from zlaunch.cli import main
from zlaunch.rundir.run_record import RunRecordError, checked_run_record
from zlaunch.wire import events, frames
from zlaunch.wire.metrics_check import checked_metrics
from zlaunch.wire.metrics_format import breakdown_text, format_line

FAST = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["[red]", "abc", "", "engine", "user", "metrics"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
METRIC_KEYS = st.sampled_from(
    ["step", "samples", "total_steps", "loss", "lr", "loss_scale", "grad_norm", "skipped_steps",
     "step_time", "samples_per_s", "tokens_per_s", "memory_kind", "memory_bytes",
     "memory_peak_bytes", "comm_bytes", "world_size", "flops_per_step", "tflops", "mfu",
     "peak_tflops", "peak_source", "straggler", "report", "source", "time_forward",
     "time_backward", "time_step", "time_reduce_wait", "time_allgather_wait", "host", "rank"]
)  # fmt: skip


@FAST
@given(st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode())))
def test_any_events_line_becomes_typed_events_that_a_frame_carries(raw):
    found = parse_event(raw)
    assert found and all(isinstance(event, tuple(events.EVENT_TYPES.values())) for event in found)
    carried = frames.decode(frames.encode(frames.Event(0, found)))
    assert [type(event) for event in carried.events] == [type(event) for event in found]


@FAST
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", '{"a":']))
def test_events_nested_to_any_depth_become_invalid_events(depth, opener):
    (event,) = parse_event((opener * depth).encode())
    assert isinstance(event, events.Invalid)  # never an exception, whatever the depth


@FAST
@given(st.dictionaries(METRIC_KEYS, JSON, max_size=10), st.sampled_from(["engine", "user", None]))
def test_any_metrics_event_is_dropped_or_formats_in_every_view(fields, source):
    event = {"kind": "metrics", **fields}
    if source is not None:
        event["source"] = source
    verdict = checked_metrics(event)
    if verdict.row is None:
        assert verdict.problems
        return
    row = verdict.row
    format_line(row)
    format_line(row, "  ")
    breakdown_text(row)
    json.loads(json.dumps(row))  # metrics.jsonl round-trips it
    from zlaunch.console.job_view import JobView
    from zlaunch.console.live_panel import _metrics_grid, _progress

    view = JobView.__new__(JobView)
    view.latest, view.latest_at, view.started_at = row, None, 0.0
    view.eta()
    _metrics_grid(row)
    _progress(view, row)
    for key in ("memory_bytes", "comm_bytes", "step_time", "samples_per_s", "total_steps"):
        value = row.get(key)
        assert value is None or (not isinstance(value, str) and math.isfinite(value)), key


RUN_FIELDS = st.sampled_from(
    ["run_id", "status", "controller_pid", "controller", "start_time", "end_time", "exit_code",
     "error", "config", "cwd", "hosts", "program", "checkpoint_dir", "save_on", "plan",
     "attempts", "failures"]
)  # fmt: skip
PLANS = st.fixed_dictionaries(
    {"world_size": JSON, "nodes": st.lists(
        st.fixed_dictionaries({"host": JSON, "workers": st.lists(
            st.fixed_dictionaries({"rank": JSON, "local_rank": JSON, "argv": JSON}), max_size=2
        )}), max_size=2,
    )}
)  # fmt: skip
RUN_JSON = st.one_of(
    JSON, st.dictionaries(RUN_FIELDS, st.one_of(JSON, PLANS, st.just(1e20)), max_size=8)
)


@FAST
@given(RUN_JSON)
def test_a_run_record_is_checked_or_refused_as_a_whole(data):
    try:
        record, problems = checked_run_record(data, "20260101-000000-abcdef")
    except RunRecordError:
        assert not isinstance(data, dict)
        return
    assert record["run_id"] == "20260101-000000-abcdef"
    assert len(problems) <= len(data)


def _run_commands(root: str, run_id: str) -> str:
    """Every run command on the run; what ``ls`` printed."""
    listing = ""
    for command in (["ls"], ["status"], ["status", run_id, "--json"], ["stop", run_id],
                    ["stacks", run_id], ["logs", run_id]):  # fmt: skip
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                main([*command, "--log-dir", root])
        except SystemExit:
            pass  # the command's own ending, rendered: any other exception fails the test
        if command == ["ls"]:
            out.seek(0)
            listing = out.read()
    return listing


@settings(FAST, max_examples=50)
@given(RUN_JSON, st.one_of(st.none(), JSON), st.one_of(st.none(), JSON))
def test_every_run_command_survives_any_run_directory_records(
    tmp_path_factory, run_json, ranks_json, failure_json
):
    root = tmp_path_factory.mktemp("runs")
    run_id = "20260101-000000-abcdef"
    run = root / run_id
    run.mkdir(mode=0o700)
    (run / "run.json").write_text(json.dumps(run_json))
    for name, data in (("ranks.json", ranks_json), ("failure.json", failure_json)):
        if data is not None:
            (run / name).write_text(json.dumps(data))
    (run / "metrics.jsonl").write_text('{"kind":"metrics","step":1,"memory_bytes":NaN}\n')
    good = root / "20260101-000001-aaaaaa"  # a sound run beside it is still listed
    good.mkdir(mode=0o700)
    (good / "run.json").write_text(json.dumps({"status": "succeeded", "exit_code": 0}))
    listing = _run_commands(str(root), run_id)
    assert good.name in listing  # one bad run does not hide the others


# ---- manifests ---------------------------------------------------------------------------------

MANIFEST_PATHS = st.sampled_from(
    [("world_size",), ("params",), ("params", "a.weight"), ("params", "a.weight", "shape"),
     ("kinds",), ("kinds", "param"), ("shards",), ("shards", 0), ("shards", 0, "file"),
     ("shards", 0, "pieces"), ("shards", 0, "pieces", 0), ("shards", 1, "pieces", 0, 2),
     ("shards", 1, "extra"), ("shards", 2, "kinds"), ("rank_state",), ("rank_state", 0),
     ("client_state",), ("counters",), ("optimizer",)]
)  # fmt: skip
ARRAYS = st.fixed_dictionaries(
    {"__ndarray__": JSON, "dtype": st.sampled_from(["U200000000", "float32", "load", "int64"]),
     "shape": JSON}
)  # fmt: skip


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    from tests.unit.checkpoint.test_save_faults import save

    root = tmp_path_factory.mktemp("ckpt")
    save(root, "t")
    return root / "t"


@settings(FAST, max_examples=80)
@given(st.lists(st.tuples(MANIFEST_PATHS, st.one_of(JSON, ARRAYS)), min_size=1, max_size=3))
def test_any_manifest_is_read_within_its_declared_sizes_or_refused(saved_checkpoint, edits):
    from runtime.checkpoint import CheckpointError
    from runtime.checkpoint.reader import CheckpointReader
    from runtime.checkpoint.storage import MANIFEST

    original = (saved_checkpoint / MANIFEST).read_text()
    manifest = json.loads(original)
    for path, value in edits:
        target = manifest
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    (saved_checkpoint / MANIFEST).write_text(json.dumps(manifest))
    tracemalloc.start()
    try:
        with CheckpointReader(str(saved_checkpoint)) as reader:
            for name in list(reader.shapes):
                for kind in list(reader.kinds):
                    reader.read(name, kind)
            for key in ("client_state", "counters", "optimizer", "lr_scheduler"):
                reader.state(key)
            for rank in range(reader.world_size):
                reader.rank_state(rank)
    except CheckpointError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        (saved_checkpoint / MANIFEST).write_text(original)
    assert peak < 32 << 20, f"{peak} bytes for a checkpoint of a few hundred"
