"""torch.compile's pure parts: the `compile` config block (DeepSpeed's keys, validation with the
fix in the message), the regions compiled at each stage, the backend lookup, and which module
fetches which stage-3 units when regions are fetched whole."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runtime.config import CompileConfig, ConfigError, load_config
from runtime.engine.torch_compile import compile_regions, resolve_backend
from runtime.errors import InvalidValueError
from runtime.zero.stage3.hooks import unit_owners


@pytest.fixture(autouse=True)
def dynamo_can_compile():
    """Tests here compile for real in the pytest process, after whatever the suite ran in it
    before: a dispatch mode some earlier test left entered (an engine dropped mid-count) or a
    forced-eager stance would make Dynamo skip every frame and these tests fail for a reason
    not theirs. Leave them neither; the leak itself is tested where engines run
    (tests/integration/observe/test_step_insight.py)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode

    while _get_current_dispatch_mode_stack():
        _pop_mode()
    with torch.compiler.set_stance("default"):
        yield


def _compile(block: dict) -> CompileConfig:
    return load_config({"compile": block}).compile


def test_defaults_are_deepspeeds():
    block = load_config({}).compile
    assert block == CompileConfig(enabled=False, backend="inductor", kwargs={})


def test_enabled_backend_and_kwargs_are_read():
    block = _compile(
        {
            "enabled": True,
            "backend": "aot_eager",
            "kwargs": {"fullgraph": True, "dynamic": False, "mode": "max-autotune"},
        }
    )
    assert block.enabled is True
    assert block.backend == "aot_eager"
    assert block.kwargs == {"fullgraph": True, "dynamic": False, "mode": "max-autotune"}
    assert _compile({"backend": "my_package.backends.fast"}).backend == "my_package.backends.fast"
    assert _compile({"kwargs": {"options": {"max_autotune": True}}}).kwargs == {
        "options": {"max_autotune": True}
    }


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"enabled": "yes"}, "compile.enabled must be true or false, got 'yes'"),
        (
            {"backend": "inductr"},
            "compile.backend = 'inductr' is not a torch.compile backend; did you mean 'inductor'?",
        ),
        ({"backend": "fast"}, "use one of 'inductor', 'aot_eager'"),
        ({"backend": 3}, "compile.backend = 3 is not a torch.compile backend"),
        ({"kwargs": []}, "compile.kwargs must be a mapping, got []"),
        (
            {"kwargs": {"fulgraph": True}},
            "compile.kwargs.fulgraph is not a torch.compile argument; did you mean 'fullgraph'?",
        ),
        (
            {"kwargs": {"backend": "eager"}},
            "compile.kwargs.backend is not read from here; set the backend itself",
        ),
        (
            {"kwargs": {"mode": "fast"}},
            "compile.kwargs.mode must be one of 'default', 'reduce-overhead'",
        ),
        (
            {"kwargs": {"dynamic": "auto"}},
            "compile.kwargs.dynamic must be true, false or null, got 'auto'",
        ),
        ({"kwargs": {"fullgraph": 1}}, "compile.kwargs.fullgraph must be true or false, got 1"),
        (
            {"kwargs": {"options": 3}},
            "compile.kwargs.options must be a mapping of inductor options",
        ),
        (
            {"kwargs": {"mode": "default", "options": {}}},
            "compile.kwargs.mode and options are both set; torch.compile takes one of them",
        ),
        ({"enable": True}, "compile.enable is not a valid key; did you mean 'enabled'?"),
        (
            {"deepcompile": True},
            "compile.deepcompile = true is not supported by this runtime; DeepCompile (DeepSpeed's own compiler passes) is not implemented",
        ),
        ({"passes": ["z3"]}, 'compile.passes = ["z3"] is not supported by this runtime'),
        ({"autoep_non_moe": True}, "compile.autoep_non_moe = true is not supported"),
    ],
)
def test_bad_blocks_name_the_key_and_the_fix(block, message):
    with pytest.raises(ConfigError) as err:
        _compile(block)
    assert message in str(err.value)


def test_deepcompiles_own_settings_are_accepted_while_it_is_off():
    block = _compile({"deepcompile": False, "free_activation": True, "double_buffer": False})
    assert block == CompileConfig()


def test_backend_lookup():
    assert resolve_backend("aot_eager") == "aot_eager"
    assert resolve_backend(len) is len
    from torch._dynamo.backends.debugging import eager

    assert resolve_backend("torch._dynamo.backends.debugging.eager") is eager
    with pytest.raises(InvalidValueError, match="'fast' is not a registered backend"):
        resolve_backend("fast")
    with pytest.raises(InvalidValueError, match="cannot import it"):
        resolve_backend("no_such_package.backend")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.inner(x) * self.scale


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.act = torch.nn.ModuleList([torch.nn.Tanh(), torch.nn.Tanh()])
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        x = self.embed(x)
        for block, act in zip(self.blocks, self.act, strict=True):
            x = act(block(x))
        return self.head(x)


