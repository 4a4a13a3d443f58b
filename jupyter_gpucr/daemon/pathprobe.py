"""Open paths the way their owner could, never through a symbolic link, and say what each is.

The daemon runs this as the owner of a checkpoint (their uid, gid and groups) before it lets root's
CRIU reopen the checkpoint's files by path: each path is walked one component at a time with
``O_PATH | O_NOFOLLOW`` (a link anywhere in it is refused, so a file swapped for a link to a
root-only file is never reached), then the owner's access to what was found is checked. What comes
back (device and inode of each file) lets the daemon check, once CRIU has restored the tree and
before it runs, that every file the tree holds is one of these.

    python -I -S pathprobe.py < [[path, access, "file"|"bind"], ...]  ->  [{...}, ...]

Standard library only, run as a plain script like the holder.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any

_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """Why the owner may not have this path, in words."""


def _walk(parts: list[str]) -> int:
    """An O_PATH descriptor of ``/parts...``, reached without following any link."""
    fd = os.open("/", _WALK | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", ".."):
                raise Refused("the path is not canonical")
            try:
                nxt = os.open(part, _WALK, dir_fd=fd)
            except PermissionError:
                raise Refused(f"its owner may not enter /{'/'.join(parts[:i])}") from None
            except FileNotFoundError:
                raise Refused("it does not exist") from None
            os.close(fd)
            fd = nxt
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise Refused(f"/{'/'.join(parts[:i + 1])} is a symbolic link now")
        return fd
    except BaseException:
        os.close(fd)
        raise


def probe_file(path: str, access: int) -> dict[str, Any]:
    """The file at ``path`` if its owner may ``access`` it (``os.access`` bits)."""
    fd = _walk(path.strip("/").split("/") if path != "/" else [])
    try:
        st = os.fstat(fd)
        if access and not os.access(f"/proc/self/fd/{fd}", access):
            raise Refused(f"its owner may not {verbs(access)} it")
        return {"dev": st.st_dev, "ino": st.st_ino, "mode": st.st_mode}
    finally:
        os.close(fd)


def probe_bind(path: str) -> dict[str, Any]:
    """Whether its owner may create a UNIX socket at ``path`` (the restore binds one there): the
    folder writable by them, and nothing there but an old socket of theirs."""
    parent, _, name = path.rstrip("/").rpartition("/")
    fd = _walk(parent.strip("/").split("/") if parent else [])
    try:
        if not os.access(f"/proc/self/fd/{fd}", os.W_OK | os.X_OK):
            raise Refused(f"its owner may not create files in {parent or '/'}")
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return {}
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            raise Refused("something other than its owner's socket is there now")
        return {}
    finally:
        os.close(fd)


def verbs(access: int) -> str:
    """``os.access`` bits in words."""
    words = [w for bit, w in ((os.R_OK, "read"), (os.W_OK, "write"), (os.X_OK, "enter or run")) if access & bit]
    return " and ".join(words) or "reach"


def probe(requests: list[list[Any]]) -> list[dict[str, Any]]:
    """One answer per ``[path, access, kind]``: the file's facts, or ``{"refused": why}``."""
    out = []
    for path, access, kind in requests:
        try:
            out.append(probe_bind(path) if kind == "bind" else probe_file(path, int(access)))
        except Refused as e:
            out.append({"refused": str(e)})
        except OSError as e:
            out.append({"refused": e.strerror or str(e)})
    return out


if __name__ == "__main__":
    json.dump(probe(json.load(sys.stdin)), sys.stdout)
