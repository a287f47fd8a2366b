"""Kubernetes against an emulated API (tests/fixtures/k8s_emulator.py: kmock's emulator,
patched, and a test kubelet that runs each pod's command as a real process inside a host of the
test cluster, so each pod has its own address and host name).

One run checks both ways in: ``zlaunch k8s manifest | kubectl apply -f -`` with the controller
under ``--launcher dialin``, then ``--launcher k8s`` creating the objects itself. Each trains
with the same per-step losses as the same job over SSH on the same hosts; the real kubectl
binary reads what was created; the token is in no pod spec, no argv or environment, no file
of the run and no output; a pod deleted mid-job (its node lost) or evicted is taken as its
agent lost; after each ending no Job, pod, Secret or Service is left, and no process.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.launcher import helpers

pytestmark = pytest.mark.cluster

pytest.importorskip("kmock", reason="the Kubernetes API emulator (kmock, in the test extra)")
pytest.importorskip("kubernetes", reason="the Kubernetes client (in the test extra)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ZLAUNCH = [sys.executable, "-m", "zlaunch"]
EMULATOR = os.path.join(REPO, "tests", "fixtures", "k8s_emulator.py")
TRAIN = [
    "examples/train_gpt.py", "--config", "examples/configs/zero2.json",
    "--steps", "10", "--print-every", "5", "--threads", "1", "--max-chars", "50000",
    "--n-layer", "1", "--d-model", "64", "--seq-len", "32",
]  # fmt: skip
SLOW_TRAIN = [*TRAIN[:4], "400", *TRAIN[5:]]  # long enough to lose a pod in the middle
LONG_TRAIN = [*TRAIN[:4], "20000", *TRAIN[5:]]  # outlasts the wait for a silent API server
LINE = re.compile(r"^\[[^\]:]+:0\] step\s+(\d+)\s+loss ([0-9.]+)", re.MULTILINE)
NODES = ["node1", "node2"]
ENV = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
KIND = "job,pod,secret,service"

idle_cluster = helpers.idle_cluster  # autouse: no process left on any host


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _start_emulator(tmp_path, cluster, *extra: str) -> tuple[subprocess.Popen, str]:
    """The emulated API and its kubelet, each pod in one of NODES; its kubeconfig's path."""
    state = tmp_path / "k8s"
    nodes = [f"--node={cluster.namespace(h)}={cluster.address(h)}" for h in NODES]
    emulator_log = open(tmp_path / "emulator.log", "wb")
    emulator = subprocess.Popen(
        [sys.executable, EMULATOR, "--state", str(state), *nodes, *extra], env=ENV,
        stdin=subprocess.DEVNULL, stdout=emulator_log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    emulator_log.close()
    kubeconfig = str(state / "kubeconfig")
    deadline = time.monotonic() + 60
    while not os.path.exists(kubeconfig):
        if emulator.poll() is not None or time.monotonic() > deadline:
            _stop([], emulator, tmp_path)
            pytest.fail("the emulator did not start: " + (tmp_path / "emulator.log").read_text())
        time.sleep(0.1)
    return emulator, kubeconfig


def _stop(procs, emulator, tmp_path) -> None:
    """Kill what the test started; the emulator must end well (it kills its pods' processes)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    os.kill(emulator.pid, signal.SIGCONT)  # a test may have stopped it
    emulator.send_signal(signal.SIGTERM)
    try:
        emulator.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(emulator.pid, signal.SIGKILL)
        emulator.wait()
    assert emulator.returncode == 0, (tmp_path / "emulator.log").read_text()[-3000:]


def _kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", kubeconfig, *args], input=stdin, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


KUBECTL = shutil.which("kubectl")
if KUBECTL is None:
    pytest.skip("no kubectl on PATH (apt-get install kubernetes-client)", allow_module_level=True)


def _holding(secret: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        for part in ("cmdline", "environ") if pid.isdigit() else ():
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if secret.encode() in f.read():
                        found.append(f"{pid} ({part})")
            except OSError:
                pass
    return found


def _controller(where: str, port: int, token_file, runs, train) -> subprocess.Popen:
    return subprocess.Popen(
        [*ZLAUNCH, "run", "--launcher", "dialin", "--nodes", "2", "--token-file", str(token_file),
         "--controller-addr", where, "--controller-port", str(port), "--log-dir", str(runs),
         *train],
        cwd=REPO, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _k8s_controller(
    where: str, kubeconfig: str, runs, train, *extra, image="zlaunch-test:local",
    python=sys.executable, stderr=subprocess.PIPE,
) -> subprocess.Popen:  # fmt: skip
    return subprocess.Popen(
        [*ZLAUNCH, "run", "--launcher", "k8s", "--nodes", "2", *extra, "--image", image,
         "--namespace", "ml", "--k8s-python", python, "--k8s-cpu", "1",
         "--controller-addr", where, "--log-dir", str(runs), *train],
        cwd=REPO, env={**ENV, "KUBECONFIG": kubeconfig}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
    )  # fmt: skip


def _stepping(controller, runs) -> None:
    """Wait until a rank logged a step (the job is in its middle)."""
    deadline = time.monotonic() + 180
    while not any("step" in p.read_text(errors="replace") for p in runs.rglob("rank-*.log")):
        assert controller.poll() is None, controller.communicate()
        assert time.monotonic() < deadline, "no step logged"
        time.sleep(0.2)


def _objects_while_running(kubeconfig: str, controller, runs) -> list[dict]:
    """The job's objects as kubectl reads them once the ranks run."""
    deadline = time.monotonic() + 120
    while not list(runs.rglob("rank-*.log")):
        assert controller.poll() is None, controller.communicate()
        assert time.monotonic() < deadline, "no rank started"
        time.sleep(0.1)
    read = _kubectl(
        kubeconfig,
        "get",
        KIND,
        "-n",
        "ml",
        "-l",
        "app.kubernetes.io/managed-by=zlaunch",
        "-o",
        "json",
    )
    return json.loads(read)["items"]


def _nothing_left(kubeconfig: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        left = _kubectl(kubeconfig, "get", KIND, "-n", "ml", "-o", "name")
        if not left.strip():
            return
        assert time.monotonic() < deadline, f"left after the run: {left}"
        time.sleep(0.2)


def _apply(kubeconfig, name: str, address: str, token_file) -> str:
    manifest = subprocess.run(
        [*ZLAUNCH, "k8s", "manifest", "--nodes", "2", "--image", "zlaunch-test:local",
         "--namespace", "ml", "--k8s-name", name, "--connect", address,
         "--token-file", str(token_file), "--k8s-python", sys.executable],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert manifest.returncode == 0, manifest.stderr
    # no OpenAPI schema in the emulator: kubectl's own decoding still reads every object
    _kubectl(kubeconfig, "apply", "--validate=false", "-f", "-", stdin=manifest.stdout)
    return manifest.stdout


def _token_written(controller, token_file) -> str:
    deadline = time.monotonic() + 60
    while not token_file.exists():
        assert controller.poll() is None, controller.communicate()
        assert time.monotonic() < deadline, "the controller wrote no token file"
        time.sleep(0.05)
    time.sleep(0.2)
    return token_file.read_text().strip()


def _pods(kubeconfig, name: str) -> list[dict]:
    out = _kubectl(kubeconfig, "get", "pods", "-n", "ml", "-l", f"zlaunch/job={name}", "-o", "json")
    return json.loads(out)["items"]


def _delete_and_check_gone(kubeconfig, manifest: str, name: str) -> None:
    _kubectl(kubeconfig, "delete", "-f", "-", stdin=manifest)
    _nothing_left(kubeconfig)


@pytest.mark.multirank
def test_pods_of_an_indexed_job_train_as_over_ssh_a_lost_pod_is_detected_nothing_is_left(
    idle_cluster, tmp_path
):
    cluster = idle_cluster
    ssh = subprocess.run(
        [*ZLAUNCH, "--hostfile", cluster.hostfile(1, hosts=NODES), "--ssh-config",
         cluster.ssh_config, "--log-dir", str(tmp_path / "ssh-runs"), *TRAIN],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ssh.returncode == 0, (ssh.stdout + ssh.stderr)[-3000:]
    reference = LINE.findall(ssh.stdout)
    assert [s for s, _ in reference] == ["5", "10"], ssh.stdout

    emulator, kubeconfig = _start_emulator(tmp_path, cluster)
    where = cluster.controller_address
    state = tmp_path / "k8s"
    procs = [emulator]
    try:
        # 1. a whole job: same losses as over SSH, the token only in the Secret
        port = _free_port(where)
        token_file, runs = tmp_path / "job.token", tmp_path / "runs"
        controller = _controller(where, port, token_file, runs, TRAIN)
        procs.append(controller)
        token = _token_written(controller, token_file)
        manifest = _apply(kubeconfig, "train-a", f"{where}:{port}", token_file)
        deadline = time.monotonic() + 120
        while not list(runs.rglob("rank-*.log")) and controller.poll() is None:
            assert time.monotonic() < deadline, "no rank started"
            time.sleep(0.1)
        assert _holding(token) == []
        out, err = controller.communicate(timeout=300)
        assert controller.returncode == 0, (out + err)[-3000:]
        assert LINE.findall(out) == reference
        # each pod dialed in from its own host, under its pod's host name
        joined = dict(re.findall(r"(agent-[01]) is (train-a-[01]) \(", err))
        assert sorted(joined.values()) == ["train-a-0", "train-a-1"], err
        for host in NODES:
            assert f"({cluster.address(host)})" in err
        read = _kubectl(
            kubeconfig, "get", KIND, "-n", "ml", "-l", "zlaunch/job=train-a", "-o", "json"
        )
        objects = json.loads(read)["items"]
        assert sorted(o["kind"] for o in objects) == ["Job", "Pod", "Pod", "Secret", "Service"]
        for obj in objects:
            if obj["kind"] != "Secret":
                assert token not in json.dumps(obj), obj["kind"]
        deadline = time.monotonic() + 30  # each agent has ended: its pod follows
        while [p["status"]["phase"] for p in _pods(kubeconfig, "train-a")] != ["Succeeded"] * 2:
            assert time.monotonic() < deadline, _pods(kubeconfig, "train-a")
            time.sleep(0.2)
        for path in runs.rglob("*"):
            if path.is_file():
                assert token not in path.read_text(errors="replace"), path
        assert token not in out + err
        for log in state.glob("pods/*/log"):  # the pods' own output
            assert token not in log.read_text(errors="replace"), log
        _delete_and_check_gone(kubeconfig, manifest, "train-a")

        # 2. a pod lost mid-job (deleted: its node's kubelet kills it): the controller stops
        # every rank and names that node
        port = _free_port(where)
        token_file, runs = tmp_path / "job2.token", tmp_path / "runs2"
        controller = _controller(where, port, token_file, runs, SLOW_TRAIN)
        procs.append(controller)
        _token_written(controller, token_file)
        manifest = _apply(kubeconfig, "train-b", f"{where}:{port}", token_file)
        deadline = time.monotonic() + 180
        while not any("step" in p.read_text(errors="replace") for p in runs.rglob("rank-*.log")):
            assert controller.poll() is None, controller.communicate()
            assert time.monotonic() < deadline, "no step logged"
            time.sleep(0.2)
        (lost,) = [p for p in _pods(kubeconfig, "train-b") if p["spec"]["hostname"] == "train-b-1"]
        _kubectl(kubeconfig, "delete", "pod", "-n", "ml", lost["metadata"]["name"], "--wait=false")
        out, err = controller.communicate(timeout=120)
        assert controller.returncode != 0, (out + err)[-3000:]
        (lost_agent,) = [a for a, pod in re.findall(r"(agent-[01]) is (train-b-[01]) \(", err)
                         if pod == "train-b-1"]  # fmt: skip
        assert "connection to the agent lost" in out + err, (out + err)[-3000:]
        (failure,) = runs.rglob("failure.json")
        report = failure.read_text()
        assert lost_agent in report and "connection to the agent lost" in report, report
        # the other pod's agent ended when the controller stopped its ranks
        deadline = time.monotonic() + 30
        while [p["status"]["phase"] in ("Succeeded", "Failed")
               for p in _pods(kubeconfig, "train-b")] != [True]:  # fmt: skip
            assert time.monotonic() < deadline, _pods(kubeconfig, "train-b")
            time.sleep(0.2)
        _delete_and_check_gone(kubeconfig, manifest, "train-b")

        # 3. --launcher k8s: zlaunch creates the objects itself through the client, the same
        # losses, and once the job ends nothing of it is left
        runs = tmp_path / "runs3"
        launched = _k8s_controller(where, kubeconfig, runs, TRAIN)
        procs.append(launched)
        seen_objects = _objects_while_running(kubeconfig, launched, runs)
        out, err = launched.communicate(timeout=300)
        assert launched.returncode == 0, (out + err)[-3000:]
        assert LINE.findall(out) == reference
        kinds = sorted(o["kind"] for o in seen_objects)
        assert kinds == ["Job", "Pod", "Pod", "Secret", "Service"], kinds
        job = next(o for o in seen_objects if o["kind"] == "Job")
        for obj in seen_objects:  # the Job owns the Secret and the Service (and its pods)
            if obj["kind"] != "Job":
                owners = obj["metadata"].get("ownerReferences") or []
                assert [r["uid"] for r in owners] == [job["metadata"]["uid"]], obj["kind"]
        secret = next(o for o in seen_objects if o["kind"] == "Secret")
        token = base64.b64decode(secret["data"]["token"]).decode()
        for obj in seen_objects:
            if obj["kind"] != "Secret":
                assert token not in json.dumps(obj), obj["kind"]
        assert token not in out + err
        for path in runs.rglob("*"):
            if path.is_file():
                assert token not in path.read_text(errors="replace"), path
        _nothing_left(kubeconfig)

        # 4. --launcher k8s, a pod evicted mid-job: its agent is lost, the run fails naming it,
        # and again nothing is left
        runs = tmp_path / "runs4"
        launched = _k8s_controller(where, kubeconfig, runs, SLOW_TRAIN)
        procs.append(launched)
        deadline = time.monotonic() + 180
        while not any("step" in p.read_text(errors="replace") for p in runs.rglob("rank-*.log")):
            assert launched.poll() is None, launched.communicate()
            assert time.monotonic() < deadline, "no step logged"
            time.sleep(0.2)
        pods = json.loads(_kubectl(kubeconfig, "get", "pods", "-n", "ml", "-o", "json"))["items"]
        (evicted,) = [p for p in pods if p["spec"]["hostname"].endswith("-1")]
        _kubectl(
            kubeconfig, "patch", "pod", "-n", "ml", evicted["metadata"]["name"],
            "--subresource=status", "--type=merge", "-p",
            '{"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}}',
        )  # fmt: skip
        out, err = launched.communicate(timeout=120)
        assert launched.returncode != 0, (out + err)[-3000:]
        failures = list(runs.rglob("failure.json"))
        assert len(failures) == 1, (out + err)[-3000:]
        report = json.loads(failures[0].read_text())
        (lost_agent,) = [a for a, pod in re.findall(r"(agent-[01]) is (zlaunch-[0-9a-f]{8}-[01]) \(", err)
                         if pod == evicted["spec"]["hostname"]]  # fmt: skip
        rank = int(lost_agent.rpartition("-")[2])  # one rank per node, agents in joining order
        root = report["root_cause"]  # the evicted pod's agent lost, as over SSH
        assert (root["host"], root["rank"]) == (lost_agent, rank), report
        assert report["stopped_ranks"] == [1 - rank], report
        why = f"connection to the agent lost: pod {evicted['metadata']['name']} failed: Evicted"
        assert root["message"] == why + " (low on memory)", report
        assert launched.returncode == report["exit_code"] != 143, report
        _nothing_left(kubeconfig)

        # 5. --launcher k8s ended by `zlaunch stop` mid-job: again nothing is left
        runs = tmp_path / "runs5"
        launched = _k8s_controller(where, kubeconfig, runs, SLOW_TRAIN)
        procs.append(launched)
        deadline = time.monotonic() + 180
        while not any("step" in p.read_text(errors="replace") for p in runs.rglob("rank-*.log")):
            assert launched.poll() is None, launched.communicate()
            assert time.monotonic() < deadline, "no step logged"
            time.sleep(0.2)
        live = _kubectl(kubeconfig, "get", KIND, "-n", "ml", "-o", "name").split()
        assert sorted(name.partition("/")[0] for name in live) == [
            "job.batch", "pod", "pod", "secret", "service",
        ], live  # fmt: skip
        stop = subprocess.run(
            [*ZLAUNCH, "stop", "--log-dir", str(runs)], cwd=REPO, env=ENV, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stdout + stop.stderr
        out, err = launched.communicate(timeout=120)
        assert launched.returncode != 0, (out + err)[-3000:]
        _nothing_left(kubeconfig)

        # 6. --launcher k8s with --min-nodes: a pod evicted mid-job, the job restarts on one
        # pod of a new Job, as over SSH, and ends well; nothing is left
        runs = tmp_path / "runs6"
        launched = _k8s_controller(
            where, kubeconfig, runs, [*SLOW_TRAIN[:4], "2000", *SLOW_TRAIN[5:]],
            "--max-restarts", "1", "--min-nodes", "1",
        )  # fmt: skip
        procs.append(launched)
        deadline = time.monotonic() + 180
        while not any("step" in p.read_text(errors="replace") for p in runs.rglob("rank-*.log")):
            assert launched.poll() is None, launched.communicate()
            assert time.monotonic() < deadline, "no step logged"
            time.sleep(0.2)
        pods = json.loads(_kubectl(kubeconfig, "get", "pods", "-n", "ml", "-o", "json"))["items"]
        (evicted,) = [p for p in pods if p["spec"]["hostname"].endswith("-1")]
        _kubectl(
            kubeconfig, "patch", "pod", "-n", "ml", evicted["metadata"]["name"],
            "--subresource=status", "--type=merge", "-p",
            '{"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}}',
        )  # fmt: skip
        out, err = launched.communicate(timeout=300)
        assert launched.returncode == 0, (out + err)[-3000:]
        assert "restarted this job on another world size" in out and "world size 1," in out, out
        assert [s for s, _ in LINE.findall(out)][-1] == "2000", out[-3000:]
        (record,) = [p for p in runs.glob("*/run.json") if not p.parent.is_symlink()]
        assert json.loads(record.read_text())["status"] == "succeeded"
        assert sorted(p.name for p in record.parent.glob("attempt-*")) == ["attempt-0", "attempt-1"]
        _nothing_left(kubeconfig)
    finally:
        _stop(procs[1:], emulator, tmp_path)


@pytest.mark.multirank
def test_every_ending_of_a_k8s_job_names_its_cause_and_leaves_nothing(idle_cluster, tmp_path):
    """Ctrl-C mid-job; a pod deleted under the launcher; pods that never start (an image the
    nodes cannot pull, an interpreter the image lacks); an API server that stops answering
    mid-job. Each names its cause, and nothing of the job is left (what the API server could
    not delete is named, with the command that deletes it)."""
    cluster = idle_cluster
    emulator, kubeconfig = _start_emulator(tmp_path, cluster, "--image", "zlaunch-test:local")
    where = cluster.controller_address
    procs = []
    try:
        # 1. Ctrl-C (SIGINT to zlaunch alone) mid-job: every object deleted, no process left
        runs = tmp_path / "runs1"
        launched = _k8s_controller(where, kubeconfig, runs, SLOW_TRAIN)
        procs.append(launched)
        _stepping(launched, runs)
        os.kill(launched.pid, signal.SIGINT)
        out, err = launched.communicate(timeout=120)
        assert launched.returncode == 130, (out + err)[-3000:]
        _nothing_left(kubeconfig)
        assert not cluster.wait_idle(timeout=10.0), "a process of the job is left"

        # 2. a pod deleted under the launcher (not evicted): its agent is lost, named by its
        # pod alone, and everything is deleted
        runs = tmp_path / "runs2"
        launched = _k8s_controller(where, kubeconfig, runs, SLOW_TRAIN)
        procs.append(launched)
        _stepping(launched, runs)
        pods = json.loads(_kubectl(kubeconfig, "get", "pods", "-n", "ml", "-o", "json"))["items"]
        (lost,) = [p for p in pods if p["spec"]["hostname"].endswith("-1")]
        _kubectl(kubeconfig, "delete", "pod", "-n", "ml", lost["metadata"]["name"], "--wait=false")
        out, err = launched.communicate(timeout=120)
        assert launched.returncode != 0, (out + err)[-3000:]
        (failure,) = runs.rglob("failure.json")
        report = json.loads(failure.read_text())
        (lost_agent,) = [a for a, pod in re.findall(r"(agent-[01]) is (zlaunch-[0-9a-f]{8}-[01]) \(", err)
                         if pod == lost["spec"]["hostname"]]  # fmt: skip
        root = report["root_cause"]
        assert root["host"] == lost_agent, report
        assert root["message"] == (
            f"connection to the agent lost: pod {lost['metadata']['name']} deleted (its node "
            "lost, or removed by someone)"
        ), report
        _nothing_left(kubeconfig)

        # 3. pods that never start: the wait ends with the pod's reason, long before the
        # dial-in wait's 600 s, and nothing is left
        for image, python, reason in (
            ("registry.example/missing:1", sys.executable, "ImagePullBackOff (Back-off pulling "
             'image "registry.example/missing:1")'),
            ("zlaunch-test:local", "/opt/no-such/python", "StartError, exit code 128 (exec: "
             '"/opt/no-such/python": stat /opt/no-such/python: no such file or directory)'),
        ):  # fmt: skip
            runs = tmp_path / f"runs3-{len(procs)}"
            launched = _k8s_controller(where, kubeconfig, runs, TRAIN, image=image, python=python)
            procs.append(launched)
            out, err = launched.communicate(timeout=120)
            assert launched.returncode != 0, (out + err)[-3000:]
            assert "agents did not dial in" in err and reason in err, err[-3000:]
            assert re.search(r"pod zlaunch-[0-9a-f]{8}-[01]-[0-9a-f]{6} (cannot start|failed)", err)
            assert "Traceback" not in err, err[-3000:]
            assert "the agents' image or command is the usual cause" in err, err[-3000:]
            _nothing_left(kubeconfig)

        # 4. the API server stops answering mid-job (SIGSTOP: connections accepted, never
        # answered): the job goes on, the console names the server; ended by `zlaunch stop`,
        # the cleanup names what it could not delete and the command that does it
        runs = tmp_path / "runs4"
        with open(tmp_path / "stderr4", "w") as console:
            launched = _k8s_controller(where, kubeconfig, runs, LONG_TRAIN, stderr=console)
        procs.append(launched)
        _stepping(launched, runs)
        server = re.search(r"server: '([^']+)'", open(kubeconfig).read()).group(1)
        os.kill(emulator.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 90
            silent = f"the API server at {server} does not answer"
            while silent not in (tmp_path / "stderr4").read_text():
                assert launched.poll() is None, (tmp_path / "stderr4").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "stderr4").read_text()[-3000:]
                time.sleep(0.5)
            stop = subprocess.run(
                [*ZLAUNCH, "stop", "--log-dir", str(runs)], cwd=REPO, env=ENV,
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert stop.returncode == 0, stop.stdout + stop.stderr
            launched.communicate(timeout=120)
        finally:
            os.kill(emulator.pid, signal.SIGCONT)
        err = (tmp_path / "stderr4").read_text()
        assert launched.returncode != 0, err[-3000:]
        (name,) = set(re.findall(r"agent-[01] is (zlaunch-[0-9a-f]{8})-[01] \(", err))
        left = re.search(r"could not delete (.*) in namespace ml: the API server at (\S+) ", err)
        assert left is not None, err[-3000:]
        assert left.group(1) == (
            f"job.batch/{name}, pods -l zlaunch/job={name}, secret/{name}, service/{name}"
        ), err[-3000:]
        assert left.group(2) == server
        command = f"kubectl delete job,pod,secret,service -n ml -l zlaunch/job={name}"
        assert command in err, err[-3000:]
        # (the resumed server may still take the delete that it never answered, and its
        # garbage collector the rest: the command is what the user has either way)
        _kubectl(kubeconfig, *command.split()[1:])  # the command as named
        _nothing_left(kubeconfig)
    finally:
        _stop(procs, emulator, tmp_path)
