"""torch.compile with ZeRO 0-3 on 2 gloo ranks: losses equal to the plain engine's, no
recompilation once warm, a bounded number of graphs and no graph break, and checkpoints of a
compiled engine that load into a plain one (no ``_orig_mod.`` in the keys).

The models are third-party code: a causal LM whose body is torch's `nn.TransformerEncoderLayer`
stack, and Hugging Face's `LlamaForCausalLM` built from a tiny config. Each world is started
once and trains every case in turn (the plain run, then the compiled one, at stages 0-3).
``aot_eager`` compiles the graphs without code generation (the losses must match the plain run
to float rounding); one run uses ``inductor``, whose fused kernels round differently.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.engine.mp_utils import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

HERE = "tests/integration/engine/test_torch_compile.py"
STEPS, MICRO, SEQ, VOCAB, WIDTH = 5, 2, 8, 64, 32
COUNTED_STAGE = 3
"""The stage whose compiled run also counts FLOPs for MFU (`ZLAUNCH_MFU=1`): its step 1 runs
eagerly under the counter and step 2 compiles; the other stages compile at step 1."""


class EncoderLM(torch.nn.Module):
    """Embeddings, torch's TransformerEncoderLayer stack (2 layers), a head and the loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        layer = torch.nn.TransformerEncoderLayer(
            WIDTH, 4, 2 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, inputs, targets):
        h = self.body(self.embed(inputs), mask=self.mask, is_causal=True)
        return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def llama():
    import transformers

    torch.manual_seed(12)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return transformers.LlamaForCausalLM(config)


MODELS = {"encoder": EncoderLM, "llama": llama}


def _loss(model_name, engine, inputs, targets):
    if model_name == "llama":
        return engine(input_ids=inputs, labels=targets).loss
    return engine(inputs, targets)


def _config(stage: int, compile_block: dict | None) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if compile_block is not None:
        cfg["compile"] = compile_block
    return cfg


