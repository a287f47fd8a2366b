"""Every rank's recent collectives, kept where its agent can read them even if the rank is stuck.

torch 2.13 has a flight recorder for gloo and NCCL process groups alike: with
``TORCH_FR_BUFFER_SIZE`` set before a group is created, every collective on every group
(the runtime's, a script's own ``torch.distributed`` calls, DDP's, Hugging Face's) is recorded
in C++ with its group, per-group sequence number, operation, sizes, dtypes and whether it
completed (gloo's entries and NCCL's come from two dump functions; both are read). zlaunch
uses it rather than a record of its own: it sees collectives no Python
wrapper would (``from torch.distributed import all_reduce`` before any patch, C++ callers).

The recorder lives in the rank's memory, and a rank stuck in a collective, or stopped, cannot
be asked for it. So `start_watch` (called by ``zlaunch.worker.boot`` before the script)
starts a daemon thread that wakes every `POLL` seconds and, once ``torch.distributed`` is
initialised, writes the last `RING` records of every group to a file the agent named
(``ZLAUNCH_COLLECTIVES_FILE``) whenever they changed. The thread touches torch only through
``sys.modules``: a script that never imports torch pays for one idle thread, and this module
stays standard-library only (it runs on the agent side too). On a stacks request the agent
reads the file (`read_records`) and sends it upstream with the stacks: a SIGSTOPped rank's
file still says what it last did.

The same thread finds the common hang early (`collective_mismatch`): once a collective has
waited `MISMATCH_AFTER` seconds, the rank posts its position in the job's store and reads a
few peers' (`peers_to_ask`); two ranks at the same sequence number of a group in different operations (or sizes)
will never meet, and the rank says so at once (stderr and a ``collective_mismatch`` event)
instead of after ``--hang-timeout``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from typing import Any

from zlaunch.wire import COLLECTIVES_FILE_ENV, EVENTS_FD_ENV, events

__all__ = [
    "RING",
    "SAME_SIZES_OPS",
    "RecordFiles",
    "collective_key",
    "collective_mismatch",
    "enable_flight_recorder",
    "normalize",
    "peers_to_ask",
    "read_records",
    "start_watch",
]

RING = 16
"""Records kept per process group in the file (the recorder's own buffer is larger)."""
FR_BUFFER = 64
"""Entries torch's flight recorder keeps (all groups together) when the user set none."""
POLL = 0.5
"""Seconds between two looks at the recorder."""
MISMATCH_AFTER = 1.0
"""Seconds a collective waits before its rank compares positions with its peers."""
PEERS_ASKED = 4
"""Peers whose position a waiting rank reads (the group's first rank and its next ones)."""
MAX_FILE_BYTES = 4 * 1024 * 1024
"""The most of a rank's records file its agent reads; the writer keeps fewer records per group
to stay below it (a world group of 16k ranks names them in every record). With escaping the
event still fits a frame (zlaunch/wire/frames.py MAX_FRAME_BYTES)."""
MAX_DEPTH = 6
"""Nesting of the records list the agent forwards: records, a record, its sizes, a shape."""
_FR_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_STORE_PREFIX = "zlaunch_collective"


def enable_flight_recorder(environ: Any = os.environ) -> None:
    """Turn torch's flight recorder on for groups created from now on (unless the user
    chose a size, 0 included)."""
    if not any(name in environ for name in _FR_ENVS):
        environ[_FR_ENVS[0]] = str(FR_BUFFER)


# ---- records: the flight recorder's entries in our terms (pure) ----------------------------


def normalize(
    entries: list[dict], group_ranks: dict[str, list[int]], ring: int = RING
) -> list[dict]:
    """The flight recorder's entries as records, the last ``ring`` of each group, oldest first:
    ``group`` (name), ``ranks``, ``seq`` (per group), ``op``, ``sizes``, ``dtypes``, ``state``
    (``issued`` or ``completed``), ``time`` (seconds since the epoch, when issued)."""
    out: dict[str, list[dict]] = {}
    for entry in entries:
        pg = entry.get("process_group") or ["", ""]
        name = str(pg[0])
        p2p = bool(entry.get("is_p2p"))
        op = str(entry.get("profiling_name", "?")).split(":", 1)[-1]
        done = bool(entry.get("retired")) or entry.get("state") == "completed"
        out.setdefault(name, []).append(
            {
                "group": name,
                "desc": str(pg[1]) if len(pg) > 1 else "",
                "ranks": group_ranks.get(name, []),
                "seq": int(entry.get("p2p_seq_id" if p2p else "collective_seq_id", 0)),
                "op": op,
                "sizes": entry.get("input_sizes", []),
                "dtypes": entry.get("input_dtypes", []),
                "state": "completed" if done else "issued",
                "time": round(int(entry.get("time_created_ns", 0)) / 1e9, 3),
            }
        )
    records = []
    for group in out.values():
        group.sort(key=lambda r: r["seq"])
        records.extend(group[-ring:])
    return records


SAME_SIZES_OPS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "broadcast",
        "reduce",
        "all_gather",
        "allgather",
        "all_gather_into_tensor",
        "_allgather_base",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
    }
)
"""Operations whose input sizes are the same on every rank (scatter, gather and all_to_all
legitimately differ between ranks: for them only the operation is compared)."""


