"""What /proc says about processes: CPU (own and reaped children's), PSS, sockets, load.

Standard library only (psutil is not a dependency of the farm). Linux only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cpu:
    """Seconds of CPU: the process's own (every thread), and its waited-for children's."""

    own: float = 0.0
    children: float = 0.0

    def __add__(self, other: Cpu) -> Cpu:
        return Cpu(self.own + other.own, self.children + other.children)

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.own - other.own, self.children - other.children)


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # After the command name's closing parenthesis: state(0) ppid(1) ... utime(11) stime(12)
    # cutime(13) cstime(14) ... starttime(19).
    return data.rpartition(b")")[2].split()


def cpu(pid: int) -> Cpu | None:
    """CPU of one process from /proc/<pid>/stat (clock ticks: 10 ms resolution)."""
    f = _stat_fields(pid)
    if f is None or len(f) < 15:
        return None
    return Cpu(
        (int(f[11]) + int(f[12])) / CLK_TCK,
        (int(f[13]) + int(f[14])) / CLK_TCK,
    )


def ppid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[1]) if f else None


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def children_map() -> dict[int, list[int]]:
    """ppid -> [pid, ...] for every process now."""
    found: dict[int, list[int]] = {}
    for pid in all_pids():
        parent = ppid(pid)
        if parent is not None:
            found.setdefault(parent, []).append(pid)
    return found


def farm_pids(roots: list[int], *, with_children: bool) -> list[int]:
    """The roots, and (for Celery workers) their direct children: the prefork pool processes.

    Bed commands are children of the pool process (or of an embedded farm process): never
    counted here; their CPU shows as the parent's `children` once they are reaped.
    """
    pids = [p for p in roots if os.path.exists(f"/proc/{p}")]
    if with_children:
        kids = children_map()
        for root in roots:
            pids.extend(kids.get(root, []))
    return pids


def total_cpu(pids: list[int]) -> dict[int, Cpu]:
    """CPU of each process still alive."""
    found = {}
    for pid in pids:
        value = cpu(pid)
        if value is not None:
            found[pid] = value
    return found


def cpu_delta(before: dict[int, Cpu], after: dict[int, Cpu]) -> Cpu:
    """What the processes spent between two samples (a process gone by then counts as nothing;
    one that appeared counts whole)."""
    spent = Cpu()
    for pid, value in after.items():
        spent = spent + (value - before.get(pid, Cpu()))
    return spent


def pss_mb(pid: int) -> float | None:
    """Proportional set size (MB) from /proc/<pid>/smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def socket_owners() -> dict[int, set[int]]:
    """TCP local port -> every pid holding that socket (a socket inherited across fork is held by
    both processes), for every socket this user can see (for pg_stat_activity.client_port)."""
    inode_port: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    port = int(parts[1].rsplit(":", 1)[1], 16)
                    inode_port[parts[9]] = port
        except OSError:
            continue
    owners: dict[int, set[int]] = {}
    for pid in all_pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                port = inode_port.get(target[8:-1])
                if port is not None:
                    owners.setdefault(port, set()).add(pid)
    return owners


def loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg") as fh:
        a, b, c = fh.read().split()[:3]
    return float(a), float(b), float(c)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK
