"""The Kubernetes objects of a dial-in job (pure) and ``zlaunch k8s manifest`` printing them.

The field names are checked against the official Kubernetes client's models (a misspelt field
is one the model drops), not against our own reading of the API."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from click.testing import CliRunner

from zlaunch.cli import cli, main
from zlaunch.errors import UsageError
from zlaunch.transport.k8s_manifest import (
    JOB_LABEL,
    TOKEN_KEY,
    TOKEN_MOUNT,
    K8sJob,
    PodResources,
    job_objects,
    owned_by,
    to_yaml,
)

TOKEN = "9f1c2e-the-jobs-token-7a" * 2


def _job(**changes) -> K8sJob:
    values = dict(
        name="train-a1", namespace="ml", image="reg.example/train:1", nodes=3,
        address="10.1.2.3:29400", resources=PodResources(cpu="4", memory="16Gi", gpus=2),
    )  # fmt: skip
    values.update(changes)
    return K8sJob(**values)


def test_an_indexed_job_of_one_pod_per_node_dialing_in_with_the_token_as_a_mounted_file():
    secret, service, job = job_objects(_job(), TOKEN)
    assert [o["kind"] for o in (secret, service, job)] == ["Secret", "Service", "Job"]
    assert base64.b64decode(secret["data"][TOKEN_KEY]).decode() == TOKEN
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 0  # the controller decides what a lost pod means
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    # the headless Service names the pods: NAME-I.NAME
    assert service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    command = container["command"]
    assert command[-4:] == ["--connect", "10.1.2.3:29400", "--token-file", f"{TOKEN_MOUNT}/token"]
    assert "zlaunch.agent" in " ".join(command)
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert (mount["mountPath"], mount["readOnly"], mount["name"]) == (
        TOKEN_MOUNT, True, volume["name"],
    )  # fmt: skip
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    for obj in (secret, service, job):
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"][JOB_LABEL] == "train-a1"


def test_the_token_is_in_the_secret_only():
    secret, service, job = job_objects(_job(), TOKEN)
    encoded = secret["data"][TOKEN_KEY]
    for obj in (service, job):
        text = json.dumps(obj)
        assert TOKEN not in text and encoded not in text
    pod = job["spec"]["template"]["spec"]
    assert all("env" not in c and "envFrom" not in c for c in pod["containers"])


def test_no_resources_asked_leaves_the_field_out():
    _, _, job = job_objects(_job(resources=PodResources()), TOKEN)
    assert "resources" not in job["spec"]["template"]["spec"]["containers"][0]


def test_every_field_is_one_the_kubernetes_client_knows():
    client = pytest.importorskip("kubernetes.client", reason="the kubernetes client (test extra)")
    api = client.ApiClient()
    models = {"Secret": "V1Secret", "Service": "V1Service", "Job": "V1Job"}
    for obj in job_objects(_job(), TOKEN):
        model = api._ApiClient__deserialize(obj, models[obj["kind"]])
        # a field the model does not know is dropped: the round trip would differ
        assert api.sanitize_for_serialization(model) == obj


def test_owner_references_point_at_the_created_job():
    secret, service, job = job_objects(_job(), TOKEN)
    created = {**job, "metadata": {**job["metadata"], "uid": "5d1e-uid"}}
    owned = owned_by(secret, created)
    (ref,) = owned["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "batch/v1", "kind": "Job", "name": "train-a1", "uid": "5d1e-uid",
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    assert "ownerReferences" not in secret["metadata"]  # the input is left alone
    with pytest.raises(ValueError, match="uid"):
        owned_by(service, job)


@pytest.mark.parametrize(
    "changes, names",
    [
        ({"namespace": "ML_team"}, "--namespace"),
        ({"name": "x" * 62, "nodes": 10}, "--k8s-name"),  # pod x...x-9 is 64 characters
        ({"name": "Train"}, "--k8s-name"),
        ({"image": ""}, "--image"),
        ({"image": "reg/a b"}, "--image"),
        ({"nodes": 0}, "--nodes"),
        ({"address": "10.1.2.3"}, "--connect"),
        ({"address": "10.1.2.3:70000"}, "--connect"),
        ({"resources": PodResources(cpu="4 cores")}, "--k8s-cpu"),
        ({"resources": PodResources(memory="16GB")}, "--k8s-memory"),
        ({"resources": PodResources(gpus=-1)}, "--k8s-gpus"),
    ],
)
def test_what_the_api_server_would_refuse_is_refused_first_naming_the_option(changes, names):
    with pytest.raises(UsageError) as err:
        job_objects(_job(**changes), TOKEN)
    assert names in err.value.message + (err.value.hint or "")


def test_accepted_edges():
    job_objects(_job(name="x" * 61, nodes=10), TOKEN)  # x...x-9: 63 characters
    job_objects(_job(address="[fd00::1]:29400", resources=PodResources(cpu="500m")), TOKEN)


def test_the_yaml_stream_is_the_objects_in_order():
    objects = job_objects(_job(), TOKEN)
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


def test_the_manifest_command_prints_what_it_was_asked_for(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    args = [
        "k8s", "manifest", "--nodes", "2", "--image", "reg/t:1", "--connect", "h.example:29400",
        "--token-file", str(token), "--namespace", "ml", "--k8s-name", "run7", "--k8s-gpus", "8",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    secret, service, job = yaml.safe_load_all(result.output)
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert job["metadata"] == {**secret["metadata"]} == service["metadata"]
    assert job["metadata"]["name"] == "run7" and job["spec"]["parallelism"] == 2
    assert "h.example:29400" in job["spec"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "cannot read"),
        ("", "one line"),
        ("a" * 32 + "\nb\n", "one line"),
        (" " + "a" * 32 + "\n", "one line"),
        ("a" * 31, "32-1024"),
        ("a" * 1025, "32-1024"),
    ],
)
def test_a_bad_token_file_is_named(tmp_path, capsys, content, says):
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    args = ["k8s", "manifest", "--nodes", "1", "--image", "i", "--connect", "h:1",
            "--token-file", str(token)]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--token-file {token}" in err and says in err and "hint:" in err
