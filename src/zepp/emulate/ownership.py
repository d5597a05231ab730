"""Which network namespaces are zepp's, and which emulated cluster each belongs to.

A cluster zepp builds gets a random id. Two marks record it:

- in every namespace of the cluster, the alias of its loopback device (``ip link set lo alias``)
  reads ``zepp-cluster prefix={prefix} id={id}``. The mark lives and dies with the namespace,
  cannot be left behind by a crash, and is set right after ``ip netns add``, before anything
  else happens in the namespace;
- a record ``{RECORD_DIR}/cluster-{prefix}.json`` (``/run/zepp`` by default, ``$ZEPP_RUN_DIR``
  overrides) holds the shape, the rate, the state (``building`` until every link and qdisc
  exists, then ``up``), whether the cluster is kept after its creator ends (``zepp cluster up``)
  or belongs to one run, and the creator's pid and start time.

``zepp cluster down/status`` and ``zepp run --emulate`` act only on namespaces whose mark
names their prefix (``down --id`` only on one cluster's); a namespace with the prefix but
without the mark (made by hand, say ``zepp-foreign``) is left alone and reported as skipped.
``prefix_lock`` serialises ``up`` and ``down`` of one prefix between processes (``flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
from dataclasses import dataclass, field

from zepp.emulate.iproute import sh, tool
from zepp.launch.processes import proc_start
from zepp.errors import EmulationError, ZeppInputError

PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")
_MARK_RE = re.compile(r"^zepp-cluster prefix=(?P<prefix>[a-z][a-z0-9]*) id=(?P<id>[0-9a-f]+)$")


def record_dir() -> str:
    return os.environ.get("ZEPP_RUN_DIR", "/run/zepp")


def check_prefix(prefix: str) -> str:
    """``prefix`` if valid, else ``ZeppInputError`` saying what a prefix may be."""
    if not isinstance(prefix, str) or not PREFIX_RE.match(prefix):
        raise ZeppInputError(f"emulated cluster prefix {prefix!r}: use 1-6 lowercase letters/digits, starting with a "
                             "letter (it goes into interface names of at most 15 characters)")
    return prefix


def new_id() -> str:
    return secrets.token_hex(8)


def mark_text(prefix: str, cluster_id: str) -> str:
    return f"zepp-cluster prefix={prefix} id={cluster_id}"


def set_mark(ns: str, prefix: str, cluster_id: str) -> None:
    sh([tool("ip"), "-n", ns, "link", "set", "lo", "alias", mark_text(prefix, cluster_id)])


def read_mark(ns: str) -> tuple[str, str] | None:
    """``(prefix, id)`` from the mark of namespace ``ns``; None when it carries none."""
    proc = sh([tool("ip"), "-n", ns, "-j", "link", "show", "lo"], check=False)
    try:
        alias = json.loads(proc.stdout or "[]")[0].get("ifalias") or ""
    except (ValueError, IndexError, AttributeError):
        return None
    m = _MARK_RE.match(alias)
    return (m["prefix"], m["id"]) if m else None


def all_namespaces() -> list[str]:
    proc = sh([tool("ip"), "-j", "netns", "list"], check=False)
    try:
        return sorted(e["name"] for e in json.loads(proc.stdout or "[]"))
    except (ValueError, KeyError, TypeError):
        return sorted(line.split()[0] for line in proc.stdout.splitlines() if line.strip())


@dataclass
class Scan:
    """The namespaces named ``{prefix}-*``: ``owned`` maps each of zepp's (mark naming this
    prefix) to its cluster id; ``foreign`` lists the rest (left alone)."""

    prefix: str
    owned: dict[str, str] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)

    def of(self, cluster_id: str | None) -> list[str]:
        """Owned namespaces of one cluster (all owned ones when ``cluster_id`` is None)."""
        return sorted(ns for ns, i in self.owned.items() if cluster_id is None or i == cluster_id)

    @property
    def ids(self) -> list[str]:
        return sorted(set(self.owned.values()))


def scan(prefix: str) -> Scan:
    check_prefix(prefix)
    out = Scan(prefix)
    for ns in all_namespaces():
        if not ns.startswith(f"{prefix}-"):
            continue
        mark = read_mark(ns)
        if mark is not None and mark[0] == prefix:
            out.owned[ns] = mark[1]
        else:
            out.foreign.append(ns)
    return out


def remove_marked(prefix: str, cluster_id: str | None) -> list[str]:
    """Kill the processes in, then delete, the marked namespaces of ``prefix`` (of one cluster
    when ``cluster_id`` is given). Caller holds the prefix lock."""
    ip = tool("ip")
    names = scan(prefix).of(cluster_id)
    for ns in names:
        # rank processes orphaned by a crashed launcher may still run in there: end them by pid
        for pid in sh([ip, "netns", "pids", ns], check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh([ip, "netns", "del", ns], check=False)
    left = scan(prefix).of(cluster_id)
    if left:
        raise EmulationError(f"could not delete namespaces {left}")
    return names


# ---------------------------------------------------------------------------------------------
# records


def record_path(prefix: str) -> str:
    return os.path.join(record_dir(), f"cluster-{check_prefix(prefix)}.json")


def read_record(prefix: str) -> dict | None:
    try:
        with open(record_path(prefix)) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) and rec.get("prefix") == prefix else None
    except (OSError, ValueError):
        return None


def write_record(prefix: str, rec: dict) -> str:
    path = record_path(prefix)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def remove_record(prefix: str, cluster_id: str | None = None) -> None:
    """Remove the record of ``prefix`` (only if it is cluster ``cluster_id``'s, when given)."""
    rec = read_record(prefix)
    if rec is not None and cluster_id is not None and rec.get("id") != cluster_id:
        return
    with contextlib.suppress(OSError):
        os.unlink(record_path(prefix))


def owner_alive(rec: dict) -> bool:
    """Whether the process that made the cluster of ``rec`` still runs (same pid, same start)."""
    pid = rec.get("owner_pid")
    return isinstance(pid, int) and proc_start(pid) is not None and proc_start(pid) == rec.get("owner_start")


def owner_fields() -> dict:
    return {"owner_pid": os.getpid(), "owner_start": proc_start(os.getpid())}


def lock_path(prefix: str) -> str:
    return os.path.join(record_dir(), f"cluster-{check_prefix(prefix)}.lock")


@contextlib.contextmanager
def prefix_lock(prefix: str):
    """Exclusive lock of ``prefix`` while building or removing its cluster, across processes
    (``flock`` on ``{RECORD_DIR}/cluster-{prefix}.lock``). Clusters of other prefixes do not
    wait. The lock file is removed on release when the prefix has no record left; a process
    that opened the file before it was removed sees that (another inode) and opens it anew."""
    path = lock_path(prefix)
    os.makedirs(record_dir(), mode=0o755, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        if not os.path.exists(record_path(prefix)):
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)
