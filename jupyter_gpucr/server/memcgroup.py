"""The memory cgroup whose limit this server's kernels live under, if any.

A single-user server started by KubeSpawner, systemd (``MemoryMax``) or a container runtime runs
in a memory cgroup; its kernels are its children and inherit it. When their memory passes the
limit the kernel's OOM killer kills one of them (the largest, a kernel) and its state is lost.
This module finds that cgroup (v2, or v1's ``memory`` hierarchy), the tightest limit among it and
its ancestors, and the files that say the cgroup is under pressure; :mod:`.pressure` watches them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

#: What a v1 cgroup without a limit reports (PAGE_COUNTER_MAX pages), or more: no limit.
V1_NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class MemoryCgroup:
    """The cgroup whose memory limit applies to this process."""

    version: int  # 1 or 2
    folder: Path  # where its files are
    limit: int  # bytes

    def oom_kills(self) -> int:
        """How many processes the OOM killer has killed in it."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _counters((self.folder / name).read_text()).get("oom_kill", 0)


def find(proc: Path = Path("/proc/self")) -> MemoryCgroup | None:
    """The memory cgroup with the tightest limit among the process's own and its ancestors; None
    where none has a limit below the host's memory (or the files cannot be read)."""
    try:
        cgroups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    ram = psutil.virtual_memory().total
    for version, folder in _memory_cgroup_folders(cgroups, mounts):
        best: MemoryCgroup | None = None
        for ancestor in _up_to_mount(folder):
            limit = _limit(version, ancestor)
            if limit is not None and limit < ram and (best is None or limit < best.limit):
                best = MemoryCgroup(version, ancestor, limit)
        if best is not None:
            return best
    return None


def _memory_cgroup_folders(cgroups: list[str], mounts: list[str]) -> list[tuple[int, Path]]:
    """Where the process's memory cgroup is mounted: v1's ``memory`` hierarchy first (on a hybrid
    host it holds the controller), then v2's unified one."""
    v1_path = next((line.split(":", 2)[2] for line in cgroups
                    if "memory" in line.split(":", 2)[1].split(",")), None) if cgroups else None
    v2_path = next((line.split(":", 2)[2] for line in cgroups if line.startswith("0::")), None)
    out: list[tuple[int, Path]] = []
    for line in mounts:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, options = line.split(" - ", 1)[1].split()[:3]
        root, mount_point = fields[3], Path(fields[4])
        if fstype == "cgroup" and "memory" in options.split(",") and v1_path is not None:
            out.insert(0, (1, _inside(mount_point, root, v1_path)))
        elif fstype == "cgroup2" and v2_path is not None:
            out.append((2, _inside(mount_point, root, v2_path)))
    return [(v, f) for v, f in out if f.is_dir()]


def _inside(mount_point: Path, root: str, path: str) -> Path:
    """The folder of cgroup ``path`` under a mount of the hierarchy's ``root`` (in a cgroup
    namespace the path is relative to it already)."""
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root):]
    return mount_point / path.lstrip("/")


def _up_to_mount(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that are cgroups of the same hierarchy."""
    out = [folder]
    while (folder.parent / "cgroup.procs").exists() and folder.parent != folder:
        folder = folder.parent
        out.append(folder)
    return out


def _limit(version: int, folder: Path) -> int | None:
    try:
        text = (folder / ("memory.max" if version == 2 else "memory.limit_in_bytes")).read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    limit = int(text)
    return None if limit >= V1_NO_LIMIT else limit


def _counters(text: str) -> dict[str, int]:
    """``name value`` lines (``memory.events``, ``memory.oom_control``) as a dict."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out
