"""Unit tier for the DeepSpeed API: which runtime serves it, the config check of Hugging Face
configs ("auto"), and the compatibility package's modules (no subprocess, no process group).

The compatibility package is imported here as ``runtime.deepspeed_api.deepspeed``: the same
files the workers import as ``deepspeed``, without shadowing a DeepSpeed in this process.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import pathlib

import pytest
import torch

from runtime.config import auto_keys
from zlaunch.commands.run_options import (
    build_options,
    find_config_in_args,
    validate_config,
)
from zlaunch.errors import ConfigError, UsageError
from zlaunch.job.deepspeed_api import DeepSpeedApi, Installed, choose, worker_pythonpath
from zlaunch.job.plan import build_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIGS = os.path.join(ROOT, "examples", "configs")

COMPAT = "runtime.deepspeed_api.deepspeed"
REAL = Installed("0.19.8", "/site-packages/deepspeed")


# ---------------------------------------------------------------- which runtime serves the API
@pytest.mark.parametrize(
    "requested, installed, kind, shadowed",
    [
        ("auto", None, "bundled", None),
        ("auto", REAL, "deepspeed", None),
        ("bundled", None, "bundled", None),
        ("bundled", REAL, "bundled", REAL),
        ("deepspeed", REAL, "deepspeed", None),
    ],
)
def test_choose_table(requested, installed, kind, shadowed):
    api = choose(requested, installed, "/compat")
    assert (api.kind, api.shadowed) == (kind, shadowed)
    assert api.path == ("/compat" if kind == "bundled" else None)


def test_start_line_names_the_runtime_and_a_shadowed_deepspeed():
    assert choose("auto", REAL, "/c").describe() == (
        "DeepSpeed API: installed DeepSpeed 0.19.8 (/site-packages/deepspeed)"
    )
    assert choose("auto", None, "/c").describe() == (
        "DeepSpeed API: zlaunch's bundled runtime (no deepspeed package in the job's Python)"
    )
    shadowing = choose("bundled", REAL, "/c").describe()
    assert "--runtime bundled" in shadowing and "DeepSpeed 0.19.8 is not used" in shadowing


def test_runtime_deepspeed_without_deepspeed_is_a_usage_error():
    with pytest.raises(UsageError, match="--runtime deepspeed: the job's Python has no deepspeed"):
        choose("deepspeed", None, "/c")
    with pytest.raises(UsageError, match="--runtime must be one of auto, bundled, deepspeed"):
        choose("fast", None, "/c")


def test_worker_pythonpath_puts_the_bundled_directory_first_once():
    bundled = DeepSpeedApi("bundled", path="/c")
    assert worker_pythonpath(bundled, None) == "/c"
    assert worker_pythonpath(bundled, f"/a{os.pathsep}/c{os.pathsep}/b") == os.pathsep.join(
        ["/c", "/a", "/b"]
    )
    real = DeepSpeedApi("deepspeed", installed=REAL)
    assert worker_pythonpath(real, "/a") == "/a"
    assert worker_pythonpath(real, None) is None
    # A PYTHONPATH naming the bundled directory would shadow the DeepSpeed the start line names.
    from runtime.deepspeed_api import PATH

    assert worker_pythonpath(real, os.pathsep.join([PATH, "/a"])) == "/a"


def test_the_installed_deepspeed_is_found_without_a_process(monkeypatch, tmp_path):
    """zlaunch's own interpreter is searched in this process (the unit tier refuses a
    subprocess), with the workers' PYTHONPATH; the bundled directory on it is not a DeepSpeed."""
    import sys

    from runtime.deepspeed_api import PATH
    from zlaunch.job.deepspeed_api import find_installed

    monkeypatch.setattr(sys, "path", [sys.path[0]])  # no site-packages: nothing to find
    assert find_installed(sys.executable, {"PYTHONPATH": PATH}) is None
    # A DeepSpeed on the workers' PYTHONPATH, behind the bundled directory, is found.
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "__init__.py").write_text("")
    (tmp_path / "deepspeed-9.9.9.dist-info").mkdir()
    (tmp_path / "deepspeed-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: deepspeed\nVersion: 9.9.9\n"
    )
    found = find_installed(sys.executable, {"PYTHONPATH": os.pathsep.join([PATH, str(tmp_path)])})
    assert found == Installed("9.9.9", str(tmp_path / "deepspeed"))


def test_bundled_runtime_reaches_the_workers_pythonpath(tmp_path, monkeypatch):
    import zlaunch.job.deepspeed_api
    from runtime.deepspeed_api import PATH

    # The job's interpreter is asked in a subprocess for this PYTHONPATH: answer here instead.
    monkeypatch.setattr(zlaunch.job, "find_installed", lambda python, environ: REAL)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": "/mine"}
    options = build_options(
        script="train.py", script_args=[], runtime="bundled", environ=environ, home=str(tmp_path)
    )
    plan = build_plan(
        options, options.hosts, master_addr="localhost", master_port=1, run_id="r", attempt=0
    )
    paths = {w.env["PYTHONPATH"] for node in plan.nodes for w in node.workers}
    assert paths == {os.pathsep.join([PATH, "/mine"])}
    assert options.deepspeed_api.kind == "bundled" and options.deepspeed_api.shadowed == REAL


# ---------------------------------------------------------------- the config check, "auto"
@pytest.mark.parametrize(
    "args, found",
    [
        (["--deepspeed", "ds.json"], "ds.json"),
        (["--deepspeed=conf/ds.YAML", "--lr", "1"], "conf/ds.YAML"),
        (["--deepspeed", "--deepspeed_config", "x.json"], "x.json"),  # DeepSpeed's flag
        (["--deepspeed", "--lr", "1"], None),
        (["--", "--deepspeed", "ds.json"], None),
    ],
)
def test_hugging_face_deepspeed_argument_names_the_config(args, found):
    assert find_config_in_args(args) == found


def test_auto_keys_in_file_order():
    raw = {"a": "auto", "b": {"c": 1, "d": "auto"}, "e": [1], "f": {"g": {"h": "auto"}}}
    assert auto_keys(raw) == ["a", "b.d", "f.g.h"]


def test_hugging_face_config_passes_with_one_note(capsys):
    validate_config(os.path.join(CONFIGS, "hf_zero3.json"), world_size=2)
    err = capsys.readouterr().err
    assert "warning" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: ")
    assert '"auto" (train_batch_size, train_micro_batch_size_per_gpu,' in lines[0]
    assert (
        "zero_optimization.stage3_param_persistence_threshold), with the scheduler block that "
        "needs them, are left to the script" in lines[0]
    )


def test_auto_config_is_still_checked(tmp_path):
    data = json.load(open(os.path.join(CONFIGS, "hf_zero2.json")))
    data["zero_optimization"]["reduce_bucket_sise"] = 5
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"zero_optimization.reduce_bucket_sise is not a valid"):
        validate_config(str(path), world_size=2)
    # Numbers given for the whole batch triple are checked against the world size as before.
    data = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 3,
    }
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="train_batch_size 8 must equal"):
        validate_config(str(path), world_size=2)


# ---------------------------------------------------------------- the compatibility package
def test_distribution_metadata_is_deepspeed_0_19_8():
    from runtime.deepspeed_api import PATH, VERSION, is_bundled_deepspeed

    dist = importlib.metadata.PathDistribution(pathlib.Path(PATH, f"deepspeed-{VERSION}.dist-info"))
    assert (dist.metadata["Name"], dist.version) == ("deepspeed", "0.19.8")
    assert dist.read_text("top_level.txt").split() == ["deepspeed"]
    compat = importlib.import_module(COMPAT)
    assert compat.__version__ == VERSION
    assert is_bundled_deepspeed(os.path.join(PATH, "deepspeed", "__init__.py"))
    assert not is_bundled_deepspeed("/site-packages/deepspeed/__init__.py")


