"""What of the requesting process's confinement a process the daemon starts for it keeps.

Read from ``/proc/PID`` of the socket's peer (as root, so every id is the host's): its
no_new_privs flag, its supplementary groups and its cgroup (v2). The daemon's ``run`` gives the
launched process the same flag, no group the caller lacked (nor one the group database does not
give the user), and the caller's cgroup where the daemon can move it there; a restore puts the
tree back into the cgroup of the process that asked for it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import StateError
from ..core.process.procs import tree
from .guard import Owner


@dataclass(frozen=True)
class Caller:
    """The confinement a launch for one request keeps."""

    no_new_privs: bool
    groups: tuple[int, ...]  # the supplementary groups the launched process gets
    cgroup: str | None  # the caller's cgroup (v2), as a folder of the mounted hierarchy

    def dropexec_args(self) -> list[str]:
        args = [f"--groups={','.join(map(str, self.groups))}"]
        if self.no_new_privs:
            args.append("--no-new-privs")
        if self.cgroup:
            args.append(f"--cgroup={self.cgroup}")
        return args


def caller_of(pid: int, owner: Owner) -> Caller:
    """The confinement of process ``pid``, which must still run as ``owner`` (the socket's peer:
    a peer gone by now, its PID maybe reused, is refused rather than guessed at)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = {k: v.split() for k, _, v in (line.partition(":") for line in f)}
    except OSError:
        status = {}
    if not status or int(status["Uid"][0]) != owner.uid:
        raise StateError(f"The requesting process {pid} is gone.", "Send the request again from a running process.")
    groups = tuple(sorted(owner.groups & {int(g) for g in status.get("Groups", [])}))
    return Caller(status.get("NoNewPrivs", ["0"])[0] == "1", groups, cgroup_of(pid))


def cgroup_of(pid: int) -> str | None:
    """The cgroup v2 folder of ``pid`` under the mounted hierarchy; None without one."""
    mount = _cgroup2_mount()
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            path = next((line.rstrip("\n")[3:] for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or path is None or not path.startswith("/") or "/.." in path or path.endswith(" (deleted)"):
        return None
    return os.path.normpath(mount + path)


def move_tree(root: int, folder: str, rounds: int = 5) -> bool:
    """Move the process tree rooted at ``root`` into the cgroup ``folder`` (a restored tree comes
    back in the daemon's); walked again while a process forked meanwhile was left behind. Whether
    every process is there."""
    for _ in range(rounds):
        left = [p for p in tree(root) if cgroup_of(p) not in (folder, None)]
        if not left:
            return True
        try:
            for p in left:
                with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                    f.write(str(p))
        except ProcessLookupError:
            continue  # it ended
        except OSError:
            return False
    return False


def _cgroup2_mount() -> str | None:
    """Where the whole cgroup v2 hierarchy is mounted (its root, as /proc/PID/cgroup paths start)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                dash = fields.index("-")
                if fields[dash + 1] == "cgroup2" and fields[3] == "/":
                    return fields[4]
    except (OSError, ValueError):
        return None
    return None
