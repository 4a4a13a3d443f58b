"""CRIU's post-restore action script: the restored tree holds only the files the daemon approved.

CRIU runs its action scripts at each stage of a restore; at ``post-restore`` every task has its
files, mappings, working folder and executable back but still runs as root, stopped in CRIU's
hands, and a non-zero exit makes CRIU kill the whole tree. Here every file the tree holds must
be one the daemon found, as the owner and without following links, before CRIU started
(``guard.RestoreGuard.approve``): same device and inode. A path the owner changed in between
(say, a link to a root-only file) is caught before the tree runs, and before it has the owner's
credentials, so the owner never reaches that file through it (not even via /proc/PID/fd).

    criu restore ... --action-script 'python -I -S restorecheck.py APPROVED_JSON'

APPROVED_JSON: {"inodes": [[dev, ino], ...], "proc_paths": [...], "fds": {pid: [fd, ...]}}, the
descriptors each process gets back (at this stage it also holds CRIU's own, closed later). Why a tree was refused is
written beside it (``REFUSED``). Standard library only, run as a plain script like the holder.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

REFUSED = "restore-refused.json"
# What a descriptor or mapping may point at without being a file of the image: pipes, sockets,
# anonymous inodes, memfds, anonymous shared memory, SysV shared memory.
NOT_A_PATH = re.compile(r"^(pipe|socket|anon_inode|net|mnt|pidfd):|^/memfd:|^/dev/zero \(deleted\)$|^/SYSV[0-9a-f]{8} \(deleted\)$")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def links_of(pid: int, fds: list[int]) -> list[Path]:
    base = Path(f"/proc/{pid}")
    links = [base / "cwd", base / "root", base / "exe", *(base / "fd" / str(fd) for fd in fds)]
    try:
        links += list((base / "map_files").iterdir())
    except FileNotFoundError:
        pass
    return links


def unapproved(pid: int, inodes: set[tuple[int, int]], proc_paths: set[str], fds: dict[int, list[int]]) -> str | None:
    """The first file the tree rooted at ``pid`` holds that was not approved, or None."""
    for p in tree(pid):
        for link in links_of(p, fds.get(p, [])):
            try:
                target = os.readlink(link)
                st = os.stat(link)
            except (FileNotFoundError, ProcessLookupError):
                continue
            if NOT_A_PATH.match(target) or (st.st_dev, st.st_ino) in inodes or target in proc_paths:
                continue
            return f"The restored process {p} came back holding {target}, which is not a file it had at the checkpoint: " \
                   "a path was changed while it was restored. It was ended before it ran."
    return None


def main(approved_path: str) -> int:
    if os.environ.get("CRTOOLS_SCRIPT_ACTION") != "post-restore":
        return 0
    try:
        with open(approved_path) as f:
            approved = json.load(f)
        why = unapproved(int(os.environ["CRTOOLS_INIT_PID"]), {(d, i) for d, i in approved["inodes"]},
                         set(approved["proc_paths"]), {int(p): fds for p, fds in approved["fds"].items()})
    except (OSError, ValueError, KeyError) as e:  # a tree that cannot be checked is not restored
        why = f"The restored process could not be checked ({e}); it was ended before it ran."
    if why is None:
        return 0
    fd = os.open(Path(approved_path).with_name(REFUSED), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"refused": why}, f)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