def test_modules_map_to_the_runtime():
    import runtime.activation_checkpointing
    import runtime.dist
    from runtime.engine.engine import Engine
    from runtime.zero import GatheredParameters, Init

    ds = importlib.import_module(COMPAT)
    assert ds.zero.Init is Init and ds.zero.GatheredParameters is GatheredParameters
    assert ds.comm.get_rank is runtime.dist.get_rank
    assert ds.checkpointing.checkpoint is runtime.activation_checkpointing.checkpoint
    assert issubclass(ds.DeepSpeedEngine, Engine)
    assert ds.runtime.engine.DeepSpeedEngine is ds.DeepSpeedEngine
    assert sorted(ds.runtime.lr_schedules.VALID_LR_SCHEDULES) == [
        "LRRangeTest", "OneCycle", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR",
    ]  # fmt: skip
    assert ds.accelerator.get_accelerator().communication_backend_name() in ("gloo", "nccl")


def test_what_the_runtime_lacks_is_named():
    ds = importlib.import_module(COMPAT)
    missing = importlib.import_module(f"{COMPAT}._missing").NotInBundledRuntime
    with pytest.raises(missing, match=r"deepspeed.tp_model_init is not provided by zlaunch's"):
        _ = ds.tp_model_init
    with pytest.raises(
        missing, match=r"deepspeed.ops.adagrad.DeepSpeedCPUAdagrad .*--runtime deepspeed"
    ):
        exec(f"from {COMPAT}.ops.adagrad import DeepSpeedCPUAdagrad")
    with pytest.raises(missing, match=r"deepspeed.utils.groups"):
        exec(f"from {COMPAT}.utils import groups")
    with pytest.raises(AttributeError):  # import machinery's probes stay plain
        _ = ds.__wrapped__


@pytest.mark.parametrize(
    "name, mode_key", [("DeepSpeedCPUAdam", "adamw_mode"), ("FusedAdam", "adam_w_mode")]
)
def test_deepspeed_adam_classes_step_as_torch_adam(name, mode_key):
    cls = getattr(importlib.import_module(f"{COMPAT}.ops.adam"), name)
    for decoupled, reference in ((True, torch.optim.AdamW), (False, torch.optim.Adam)):
        torch.manual_seed(0)
        a = torch.nn.Parameter(torch.randn(5))
        b = torch.nn.Parameter(a.detach().clone())
        kwargs = dict(lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.3)
        ours = cls([a], **kwargs, **{mode_key: decoupled})
        theirs = reference([b], **kwargs)
        assert type(ours) in (cls, torch.optim.Adam)
        for _ in range(3):
            for p, opt in ((a, ours), (b, theirs)):
                p.grad = torch.arange(5.0) - p.detach()
                opt.step()
        assert torch.equal(a, b)
    with pytest.raises(NotImplementedError, match="bias_correction=False"):
        cls([torch.nn.Parameter(torch.zeros(1))], bias_correction=False)


def test_engine_config_reads_as_the_deepspeed_mapping():
    from runtime.config import load_config

    config = load_config(
        {"train_batch_size": 8, "steps_per_print": float("inf"), "zero_optimization": {"stage": 3}}
    )
    assert config.steps_per_print is None  # accelerate's "never print"
    assert config.get("zero_optimization", {}).get("stage") == 3
    assert config.get("tensor_parallel", {}) == {}
    config.get("zero_optimization")["stage"] = 1  # a copy
    assert config.get("zero_optimization") == {"stage": 3}


def test_zero_init_reads_only_zero_optimization_of_a_config_still_holding_auto():
    """transformers builds the model under zero.Init before the Trainer has filled the
    scheduler's "auto" values; Init needs only offload_param from the config."""
    from runtime.zero import Init

    with open(os.path.join(CONFIGS, "hf_zero3.json")) as f:
        data = json.load(f)
    assert Init(config_dict_or_path=data)._remote is None
    assert Init(config_dict_or_path=os.path.join(CONFIGS, "hf_zero3.json"))._remote is None
    data["zero_optimization"]["offload_param"] = {"device": "cpu"}
    assert Init(config_dict_or_path=data)._remote == "cpu"
