"""Process-tree and PID-namespace facts read from /proc (via psutil where it has them)."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection

import psutil


def pidns_of(pid: int | str = "self") -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def in_own_pidns(pid: int) -> bool:
    """True when ``pid`` lives in a PID namespace other than ours (a gpucr holder's)."""
    return pidns_of(pid) != pidns_of()


def ns_pids(pid: int) -> list[int]:
    """The PID of ``pid`` in each nested namespace, outermost first (/proc/PID/status NSpid)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return [pid]


def innermost_pid(pid: int) -> int:
    return ns_pids(pid)[-1]


def is_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants; none once it is gone."""
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    total = 0
    for p in tree(pid):
        try:
            total += psutil.Process(p).memory_info().rss
        except psutil.Error:
            pass
    return total


def find_descendant_by_ns_pid(root: int, ns_pid: int) -> int | None:
    """Host PID of the descendant of ``root`` whose innermost PID is ``ns_pid``."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        try:
            if innermost_pid(child.pid) == ns_pid and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except (OSError, psutil.Error):
            continue
    return None


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.02)
    return not is_alive(pid)


def stop_for_good(pid: int) -> None:
    """End a process tree that a dump left stopped (as CRIU would have at the end of the dump)."""
    try:
        pids = tree(pid)
    except psutil.Error:
        return
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            continue
    wait_gone(pid, 10)


def namespace_init_of(pid: int) -> int | None:
    """Host PID of the init (PID 1) of the namespace ``pid`` runs in as that init's child (a gpucr
    holder's: its command, or a restored tree's root), so that SIGKILL to it ends the whole tree,
    children included. None for a process of this namespace (never the host's init) or one gone."""
    try:
        parent = psutil.Process(pid).ppid()
        if not in_own_pidns(parent) or innermost_pid(parent) != 1:
            return None
    except (psutil.Error, OSError):
        return None
    return parent


def namespace_init(holder_pid: int) -> int | None:
    """Host PID of the init (PID 1) of the namespace that ``unshare`` process ``holder_pid`` made.

    SIGKILL to it from outside ends every process of that namespace at once."""
    try:
        children = psutil.Process(holder_pid).children()
    except psutil.Error:
        return None
    for child in children:
        try:
            if innermost_pid(child.pid) == 1:
                return child.pid
        except OSError:
            continue
    return None


def tcp_connections_to(pid: int, ports: Collection[int]) -> int:
    """How many TCP connections from other processes to its ``ports`` process ``pid`` still
    holds (listening sockets and connections to itself aside: an ipykernel connects to one of its
    own ports); 0 once it is gone."""
    try:
        proc = psutil.Process(pid)
        connections = (getattr(proc, "net_connections", None) or proc.connections)(kind="tcp")  # psutil < 6
    except psutil.Error:
        return 0
    own = {c.laddr.port for c in connections if c.laddr}
    return sum(1 for c in connections
               if c.status != psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports and c.raddr and c.raddr.port not in own)