def collective_key(record: dict) -> tuple:
    """What must be the same on every rank at one position of a group: the operation, and its
    sizes where they must agree."""
    sizes = str(record.get("sizes")) if record.get("op") in SAME_SIZES_OPS else ""
    return (record.get("seq"), record.get("op"), sizes)


def collective_mismatch(mine: dict, peers: dict[int, dict]) -> dict[int, dict]:
    """The peers (rank -> their latest record in ``mine``'s group) at ``mine``'s sequence
    number in another operation or with other sizes: they will never meet ``mine``."""
    return {
        rank: peer
        for rank, peer in peers.items()
        if peer.get("seq") == mine["seq"] and collective_key(peer) != collective_key(mine)
    }


# ---- the rank's side: the thread that writes the file --------------------------------------


def start_watch(environ: Any = os.environ) -> bool:
    """Keep the agent's file of this rank's collectives up to date; True when started."""
    path = environ.get(COLLECTIVES_FILE_ENV, "")
    if not path:
        return False
    enable_flight_recorder(environ)
    fd = environ.get(EVENTS_FD_ENV, "")
    watch = _Watch(path, int(fd) if fd.isdigit() else None)
    threading.Thread(target=watch.run, name="zlaunch-collectives", daemon=True).start()
    return True


class _Watch:
    def __init__(self, path: str, events_fd: int | None):
        self.path = path
        self.events_fd = events_fd
        self.last_dump: bytes | None = None
        self.rank: int | None = None
        self.latest: dict[str, dict] = {}
        self.posted: dict[str, tuple] = {}
        self.reported: set[tuple] = set()

    def run(self) -> None:
        while True:
            time.sleep(POLL)
            dist = sys.modules.get("torch.distributed")
            try:
                if dist is None or not dist.is_available() or not dist.is_initialized():
                    continue
                self.look(dist)
            except Exception:  # never take the rank down: the records are a diagnosis aid
                continue

    def look(self, dist: Any) -> None:
        dumps = _recorder_dumps(sys.modules["torch"]._C._distributed_c10d)
        dump = b"\n".join(dumps)
        if dump != self.last_dump:
            self.last_dump = dump
            self.rank = dist.get_rank()
            entries: list[dict] = []
            config: dict = {}
            for raw in map(json.loads, dumps):
                entries.extend(raw.get("entries") or [])
                config.update(raw.get("pg_config") or {})
            group_ranks = _group_ranks(dist, {"pg_config": config})
            ring = RING
            while True:  # fewer records per group rather than a file its agent refuses
                records = normalize(entries, group_ranks, ring)
                text = json.dumps({"rank": self.rank, "records": records})
                if len(text) <= MAX_FILE_BYTES or ring == 1:
                    break
                ring //= 2
            _write_atomically(self.path, text)
            self.latest = _latest_per_group(records)
        self.compare(dist)

    def compare(self, dist: Any) -> None:
        """Post our position once a collective has waited long enough, and hold it against
        the peers' posts: a mismatch is said at once, once."""
        latest = self.latest
        now = time.time()
        waiting = {
            g: r
            for g, r in latest.items()
            if r["state"] == "issued" and now - r["time"] >= MISMATCH_AFTER
        }
        if not waiting and not self.posted:
            return
        store = dist.distributed_c10d._get_default_store()
        for group, record in latest.items():
            position = (record["seq"], record["op"], record["state"])
            if (group in waiting or group in self.posted) and self.posted.get(group) != position:
                store.set(f"{_STORE_PREFIX}/{group}/{self.rank}", json.dumps(record))
                self.posted[group] = position
        for group, record in waiting.items():
            peers = {}
            for rank in peers_to_ask(record["ranks"], self.rank):
                key = f"{_STORE_PREFIX}/{group}/{rank}"
                if store.check([key]):
                    peers[rank] = json.loads(store.get(key))
            apart = collective_mismatch(record, peers)
            key = (group, record["seq"])
            if apart and key not in self.reported:
                self.reported.add(key)
                self.report(record, apart)

    def report(self, mine: dict, apart: dict[int, dict]) -> None:
        """To the controller, which says it once for every rank (an event), or on stderr when
        no agent listens."""
        # a few peers: one line under PIPE_BUF, so never torn by other events
        peers = {str(r): p for r, p in sorted(apart.items())[:PEERS_ASKED]}
        if events.emit(self.events_fd, events.CollectiveMismatch(mine, peers)):
            return
        others = "; ".join(f"rank {r} in {p['op']} {p['sizes']}" for r, p in sorted(apart.items()))
        sys.stderr.write(
            f"zlaunch: collective mismatch: rank {self.rank} waits in {mine['op']} "
            f"#{mine['seq']} {mine['sizes']} of group {mine['group']} while at the same "
            f"position {others}: the ranks disagree on which collective comes next; this "
            "will hang\n"
        )
        sys.stderr.flush()


def peers_to_ask(group_ranks: list[int], me: int | None) -> list[int]:
    """Whose posts a waiting rank reads: the group's first rank and the next few after it in
    the group's ring. Bounded, so the store sees O(ranks) reads however large the job; and
    enough: when every rank waits and two of them differ, two neighbours in the ring differ,
    and the first of them reads the other's post."""
    if me not in group_ranks:
        return []
    at = group_ranks.index(me)
    ring = group_ranks[at + 1 :] + group_ranks[:at]
    chosen = [group_ranks[0]] + ring[: PEERS_ASKED - 1]
    return [r for r in dict.fromkeys(chosen) if r != me]


def _recorder_dumps(c10d: Any) -> list[bytes]:
    """The flight recorders' JSON: gloo's (and every backend's on a CPU build) and, on a CUDA
    build, NCCL's, which keeps its own recorder and dumps through its own function."""
    dumps = [c10d._dump_fr_trace_json(True, False)]
    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    if nccl is not None:
        try:
            dumps.append(nccl(True, False))
        except Exception:  # no NCCL group yet, or a build without the recorder
            pass
    return dumps


def _latest_per_group(records: list[dict]) -> dict[str, dict]:
    latest: dict[str, dict] = {}
    for record in records:
        if record["group"] not in latest or record["seq"] >= latest[record["group"]]["seq"]:
            latest[record["group"]] = record
    return latest


def _group_ranks(dist: Any, raw: dict) -> dict[str, list[int]]:
    """Group name -> global ranks, from torch's registry of groups (the recorder's own
    ``pg_config`` does not always carry the name)."""
    out: dict[str, list[int]] = {}
    try:
        for pg, name in dist.distributed_c10d._world.pg_names.items():
            out[str(name)] = list(dist.get_process_group_ranks(pg))
    except Exception:
        for name, config in (raw.get("pg_config") or {}).items():
            try:
                out[name] = json.loads(config.get("ranks", "[]"))
            except ValueError:
                pass
    return out


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---- the agent's side ---------------------------------------------------------------------


class RecordFiles:
    """One file per rank of this node, in a directory the agent makes and removes."""

    def __init__(self) -> None:
        self.dir: str | None = None

    def path(self, rank: int) -> str:
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="zlaunch-collectives-")
        return os.path.join(self.dir, f"rank-{rank}.json")

    def event(self, rank: int) -> events.Collectives | None:
        """The ``collectives`` event for the rank, or None if it wrote no records yet."""
        if self.dir is None:
            return None
        return read_records(self.path(rank))

    def remove(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def read_records(path: str) -> events.Collectives | None:
    """The rank's file as a ``collectives`` event; None when there is none yet.

    The rank writes the file, and so may anything it runs: the agent reads at most
    `MAX_FILE_BYTES` of a regular file (not a FIFO that never ends, not a link to
    ``/dev/zero``), nested at most `MAX_DEPTH` deep (``[`` x 100,000 overflowed the decoder's
    stack, and took the agent and its node with it). A file it refuses becomes an event with
    no records and ``unreadable`` saying why, which the controller notes. What the records
    hold is checked where they are used (zlaunch/launcher/hang_records.py).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:  # a link (ELOOP), no permission
        return _unreadable(f"cannot open it: {err.strerror}", 0.0)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _unreadable("not a regular file", st.st_mtime)
        if st.st_size > MAX_FILE_BYTES:
            return _unreadable(f"{st.st_size} bytes, over {MAX_FILE_BYTES}", st.st_mtime)
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as err:
        return _unreadable(f"cannot read it: {err.strerror}", 0.0)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        return _unreadable(f"over {MAX_FILE_BYTES} bytes", st.st_mtime)
    try:
        payload = json.loads(data)
    except RecursionError:
        return _unreadable(f"nested deeper than {MAX_DEPTH} levels", st.st_mtime)
    except ValueError:
        return _unreadable("not JSON", st.st_mtime)
    records = payload.get("records") if isinstance(payload, dict) else None
    if not isinstance(records, list):
        return _unreadable('not an object with a "records" list', st.st_mtime)
    if _deeper_than(records, MAX_DEPTH):
        return _unreadable(f"nested deeper than {MAX_DEPTH} levels", st.st_mtime)
    return events.Collectives(records, round(st.st_mtime, 3))


def _unreadable(why: str, written: float) -> events.Collectives:
    return events.Collectives([], round(written, 3), f"its records file: {why}")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects nest more than ``limit`` deep; iterative, for any depth."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
