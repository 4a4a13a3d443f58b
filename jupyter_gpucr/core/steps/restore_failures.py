"""Why a CRIU restore failed, in words a user can act on (a port the process had is taken, and by
whom), and the two failures a second attempt gets past (a log that grew after the checkpoint, a
UNIX socket name still held)."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psutil

from ..criu.commands import UNIX_NAME_TAKEN
from ..criu.images import read_image
from ..errors import GPUCRError
from ..files import copy_data
from ..process.portholders import sockets_on

#: What a restore keeps of a log that grew after a --leave-running checkpoint (see rewind_grown_log).
KEPT_GROWTH = 64 << 20


def port_holders(images: Path, line: str) -> list[tuple[int, str, str, int | None]]:
    """For a restore that found a port of the process taken: which (port, address), by whom (in
    words, and the PID when known); root sees every process's sockets, a user's server its own.

    Any socket whose own port is one the process had counts, in any state: listening, bound only,
    connected (``portholders``). A closed connection's TIME_WAIT leftover has no process: it is
    named (``who`` "") only for a port nothing else holds. This process's own sockets are left
    out: a server holds a suspended kernel's ports with SO_REUSEPORT, beside which CRIU binds."""
    if "Address already in use" not in line:
        return []
    try:
        ports = {s.port for s in read_image(images).inet if s.port}
        holders = [h for h in sockets_on(ports) if h.pid != os.getpid()]
    except (GPUCRError, psutil.Error, OSError):
        return []
    said = set()
    closing = {}
    for h in holders:
        if h.state == "TIME_WAIT":
            closing[h.port] = h.ip
            continue
        try:
            proc = psutil.Process(h.pid) if h.pid else None
            who = f"PID {proc.pid} of {proc.username()} (uid {proc.uids().real})" if proc else "a process not visible here"
        except psutil.Error:
            who = f"PID {h.pid}"
        if h.state == "LISTEN":
            what = ""
        elif h.peer:
            what = f", in its connection to {h.peer[0]}:{h.peer[1]}"
        else:
            what = ", bound, not listening"
        said.add((h.port, h.ip, who + what, h.pid))
    taken = {h[0] for h in said}
    said |= {(port, ip, "", None) for port, ip in closing.items() if port not in taken}
    return sorted(said, key=lambda h: (h[0], h[1], h[2]))


def port_hint(holders: list[tuple[int, str, str, int | None]]) -> str:
    """What to do about the holders :func:`port_holders` found ("" for none)."""
    if not holders:
        return ""
    if all(not who for _port, _ip, who, _pid in holders):
        return "Retry in a minute, once the closed connection is gone. The checkpoint is kept."
    return "Stop that process, or wait until it lets the port go, then retry. The checkpoint is kept."


def restore_summary(summary: str, holders: list[tuple[int, str, str, int | None]]) -> str:
    """A failed restore's cause in plain words: the port and its holder when a port was taken
    ("Port 43463 is used by PID 22484"), else what the CRIU log said, else that it failed."""
    if holders:
        port, _ip, who, pid = holders[0]
        more = f" (and {len(holders) - 1} more)" if len(holders) > 1 else ""
        if not who:
            return f"A recent connection on port {port} is still closing" + more
        return f"Port {port} is used by " + (f"PID {pid}" if pid else "another process") + more
    return summary or "The kernel's process could not be recreated"


def unix_name_still_held(line: str) -> bool:
    """A UNIX socket name the process had bound is still taken. Seen once on the H200,
    restoring right after the dumped process was killed; not understood yet (a socket whose last
    reference is in flight lingers until the kernel's unix garbage collector frees it). Wait a
    moment and say retry; a second failure is reported."""
    if not re.search(UNIX_NAME_TAKEN, line):
        return False
    time.sleep(1.0)
    return True


def rewind_grown_log(line: str, proc_dir: Path) -> bool:
    """A log the process writes grew after a --leave-running checkpoint: keep the newer output
    beside it (what it holds past the recorded size, the newest ``KEPT_GROWTH`` bytes of it: the
    process can have grown it to any size, with holes) and cut the file back to the size CRIU
    recorded, so the restore can proceed."""
    m = re.search(r"File (\S+) has bad size (\d+) \(expect (\d+)\)", line)
    if not m:
        return False
    path = Path("/" + m.group(1).lstrip("/"))
    if path.parent != proc_dir or not path.exists():
        return False
    expect = int(m.group(3))
    if path.stat().st_size > expect:
        copy_data(path, Path(f"{path}.{time.time_ns()}"), expect, KEPT_GROWTH)
    os.truncate(path, expect)
    return True
