"""`zlaunch estimate`: model-state memory per GPU and per node's CPU, per ZeRO stage and offload.

Runs without torch when given --params (or a .safetensors --model-file); --model builds the
model from a factory and counts its parameters, which needs torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys

import click

from zlaunch.errors import ConfigError, UsageError

__all__ = ["command", "parse_count"]

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """A parameter count: 1500000000, 1.5e9, 1.5B, 350M, 7b."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", text)
    if not match:
        raise UsageError(
            f"--params {text!r} is not a number", hint="write it like 1.5e9, 1500000000 or 1.5B"
        )
    value = float(match.group(1)) * _SUFFIXES[match.group(2).lower()]
    if value < 1:
        raise UsageError(f"--params must be at least 1, got {text!r}")
    return round(value)


def _load_factory(spec: str):
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise UsageError(
            f"--model {spec!r} is not MODULE:FUNCTION",
            hint="e.g. --model examples.gpt:build_model or --model path/to/file.py:make",
        )
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise UsageError(f"--model: no such file {module_name!r}")
            name = "_zlaunch_model_factory"
            loaded = importlib.util.spec_from_file_location(name, module_name)
            module = importlib.util.module_from_spec(loaded)
            sys.modules[name] = module  # dataclasses and pickling look the module up there
            sys.path.insert(0, os.path.dirname(os.path.abspath(module_name)))
            loaded.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except ImportError as err:
        raise UsageError(f"--model: cannot import {module_name!r}: {err}") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise UsageError(f"--model: {module_name!r} has no function {function_name!r}")
    return factory


def _count_model(spec: str) -> int:
    factory = _load_factory(spec)
    try:
        model = factory()
    except Exception as err:  # the user's code: report it, whatever it raised
        raise UsageError(
            f"--model {spec!r} failed: {type(err).__name__}: {err}",
            hint="the factory is called with no arguments and must return a torch module",
        ) from None
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        raise UsageError(f"--model {spec!r} returned {type(model).__name__}, not a torch module")
    return sum(p.numel() for p in parameters())


def _count_weights_file(path: str) -> int:
    from runtime.zero import count_safetensors_parameters

    if path.endswith(".safetensors"):
        try:
            return count_safetensors_parameters(path)
        except (OSError, ValueError) as err:
            raise UsageError(f"--model-file: {err}") from None
    try:
        import torch
    except ImportError:
        raise UsageError(
            f"--model-file {path!r} needs torch to read; a .safetensors file or --params does not"
        ) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a file it cannot read
        raise UsageError(f"--model-file {path!r} cannot be read by torch.load: {err}") from None
    seen: set[tuple[int, int, int]] = set()
    total = 0
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            key = (item.untyped_storage().data_ptr(), item.storage_offset(), item.numel())
            if key not in seen:  # tied weights count once
                seen.add(key)
                total += item.numel()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    if total == 0:
        raise UsageError(f"--model-file {path!r} holds no tensors")
    return total