def train(
    model_name: str,
    stage: int,
    compile_block: dict | None,
    call_compile: dict | None,
    count_flops: bool = False,
):
    """One engine's run: losses, the compile counters after every step, state-dict keys."""
    import os

    import runtime
    from runtime.engine.torch_compile import CompileCounts

    if count_flops:
        os.environ["ZLAUNCH_MFU"] = "1"
    try:
        engine, *_ = runtime.initialize(
            model=MODELS[model_name](), config=_config(stage, compile_block)
        )
    finally:
        os.environ.pop("ZLAUNCH_MFU", None)
    if call_compile is not None:
        engine.compile(**call_compile)
    # Dynamo's cache outlives an engine: a model class compiled by an earlier case of this
    # process would run from it, unseen by the counters.
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(100 + engine.global_rank)
    losses, counts = [], []
    before = CompileCounts.now()
    tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)  # learnt by heart
    for _ in range(STEPS):
        loss = _loss(model_name, engine, tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        now = CompileCounts.now()
        counts.append(
            (
                now.graphs - before.graphs,
                now.graph_breaks - before.graph_breaks,
                now.frames - before.frames,
            )
        )
    regions = engine._compiled.regions if engine.is_compiled else None
    return {
        "losses": losses,
        "counts": counts,
        "is_compiled": engine.is_compiled,
        "regions": regions,
        "keys": sorted(engine.module.state_dict()),
        "flops_per_step": engine.insight.flops_per_step,
        "engine": engine,
    }


def parity_runs(model_name: str, backend: str) -> dict:
    """Every stage, plain and compiled (config block at stages 0-2, engine.compile() at 3)."""
    out = {}
    for stage in (0, 1, 2, 3):
        plain = train(model_name, stage, None, None)
        if stage == COUNTED_STAGE:
            compiled = train(model_name, stage, None, {"backend": backend}, count_flops=True)
        else:
            compiled = train(model_name, stage, {"enabled": True, "backend": backend}, None)
        for run in (plain, compiled):
            run.pop("engine")
        out[stage] = (plain, compiled)
    return out


def checkpoint_round_trip(directory: str) -> dict:
    """A compiled stage-3 engine saves; a plain stage-2 engine loads it and trains on."""
    import runtime

    run = train("encoder", 3, {"enabled": True, "backend": "aot_eager"}, None)
    engine = run.pop("engine")
    engine.save_checkpoint(directory, tag="t")
    full = {k: v.detach().clone() for k, v in _full_state(engine).items()}
    plain, *_ = runtime.initialize(model=EncoderLM(), config=_config(2, None))
    plain.load_checkpoint(directory, tag="t")
    loaded = {k: v.detach().clone() for k, v in plain.module.state_dict().items()}
    return {"keys": run["keys"], "full": full, "loaded": loaded}


def _full_state(engine):
    from runtime.zero import GatheredParameters

    with GatheredParameters(list(engine.module.parameters())):
        return {k: v.clone() for k, v in engine.module.state_dict().items()}


def _assert_parity(results, rtol):
    for stage, (plain, compiled) in results.items():
        assert not plain["is_compiled"] and compiled["is_compiled"], stage
        for s, (a, b) in enumerate(zip(plain["losses"], compiled["losses"], strict=True)):
            assert abs(a - b) <= rtol * abs(a), (stage, s, a, b)
        assert plain["losses"][-1] < plain["losses"][0], stage  # it trains
        assert compiled["keys"] == plain["keys"], stage
        assert not any("_orig_mod" in k for k in compiled["keys"])


def _assert_warm_counts(results, max_graphs, counted_stage: int | None = COUNTED_STAGE):
    for stage, (plain, compiled) in results.items():
        assert plain["counts"][-1] == (0, 0, 0), stage  # nothing compiles without compile
        graphs, breaks, frames = compiled["counts"][-1]
        # Compiled at step 1, nothing new after; where FLOPs are counted for MFU step 1 runs
        # eagerly under torch's counter (which sees eager ops only) and step 2 compiles.
        warm = 2 if stage == counted_stage else 1
        if stage == counted_stage:
            assert compiled["counts"][0] == (0, 0, 0), (stage, compiled["counts"])
            assert compiled["flops_per_step"] > 0 and plain["flops_per_step"] is None
        else:
            assert compiled["flops_per_step"] is None
        assert compiled["counts"][warm - 1] == compiled["counts"][-1], (stage, compiled["counts"])
        assert breaks == 0, (stage, compiled["counts"])
        assert 1 <= graphs <= max_graphs[stage], (stage, compiled["counts"])


@pytest.fixture(scope="module")
def encoder_results():
    return run_ranks(2, f"{HERE}:parity_runs", {"model_name": "encoder", "backend": "aot_eager"})


@pytest.fixture(scope="module")
def llama_results():
    return run_ranks(
        2, f"{HERE}:parity_runs", {"model_name": "llama", "backend": "aot_eager"}, timeout=600
    )


def test_encoder_losses_equal_eager_at_every_stage(encoder_results):
    for rank_results in encoder_results:
        _assert_parity(rank_results, rtol=1e-6)


def test_encoder_compiles_once_without_graph_breaks(encoder_results):
    results = encoder_results[0]
    # stages 0-2: the whole model, one graph; stage 3: each encoder layer on its own (the
    # embedding and the head run eagerly), both layers from one graph
    _assert_warm_counts(results, {0: 1, 1: 1, 2: 1, 3: 1})
    for stage in (0, 1, 2):
        assert results[stage][1]["regions"] == [""]
    assert results[3][1]["regions"] == ["body.layers.0", "body.layers.1"]


def test_llama_losses_equal_eager_at_every_stage(llama_results):
    for rank_results in llama_results:
        _assert_parity(rank_results, rtol=1e-6)


def test_llama_compiles_once_without_graph_breaks(llama_results):
    results = llama_results[0]
    # Stage 3: the config keeps use_cache at its default (true), so each layer writes its own
    # KV-cache slot and compiles its own graph (the engine warns); one graph per layer at most.
    _assert_warm_counts(results, {0: 1, 1: 1, 2: 1, 3: 2})
    assert results[3][1]["regions"] == ["model.layers.0", "model.layers.1"]


def test_checkpoint_of_compiled_engine_loads_into_plain_engine(tmp_path):
    results = run_ranks(2, f"{HERE}:checkpoint_round_trip", {"directory": str(tmp_path)})
    for r in results:
        assert not any("_orig_mod" in k for k in r["keys"])
        assert r["full"].keys() == r["loaded"].keys()
        for k, v in r["full"].items():
            torch.testing.assert_close(r["loaded"][k], v, rtol=0, atol=0)


def inductor_runs() -> dict:
    """Stage 3 plain, then compiled with inductor (code generated and built on the CPU)."""
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1  # no pool of compile workers per rank
    plain = train("encoder", 3, None, None)
    compiled = train("encoder", 3, {"enabled": True, "backend": "inductor"}, None)
    for run in (plain, compiled):
        run.pop("engine")
    return {3: (plain, compiled)}


def test_inductor_at_stage3_matches_eager_to_rounding():
    results = run_ranks(2, f"{HERE}:inductor_runs", timeout=900)
    for rank_results in results:
        _assert_parity(rank_results, rtol=1e-5)  # fused kernels round differently
    _assert_warm_counts(results[0], {3: 1}, counted_stage=None)


def compile_call_errors() -> dict:
    """engine.compile()'s refusals, each before anything compiles, then a call that works."""
    import runtime
    from runtime.errors import UserError

    engine, *_ = runtime.initialize(model=EncoderLM(), config=_config(2, None))
    messages = []
    for kwargs in (
        {"schedule": [(0, ["prefetch"])]},
        {"compiled_autograd_enabled": True},
        {"backend": "nope"},
        {"compile_kwargs": {"backend": "eager"}},
        {"compile_kwargs": {"fullgraf": True}},
    ):
        try:
            engine.compile(**kwargs)
        except UserError as err:
            messages.append(f"{type(err).__name__}: {err}")
    refused_left_it_plain = not engine.is_compiled
    engine.compile(backend="aot_eager", compile_kwargs={"dynamic": False})
    forward = engine.module.forward
    engine.compile(backend="eager")  # already compiled: nothing happens, as in DeepSpeed
    return {
        "messages": messages,
        "plain_after_refusals": refused_left_it_plain,
        "compiled": engine.is_compiled,
        "unchanged_by_second_call": engine.module.forward == forward,
    }


def test_engine_compile_refusals_name_the_fix():
    (result,) = run_ranks(1, f"{HERE}:compile_call_errors")
    assert result["messages"] == [
        "UnsupportedError: engine.compile(schedule=...) is a DeepCompile schedule; DeepCompile "
        "is not implemented here: call engine.compile() without it",
        "UnsupportedError: engine.compile(compiled_autograd_enabled=True): compiled autograd "
        "would trace the gradient hooks that reduce gradients across ranks; call "
        "engine.compile() without it (backward still runs the compiled regions' backward "
        "graphs)",
        result["messages"][2],
        "InvalidValueError: compile_kwargs.backend is not read from here; set the backend "
        "itself (compile.backend, or engine.compile(backend=...))",
        "InvalidValueError: compile_kwargs.fullgraf is not a torch.compile argument; did you "
        "mean 'fullgraph'?",
    ]
    assert result["messages"][2].startswith(
        "InvalidValueError: torch.compile backend 'nope' is not a registered backend (aot_eager, "
    )
    assert result["plain_after_refusals"] and result["compiled"]
    assert result["unchanged_by_second_call"]