def test_regions_whole_model_at_stages_0_to_2_and_repeated_blocks_at_stage_3():
    model = Stack()
    for stage in (0, 1, 2):
        assert compile_regions(model, stage) == [""]
    # parameter-free repeats (the activations) are not regions
    assert compile_regions(model, 3) == ["blocks.0", "blocks.1"]


def test_regions_of_thirdparty_stacks():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    assert compile_regions(encoder, 3) == ["layers.0", "layers.1", "layers.2"]
    seq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    assert compile_regions(seq, 3) == ["0", "2"]
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    llama = transformers.LlamaForCausalLM(config)
    assert compile_regions(llama, 3) == ["model.layers.0", "model.layers.1"]


def test_without_repeated_blocks_the_parameter_leaves_are_regions():
    model = torch.nn.Module()
    model.fc1 = torch.nn.Linear(3, 4)
    model.block = Block()  # a parameter of its own and a child with parameters: not a leaf
    assert compile_regions(model, 3) == ["fc1", "block.inner"]


def test_a_region_fetched_whole_fetches_its_subtree_and_its_modules_nothing():
    model = Stack()
    units = [
        SimpleNamespace(params=[model.embed.weight, model.embed.bias], leaf=None, persistent=False),
        SimpleNamespace(params=[model.blocks[0].scale], leaf=None, persistent=False),
        SimpleNamespace(
            params=list(model.blocks[0].inner.parameters()), leaf=None, persistent=False
        ),
        SimpleNamespace(params=[model.blocks[1].scale], leaf=None, persistent=False),
        SimpleNamespace(
            params=list(model.blocks[1].inner.parameters()), leaf=None, persistent=True
        ),
        SimpleNamespace(params=list(model.head.parameters()), leaf=None, persistent=False),
    ]
    plain = {id(m): mine for m, mine in unit_owners(model, units)}
    assert plain[id(model.blocks[0])] == [units[1]]
    assert plain[id(model.blocks[0].inner)] == [units[2]]
    owners = {id(m): mine for m, mine in unit_owners(model, units, whole=["blocks.0", "blocks.1"])}
    assert owners[id(model.embed)] == [units[0]]
    assert owners[id(model.blocks[0])] == [units[1], units[2]]
    assert owners[id(model.blocks[1])] == [units[3]]  # its persistent unit is never fetched
    assert owners[id(model.head)] == [units[5]]
    for inside in (model.blocks[0].inner, model.blocks[1].inner):
        assert id(inside) not in owners  # no hook inside a compiled region
    root_whole = unit_owners(model, units, whole=[""])
    assert [m for m, _ in root_whole] == [model]
    assert root_whole[0][1] == [units[0], units[1], units[2], units[3], units[5]]


def test_compile_watch_reports_once_warm_and_warns_once_on_a_later_compile(monkeypatch, caplog):
    from runtime.engine import torch_compile

    counts = iter(
        [
            torch_compile.CompileCounts(graphs=5, graph_breaks=1, frames=5),  # at compile()
            torch_compile.CompileCounts(graphs=7, graph_breaks=1, frames=7),  # step 3: warm
            torch_compile.CompileCounts(graphs=7, graph_breaks=1, frames=7),  # step 4
            torch_compile.CompileCounts(graphs=8, graph_breaks=1, frames=8),  # step 5: again
        ]
    )
    monkeypatch.setattr(torch_compile.CompileCounts, "now", staticmethod(lambda: next(counts)))
    watch = torch_compile.CompileWatch(["blocks.0", "blocks.1"])
    engine = SimpleNamespace(global_steps=0)
    caplog.set_level("INFO", logger="runtime.compile")
    for step in range(1, 8):
        engine.global_steps = step
        watch.after_step(engine, outcome=None)  # between accumulation boundaries: nothing
        watch.after_step(engine, outcome=object())
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "torch.compile: 2 graph(s), 0 graph break(s) for 2 regions (blocks.0, blocks.1)",
        "torch.compile compiled again at step 5 (1 more frame(s) since step 3): something the "
        "compiled code depends on changes between steps; run with TORCH_LOGS=recompiles to see "
        "what",
    ]


def test_compiled_regions_keep_their_keys_and_copies_compute_with_their_own_weights():
    import copy

    from runtime.engine.torch_compile import CompileCounts, compile_model

    torch._dynamo.reset()
    model = Stack()
    keys = sorted(model.state_dict())
    x = torch.randn(3, 4)
    expected = model(x)
    before = CompileCounts.now()
    done = compile_model(model, 0, "eager", {}, fetch_whole=None)
    assert done.regions == [""]
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert CompileCounts.now().graphs > before.graphs  # it really compiled
    assert sorted(model.state_dict()) == keys
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.head.bias.add_(1.0)
    torch.testing.assert_close(twin(x), expected + 1.0)
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
