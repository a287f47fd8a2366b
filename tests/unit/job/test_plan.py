"""build_plan: exact ranks, argv and env per worker; render_plan for --dry-run."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlaunch.errors import UsageError
from zlaunch.job.hostfile import Host
from zlaunch.job.options import LaunchOptions, SshOptions
from zlaunch.job.plan import AUTO_PORT, RESERVED_ENV, build_plan, new_run_id, render_plan

PY = "/opt/py/bin/python3"


def options(hosts, **overrides) -> LaunchOptions:
    values = {
        "hosts": tuple(hosts),
        "program": ("train.py", "--lr", "0.1"),
        "python": PY,
        "cwd": "/work/job",
        "env": {"PATH": "/usr/bin", "NCCL_DEBUG": "INFO"},
    }
    values.update(overrides)
    return LaunchOptions(**values)


def plan_for(hosts, *, attempt=0, **overrides):
    opts = options(hosts, **overrides)
    return build_plan(
        opts, opts.hosts, master_addr="node1", master_port=29500, run_id="run-1", attempt=attempt
    )


THREE_BY_TWO = [Host("node1", (0, 1)), Host("node2", (0, 1)), Host("node3", (0, 1))]


def test_three_hosts_two_slots_exact_env():
    plan = plan_for(THREE_BY_TWO, config_path="/work/job/ds.json")
    assert (plan.world_size, plan.master_addr, plan.master_port) == (6, "node1", 29500)
    assert [n.node_rank for n in plan.nodes] == [0, 1, 2]
    assert [[w.rank for w in n.workers] for n in plan.nodes] == [[0, 1], [2, 3], [4, 5]]
    assert [w.rank for w in plan.workers] == list(range(6))
    for node in plan.nodes:
        assert node.cwd == "/work/job"
        for local_rank, worker in enumerate(node.workers):
            rank = node.node_rank * 2 + local_rank
            assert (worker.rank, worker.local_rank, worker.slot) == (rank, local_rank, local_rank)
            assert worker.argv == (PY, "-u", "train.py", "--lr", "0.1")
            assert dict(worker.env) == {
                "PATH": "/usr/bin",
                "NCCL_DEBUG": "INFO",
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": "6",
                "LOCAL_WORLD_SIZE": "2",
                "NODE_RANK": str(node.node_rank),
                "NUM_NODES": "3",
                "GROUP_RANK": str(node.node_rank),
                "CROSS_RANK": str(node.node_rank),
                "CROSS_SIZE": "3",
                "LOCAL_SIZE": "2",
                "MASTER_ADDR": "node1",
                "MASTER_PORT": "29500",
                "CUDA_VISIBLE_DEVICES": "0,1",
                "ZLAUNCH_RUN_ID": "run-1",
                "ZLAUNCH_ATTEMPT": "0",
                "TORCHELASTIC_RUN_ID": "run-1",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0",
                "ZLAUNCH_CONFIG": "/work/job/ds.json",
                "ZLAUNCH_STACKS_SIGNAL": str(int(signal.SIGRTMIN) + 3),
            }


def test_uneven_slots_local_rank_restarts_on_each_host():
    hosts = [Host("a", (0, 1, 2)), Host("b", (5,)), Host("c", (1, 3))]
    plan = plan_for(hosts)
    rows = [
        (
            n.host.name,
            w.rank,
            w.local_rank,
            w.slot,
            w.env["LOCAL_RANK"],
            w.env["LOCAL_WORLD_SIZE"],
            w.env["CUDA_VISIBLE_DEVICES"],
            w.env["NODE_RANK"],
        )
        for n in plan.nodes
        for w in n.workers
    ]
    assert rows == [
        ("a", 0, 0, 0, "0", "3", "0,1,2", "0"),
        ("a", 1, 1, 1, "1", "3", "0,1,2", "0"),
        ("a", 2, 2, 2, "2", "3", "0,1,2", "0"),
        ("b", 3, 0, 5, "0", "1", "5", "1"),
        ("c", 4, 0, 1, "0", "2", "1,3", "2"),
        ("c", 5, 1, 3, "1", "2", "1,3", "2"),
    ]
    assert {w.env["WORLD_SIZE"] for w in plan.workers} == {"6"}
    assert {w.env["RANK"] for w in plan.workers} == {str(r) for r in range(6)}
    assert "ZLAUNCH_CONFIG" not in plan.workers[0].env


def test_argv_forms():
    hosts = [Host("a", (0, 1))]
    module = plan_for(hosts, program=("-m", "pkg.train", "--x"), module=True)
    assert module.workers[1].argv == (PY, "-u", "-m", "pkg.train", "--x")
    exe = plan_for(hosts, program=("/bin/echo", "hi"), no_python=True)
    assert exe.workers[0].argv == ("/bin/echo", "hi")
    local = plan_for(hosts, pass_local_rank=True)
    assert [w.argv for w in local.workers] == [
        (PY, "-u", "train.py", "--lr", "0.1", "--local_rank=0"),
        (PY, "-u", "train.py", "--lr", "0.1", "--local_rank=1"),
    ]


def test_attempt_and_run_id():
    plan = plan_for(THREE_BY_TWO, attempt=2)
    assert plan.attempt == 2
    env = plan.workers[3].env
    assert env["ZLAUNCH_ATTEMPT"] == env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert env["ZLAUNCH_RUN_ID"] == env["TORCHELASTIC_RUN_ID"] == "run-1"


def test_job_names_override_user_env_and_options_are_untouched():
    user_env = {name: "user" for name in RESERVED_ENV} | {"KEEP": "me"}
    opts = options(THREE_BY_TWO, env=user_env)
    before = dict(opts.env)
    plan = build_plan(opts, opts.hosts, master_addr="m", master_port=1, run_id="r", attempt=0)
    worker = plan.workers[5]
    assert worker.env["KEEP"] == "me"
    assert worker.env["RANK"] == "5"
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # Reserved names the plan does not set (no config; the agent owns the events fd) are
    # dropped rather than passed on with a user's stale value.
    assert "ZLAUNCH_CONFIG" not in worker.env
    assert "ZLAUNCH_EVENTS_FD" not in worker.env
    assert dict(opts.env) == before
    again = build_plan(opts, opts.hosts, master_addr="m", master_port=1, run_id="r", attempt=0)
    assert again == plan


def test_plan_uses_the_hosts_given():
    opts = options(THREE_BY_TWO)
    plan = build_plan(
        opts, [Host("x", (0,))], master_addr="x", master_port=1, run_id="r", attempt=0
    )
    assert plan.world_size == 1
    assert plan.nodes[0].host.name == "x"
    with pytest.raises(ValueError, match="at least one host"):
        build_plan(opts, [], master_addr="x", master_port=1, run_id="r", attempt=0)
    with pytest.raises(ValueError, match="no slots"):
        build_plan(opts, [Host("x", ())], master_addr="x", master_port=1, run_id="r", attempt=0)


HOSTILE_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), HOSTILE_TEXT),
    st.lists(HOSTILE_TEXT, max_size=4),
    HOSTILE_TEXT,
)
def test_env_and_args_survive_byte_for_byte(env, args, cwd):
    env = {k: v for k, v in env.items() if k not in RESERVED_ENV}
    opts = options(THREE_BY_TWO, env=env, program=("my script.py", *args), cwd=cwd)
    plan = build_plan(opts, opts.hosts, master_addr="m", master_port=1, run_id="r", attempt=0)
    for node in plan.nodes:
        assert node.cwd == cwd
        for worker in node.workers:
            assert worker.argv == (PY, "-u", "my script.py", *args)
            assert {k: worker.env[k] for k in env} == env


def test_hostile_values_exactly():
    values = {
        "CMD": "$(touch /tmp/zlaunch-pwned)",
        "SEMI": "a; b && c | d",
        "QUOTES": "'\"`",
        "NEWLINES": "one\ntwo\r\n",
        "UNICODE": "日本語 ✓ \u2028",
    }
    plan = plan_for(THREE_BY_TWO, env=values, program=("train.py", "$(id)", "a b", "x;y"))
    for worker in plan.workers:
        assert {k: worker.env[k] for k in values} == values
        assert worker.argv[2:] == ("train.py", "$(id)", "a b", "x;y")


def test_options_validation():
    host = [Host("a", (0,))]
    with pytest.raises(UsageError, match="no hosts"):
        options([])
    with pytest.raises(UsageError, match="nothing to run"):
        options(host, program=())
    with pytest.raises(UsageError, match="cannot be used together"):
        options(host, module=True, no_python=True)
    with pytest.raises(UsageError, match="--grace-period must be 0 or more"):
        options(host, grace_period=-1)
    with pytest.raises(UsageError, match="--ssh-timeout"):
        SshOptions(timeout=0)
    with pytest.raises(UsageError, match="--ssh-port"):
        SshOptions(port=70000)
    assert options(THREE_BY_TWO).world_size == 6


def test_new_run_id_is_sortable_and_unique():
    first = new_run_id(0.0)
    assert first.startswith("19700101-000000-")
    assert len({new_run_id() for _ in range(100)}) == 100


# ---- render_plan ----------------------------------------------------------------------------


def test_render_plan_shows_hosts_ranks_commands_and_sorted_env():
    hosts = [Host("node1", (0, 1)), Host("node2", (3,), user="bob", port=2222), Host("::1", (0,))]
    opts = options(hosts, env={"ZED": "z", "ALPHA": "a", "PATH": "/usr/bin"})
    plan = build_plan(
        opts, hosts, master_addr="node1", master_port=AUTO_PORT, run_id="r", attempt=0
    )
    text = render_plan(plan)
    lines = text.splitlines()
    assert lines[0] == "run r  attempt 0  world size 4  nodes 3  master node1:auto"
    assert "node 0: node1  ranks 0-1  slots 0,1  cwd /work/job" in lines
    assert "node 1: bob@node2 (ssh port 2222)  ranks 2  slots 3  cwd /work/job" in lines
    assert "node 2: [::1]  ranks 3  slots 0  cwd /work/job" in lines
    assert f"  rank 1 (local 1, slot 1): {PY} -u train.py --lr 0.1" in lines
    assert "    LOCAL_RANK=1 RANK=1" in lines
    assert "    MASTER_PORT=auto" in lines
    # The env every rank shares is printed once, sorted, with the values; a node's own block
    # holds only what its workers share and other nodes' do not.
    start = lines.index("env of every rank:") + 1
    block = [line.strip() for line in lines[start:]]
    names = [entry.split("=", 1)[0] for entry in block]
    assert names == sorted(names)
    assert "ALPHA=a" in block and "WORLD_SIZE=4" in block and "MASTER_ADDR=node1" in block
    assert text.count("ALPHA=a") == 1 and text.count("WORLD_SIZE=4") == 1
    node1 = lines.index("node 0: node1  ranks 0-1  slots 0,1  cwd /work/job")
    env1 = lines.index("  env:", node1) + 1
    assert "    CUDA_VISIBLE_DEVICES=0,1" in lines[env1 : lines.index("", env1)]
    assert "    NODE_RANK=1" in lines


def test_render_plan_shows_shared_env_once_for_many_ranks():
    hosts = [Host(f"node{k}", tuple(range(4))) for k in range(7)]  # 28 ranks
    plan = build_plan(
        options(hosts, env={"A": "1", "B": "2"}),
        hosts,
        master_addr="node0",
        master_port=AUTO_PORT,
        run_id="r",
        attempt=0,
    )
    lines = render_plan(plan).splitlines()
    assert sum(line.strip() == "A=1" for line in lines) == 1
    # 28 rank lines + their RANK/LOCAL_RANK lines, a header and a short env block per node,
    # and the shared env once: far from one full env per node.
    assert len(lines) < 2 * 28 + 7 * 10 + 30, len(lines)


def test_render_plan_redacts_secrets_and_escapes_odd_values():
    env = {
        "HF_TOKEN": "hf_abc",
        "WANDB_API_KEY": "k123",
        "db_password": "pw",
        "MY_SECRET_THING": "s",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "PUBLIC": "visible",
        "MULTI": "a\nb",
        "SPACE": "a b",
    }
    plan = plan_for([Host("a", (0,))], env=env, program=("train.py", "line\nbreak"))
    text = render_plan(plan)
    for secret in ("hf_abc", "k123", "pw", "AKIA"):
        assert secret not in text
    for name in (
        "HF_TOKEN",
        "WANDB_API_KEY",
        "db_password",
        "MY_SECRET_THING",
        "AWS_ACCESS_KEY_ID",
    ):
        assert f"    {name}=<redacted>" in text.splitlines()
    assert "    PUBLIC=visible" in text.splitlines()
    assert '    MULTI="a\\nb"' in text.splitlines()
    assert '    SPACE="a b"' in text.splitlines()
    assert '"line\\nbreak"' in text
    # Every env line is one line: nothing a value holds can fake another entry.
    assert all(
        line.startswith(("run ", "node ", "  ", "env of every rank:")) or not line
        for line in text.splitlines()
    )


@pytest.mark.parametrize(
    ("envs", "common"),
    [
        ([], {}),
        ([{"A": "1", "B": "2"}], {"A": "1", "B": "2"}),
        ([{"A": "1", "B": "2"}, {"A": "1", "B": "3"}], {"A": "1"}),
        ([{"A": "1"}, {"B": "1"}], {}),
    ],
)
def test_shared_env_is_what_every_env_has_with_the_same_value(envs, common):
    from zlaunch.job.plan import shared_env

    assert shared_env(envs) == common
