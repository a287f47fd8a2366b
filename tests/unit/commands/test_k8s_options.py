"""--launcher k8s's options: built and checked before anything is created (pure: nothing is
started, no API server is asked)."""

from __future__ import annotations

import os

import pytest

from zlaunch.commands.run_options import build_options
from zlaunch.errors import UsageError


def _options(tmp_path, **values):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return build_options(
        script=str(script), script_args=(), environ={"PATH": os.environ.get("PATH", "")},
        home=str(tmp_path), **values,
    )  # fmt: skip


def test_the_pods_options(tmp_path):
    options = _options(
        tmp_path, launcher="k8s", num_nodes=3, image="reg/t:1", namespace="ml",
        k8s_gpus=8, num_gpus=8, k8s_context="prod",
    )  # fmt: skip
    assert options.launcher == "k8s"
    assert [h.name for h in options.hosts] == ["agent-0", "agent-1", "agent-2"]
    assert all(len(h.slots) == 8 for h in options.hosts)
    k8s = options.k8s
    assert (k8s.image, k8s.namespace, k8s.context, k8s.gpus) == ("reg/t:1", "ml", "prod", 8)
    # the token is made per attempt and handed to the pods through the Secret alone
    assert options.token_file is None


@pytest.mark.parametrize(
    "values, says",
    [
        ({"launcher": "k8s", "num_nodes": 2}, "--image"),
        ({"launcher": "k8s", "image": "i"}, "--nodes"),
        ({"launcher": "k8s", "num_nodes": 2, "image": "i", "namespace": "ML"}, "--namespace"),
        ({"launcher": "k8s", "num_nodes": 2, "image": "i", "k8s_memory": "4GB"}, "--k8s-memory"),
        ({"launcher": "k8s", "num_nodes": 2, "image": "i", "min_nodes": 1}, "only matters when"),
        ({"launcher": "k8s", "num_nodes": 2, "image": "i", "token_file": "t"}, "--token-file"),
        ({"image": "i"}, "--image has no effect with --launcher ssh"),
        ({"namespace": "ml"}, "--namespace has no effect"),
    ],
)
def test_what_cannot_work_is_refused_naming_the_option(tmp_path, values, says):
    with pytest.raises(UsageError) as err:
        _options(tmp_path, **values)
    assert says in err.value.message + (err.value.hint or "")
