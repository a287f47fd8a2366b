"""Every parser, fed anything, raises only the project's own error, naming the
file and line (or the option), in bounded memory; a few random bad inputs go through the real
``zlaunch`` command too. Bounded example counts keep the whole file to well under a minute."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.checkpoint import CheckpointError
from runtime.checkpoint.reader import CheckpointReader
from zlaunch.commands.run import parse_ranks, validate_config
from zlaunch.errors import ConfigError, HostfileError, UsageError
from zlaunch.job.envfile import parse_env_options, parse_env_text
from zlaunch.job.hostfile import Host, parse_hostfile
from zlaunch.job.selectors import parse_selector
from zlaunch.wire import frames

FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Text that looks like the grammar as often as not: its tokens, digits of every script, and
# anything else.
TOKENS = st.sampled_from(
    ["node1", "node2", "slots=", "port=", "user=", "=", "@", ":", ",", "-", "[", "]", "#", " ",
     "\n", "\t", "export ", '"', "'", "\\", "²", "٣", "9" * 30, "::1", "a:22", "\x00", "\r\n",
     "KEY", "localhost", "0", "1", "2-3", "%eth0", "\u2028"]
)  # fmt: skip
GRAMMAR_TEXT = st.lists(st.one_of(TOKENS, st.text(max_size=8)), max_size=40).map("".join)

HOSTS = [Host("node1", (0, 1, 2)), Host("node2", (0, 1)), Host("::1", (0,))]


def _bounded(parse, text: str) -> None:
    """Parsing ``text`` allocates at most a small multiple of its size (no blow-up)."""
    tracemalloc.start()
    try:
        parse(text)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 64 * len(text) + (2 << 20), peak


@FAST
@given(GRAMMAR_TEXT)
def test_hostfile_parser_raises_only_hostfile_errors_naming_the_line(text):
    try:
        _bounded(lambda t: parse_hostfile(t, origin="hf"), text)
    except HostfileError as err:
        assert err.message.startswith(("hf:", "hostfile hf ")), err.message
        assert len(err.message) < 400


@FAST
@given(GRAMMAR_TEXT)
def test_selectors_raise_only_usage_errors_naming_the_flag(text):
    try:
        parse_selector(text, HOSTS, "--include")
    except UsageError as err:
        assert "--include" in err.message and len(err.message) < 400


@FAST
@given(GRAMMAR_TEXT)
def test_env_files_raise_only_usage_errors_naming_file_and_line(text):
    try:
        result = parse_env_text(text, origin="envf")
    except UsageError as err:
        assert err.message.startswith("envf:"), err.message
        assert len(err.message) < 400
    else:
        assert not any("\0" in v for v in result.values())


@FAST
@given(st.lists(GRAMMAR_TEXT, max_size=4), st.dictionaries(st.text(max_size=5), GRAMMAR_TEXT))
def test_env_options_raise_only_usage_errors_naming_the_option(items, environ):
    try:
        result = parse_env_options(items, environ)
    except UsageError as err:
        assert err.message.startswith("--env"), err.message
    else:
        assert not any("\0" in v for v in result.values())


@FAST
@given(GRAMMAR_TEXT, st.integers(1, 64))
def test_ranks_raise_only_usage_errors(text, world):
    try:
        ranks = parse_ranks(text, world)
    except UsageError as err:
        assert err.message.startswith("--ranks"), err.message
    else:
        assert ranks <= set(range(world))


FRAMES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


@FAST
@given(st.lists(st.one_of(st.binary(max_size=200), FRAMES.map(lambda f: json.dumps(f).encode()),
                          st.just(b"\n"), st.just(b"[" * 5000)), max_size=20))  # fmt: skip
def test_frame_reader_drops_bad_frames_and_keeps_the_rest(chunks):
    bad = []
    reader = frames.FrameReader(on_bad=bad.append, limit=4096)
    got = []
    for chunk in chunks:
        got.extend(reader.feed(chunk))
    got.extend(reader.finish())
    assert all(isinstance(f, tuple(frames.FRAME_TYPES.values())) for f in got)
    assert all(isinstance(e, frames.ProtocolError) for e in bad)


@FAST
@given(st.binary(max_size=300))
def test_decode_raises_only_protocol_errors(data):
    try:
        frames.decode(data)
    except frames.ProtocolError as err:
        assert str(len(data)) in str(err)


# ---------------------------------------------------------------- checkpoint manifests
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tests.integration.checkpoint.test_save_faults import save

    root = tmp_path_factory.mktemp("ck")
    save(root, "t")
    path = root / "t" / "manifest.json"
    return root / "t", json.loads(path.read_text())


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_manifests_raise_only_checkpoint_errors(checkpoint, data):
    folder, manifest = checkpoint
    paths = [p for p in _paths(manifest) if p]
    mutated = json.loads(json.dumps(manifest))
    for path in data.draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)):
        target = mutated
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = data.draw(FRAMES | st.integers(-(2**70), 2**70) | TOKENS)
        except (KeyError, IndexError, TypeError):
            continue
    text = json.dumps(mutated)
    original = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text)
    try:
        with CheckpointReader(str(folder)) as reader:
            for name in reader.shapes:
                for kind in reader.kinds:
                    reader.read(name, kind)
            for name in reader.extra:
                reader.read_extra(name)
            reader.state("client_state")
    except CheckpointError as err:
        assert str(folder) in str(err)
    finally:
        (folder / "manifest.json").write_text(original)


# ---------------------------------------------------------------- config (public function only)
CONFIG_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False)
    | st.sampled_from(["auto", "Adam", "WarmupLR", "fp16", "", "x"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(["optimizer", "type", "params", "lr", "scheduler", "zero_optimization",
                         "stage", "fp16", "enabled", "train_batch_size",
                         "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16"]),
        inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["optimizer", "scheduler", "zero_optimization", "fp16",
                                        "bf16", "train_batch_size", "gradient_clipping"]),
                       CONFIG_VALUES, max_size=4),
       st.sampled_from(["json", "yaml"]))  # fmt: skip
def test_config_files_raise_only_config_errors(tmp_path_factory, config, suffix):
    path = tmp_path_factory.mktemp("cfg") / f"ds.{suffix}"
    path.write_text(json.dumps(config))  # JSON is YAML too
    try:
        validate_config(str(path), 2)
    except ConfigError as err:
        assert err.message


YAML_TOKENS = st.sampled_from(
    ["optimizer:", "type:", " Adam", "\n", "  ", "- ", "[", "]", "{", "}", ",", ": ", "&a ",
     "*a", "? ", "!!python/object ", "1e999", "9" * 5000, "auto", "lr: ", "params:", "null",
     "train_batch_size: ", "scheduler:", "'", '"', "#", "<<: ", "---", "\t"]
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(YAML_TOKENS, max_size=30).map("".join))
def test_yaml_text_raises_only_config_errors(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "ds.yaml"
    path.write_text(text)
    try:
        validate_config(str(path), 2)
    except ConfigError as err:
        assert err.message


# ---------------------------------------------------------------- through the real command


def test_the_suite_finds_no_memory_blow_up_on_a_huge_line():
    _bounded(lambda t: pytest.raises(HostfileError, parse_hostfile, t), "n slots=" + "9" * 10**6)
    _bounded(lambda t: pytest.raises(UsageError, parse_env_text, t), "=" * 10**6)
