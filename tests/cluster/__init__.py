"""A real multi-host test cluster on one machine: network namespaces, each with its own sshd.

Use it as the session-scoped pytest fixture ``cluster`` (``tests/conftest.py``), as a context
manager::

    with Cluster.start(n=3) as c:
        c.run("node2", "hostname").stdout      # "node2\\n", over real ssh
        subprocess.run(["ssh", "-F", c.ssh_config, "node3", "true"])

or from a shell: ``python -m tests.cluster up|status|down`` (run from the repository root).

What it provides:

- ``c.hosts`` (``["node1", "node2", "node3"]``), ``c.address(host)`` (on a random free
  ``10.x.y.0/24``; the controller, i.e. the root namespace, is ``c.controller_address`` = .1),
  ``c.interface`` (``eth0``: the name of every node's interface, for ``GLOO_SOCKET_IFNAME``),
  ``c.namespace(host)``. Where the machine has IPv6 (``c.ipv6``), every node also has
  ``c.address6(host)`` on ``fd5a:x:y::/64`` (the controller ``c.controller_address6``), and sshd
  listens there too.
- ``c.ssh_config``: for ``ssh -F`` and ``zlaunch --ssh-config``. It maps nodeK to its address, user
  root, an ed25519 ``IdentityFile`` (with ``IdentitiesOnly``), a per-run ``UserKnownHostsFile``
  pre-filled with the host keys (so ``StrictHostKeyChecking yes`` holds), ``BatchMode yes``,
  ``ConnectTimeout 5``. paramiko/fabric read it as is:
  ``fabric.Connection("node1", config=fabric.Config(runtime_ssh_path=c.ssh_config))`` picks up
  HostName, User, IdentityFile and ConnectTimeout (pass ``in_stream=False`` to ``.run`` where stdin
  is not readable, as under pytest). fabric itself never reads known_hosts (zlaunch loads the
  files the ssh config names); the lines are plain ``name,address[,address6] keytype key``.
- ``c.run(host, cmd, timeout=10)``: a shell command over ssh, returns ``CompletedProcess``.
  Sessions get sshd's minimal ``PATH``: call ``sys.executable`` by absolute path (the filesystem
  is shared, so the same interpreter and the editable install work on every node).
- ``c.hostfile(slots=2, hosts=None)``: writes ``nodeK slots=S`` lines, returns the path.
- ``c.pids(host)``: processes living in the host's namespace, without sshd; ``c.wait_idle()``
  waits for none to be left; ``c.kill_all()`` kills them (test isolation).

Every name (namespaces, links, ``/etc/netns`` entries, the state directory in /tmp) starts with a
per-run prefix ``zl<owner pid hex>-<2 chars>``. ``close()`` removes everything, and it runs from
the fixture finalizer, the context manager, ``atexit`` and SIGTERM/SIGHUP handlers; leftovers of
a run whose owner died (SIGKILL) are reaped by the next ``Cluster.start`` or ``... down``.
Names resolve inside every node (``/etc/netns/<ns>/hosts``), not in the root namespace: the
controller reaches nodes through the ssh_config, or by address.
"""

from .cluster import Cluster, ClusterError, ipv6_unavailable_reason, unavailable_reason
from .netns import destroy, find_prefixes, reap_stale

__all__ = [
    "Cluster",
    "ClusterError",
    "destroy",
    "find_prefixes",
    "ipv6_unavailable_reason",
    "reap_stale",
    "unavailable_reason",
]