def _gb(value: float) -> str:
    """Decimal units (GB = 10^9 bytes), GB from 1 GB up, MB or kB below."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def _human(count: int) -> str:
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= size:
            return f"{count / size:.2f}{unit}"
    return str(count)


@click.command(
    "estimate",
    help=(
        "Model-state memory per GPU and per node's CPU for every ZeRO stage and offload choice "
        "(Adam; GB = 10^9 bytes). Give the size with --params, --model-file or --model."
    ),
)
@click.option("--params", "params_text", metavar="N", help="Parameter count: 1.5e9, 1.5B, 350M.")
@click.option(
    "--model-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Count the tensors of a weights file (.safetensors without torch; .pt/.bin with torch).",
)
@click.option(
    "--model",
    "factory",
    metavar="MODULE:FUNCTION",
    help="Build the model with this no-argument factory and count its parameters (needs torch). "
    "MODULE may be a path to a .py file.",
)
@click.option(
    "--nodes",
    "--num-nodes",
    "--num_nodes",
    "--nnodes",
    "nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Nodes the job runs on (the CPU figures are per node).",
)
@click.option(
    "--gpus-per-node",
    "--num-gpus",
    "--num_gpus",
    "--nproc-per-node",
    "--nproc_per_node",
    "gpus_per_node",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPUs (ranks) per node: the data-parallel world is nodes x this.",
)
@click.option(
    "--precision",
    type=click.Choice(["fp16", "bf16", "fp32"]),
    help="Training precision. Default: the --config's, else fp16.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Take the precision and bucket sizes from this DeepSpeed config.",
)
@click.option("--hidden-size", type=click.IntRange(min=1), help='Resolves "auto" bucket sizes.')
@click.option(
    "--buffers/--no-buffers",
    default=True,
    show_default=True,
    help="Add the static communication buckets per GPU.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON, in bytes.")
@click.option("--no-color", is_flag=True, help="Plain table.")
def command(
    params_text: str | None,
    model_file: str | None,
    factory: str | None,
    nodes: int,
    gpus_per_node: int,
    precision: str | None,
    config_path: str | None,
    hidden_size: int | None,
    buffers: bool,
    as_json: bool,
    no_color: bool,
) -> None:
    from runtime.zero import estimate_all

    params = _parameter_count(params_text, model_file, factory)
    sizes, precision = _config_settings(config_path, hidden_size, precision)
    rows = estimate_all(params, nodes, gpus_per_node, precision, sizes, buffers=buffers)
    if as_json:
        _print_json(params, nodes, gpus_per_node, precision, rows)
    else:
        _print_table(params, nodes, gpus_per_node, precision, rows, no_color)


def _parameter_count(params_text: str | None, model_file: str | None, factory: str | None) -> int:
    """The count from exactly one of --params, --model-file and --model."""
    given = [x for x in (params_text, model_file, factory) if x is not None]
    if len(given) != 1:
        raise UsageError(
            "give exactly one of --params, --model-file or --model",
            hint="e.g. zlaunch estimate --params 1.5e9 --nodes 2 --gpus-per-node 8",
        )
    if params_text is not None:
        return parse_count(params_text)
    if model_file is not None:
        return _count_weights_file(model_file)
    return _count_model(factory)


def _config_settings(config_path: str | None, hidden_size: int | None, precision: str | None):
    """The bucket sizes (None: the defaults) and the precision: --precision, else the
    --config's, else fp16."""
    if config_path is None:
        return None, precision or "fp16"
    from runtime.config import ConfigError as RuntimeConfigError
    from runtime.config import load_config
    from runtime.zero import BufferSizes

    try:
        config = load_config(config_path)
    except RuntimeConfigError as err:
        raise ConfigError(str(err)) from None
    return BufferSizes.from_config(config, hidden_size), precision or config.precision


def _print_json(params: int, nodes: int, gpus_per_node: int, precision: str, rows) -> None:
    """--json: the rows in bytes."""
    payload = {
        "params": params,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "precision": precision,
        "rows": [
            {
                "stage": r.stage,
                "offload": r.offload,
                "gpu_model_states_bytes": r.gpu_model_states,
                "gpu_buffers_bytes": r.gpu_buffers,
                "gpu_total_bytes": r.gpu_total,
                "cpu_per_node_bytes": r.cpu_per_node,
            }
            for r in rows
        ],
    }
    click.echo(json.dumps(payload, indent=2))


def _print_table(
    params: int, nodes: int, gpus_per_node: int, precision: str, rows, no_color: bool
) -> None:
    from zlaunch.console import print_table

    kind = "fp32" if precision == "fp32" else f"{precision} mixed precision"
    title = (
        f"Model states for {_human(params)} parameters ({params:,}) on {nodes} node(s) x "
        f"{gpus_per_node} GPU(s), {kind}, Adam (GB = 10^9 bytes, MB = 10^6)"
    )
    columns = ["stage", "offload", "model states/GPU", "buffers/GPU", "total/GPU", "CPU/node"]
    table = [
        [
            str(r.stage),
            r.offload,
            _gb(r.gpu_model_states),
            _gb(r.gpu_buffers),
            _gb(r.gpu_total),
            _gb(r.cpu_per_node),
        ]
        for r in rows
    ]
    print_table(title, columns, table, color=False if no_color else None)
