"""What the daemon checks so that a restore never gives a process more than its owner may have.

The restore itself runs with the owner's credentials (``criu_as_owner``): every file CRIU opens
again, every socket and kernel object it creates, is opened or created as the owner, so what the
owner could not open the restored process cannot get, whatever object held it (a path, a descriptor
in flight, a socket name), and what it creates is the owner's and charged to the owner. This module
is the second line, and what makes that true for the few objects that are not the owner's:

1. every credential in the image is the owner's own (no other uid or gid, no group they lack, no
   capability): CRIU as the owner could not hand out others anyway; this says why up front;
2. no deleted file is to be recreated (the daemon refuses to checkpoint them: see server);
3. files of the owner's store in the daemon (the process's own stdout.log and stderr.log, root's,
   out of the owner's reach) are handed to the restore as descriptors the holder opens, as root,
   on exactly those files (CRIU's ``--inherit-fd``): nothing else of root's reaches the process;
4. afterwards, CRIU's own words for a file the owner may not open become a refusal that says so.
"""
from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..core.criu.images import REMAP_GHOST, REMAP_LINKED, Creds, read_image
from ..core.errors import AccessRefusedError, PreconditionError
from ..core.process.procs import tree

KEPT = "The checkpoint is kept."
#: What /proc/PID/fd shows for descriptors that are not files of a file system.
NOT_A_PATH = re.compile(r"^(pipe|socket|anon_inode|net|mnt|pidfd):|^/memfd:|^/dev/zero \(deleted\)$|^/SYSV[0-9a-f]{8} \(deleted\)$")
#: The process's own files in its folder of the daemon's store: root's, handed to it by the holder.
LOGS = ("stdout.log", "stderr.log")
#: How CRIU names a file it recorded as external (``--external file[MNT_ID:INODE]``, both hex).
_EXTERNAL = re.compile(r"^/?file\[[0-9a-f]+:([0-9a-f]+)\]$")
#: CRIU, run as the owner, could not open or bind what the image names.
_DENIED = re.compile(r"(?:Can't open file|Can't bind|Can't connect|Can't create) (?:inet socket .*?)?(\S+?)(?: on restore)?: "
                     r"(Permission denied|Operation not permitted)")


@dataclass(frozen=True)
class Owner:
    """The user a process belongs to, from the system's user and group databases."""

    uid: int
    gid: int
    groups: frozenset[int]
    name: str

    @classmethod
    def of(cls, uid: int) -> Owner:
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise PreconditionError(f"uid {uid} has no entry in the user database.",
                                    "The daemon serves only users the system knows.") from None
        return cls(uid, pw.pw_gid, frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid)), pw.pw_name)


class RestoreGuard:
    """The checks of the module docstring for one owner; ``trusted``: their store in the daemon."""

    def __init__(self, owner: Owner, trusted: Path) -> None:
        self.owner = owner
        self.trusted = trusted

    def approve(self, images: Path, workdir: Path) -> list[str]:
        """Checks 1 and 2 before CRIU starts; no options of CRIU's are needed after them."""
        image = read_image(images)
        for creds in image.creds:
            self._check_creds(creds)
        for remap in image.remaps:
            if remap.kind in (REMAP_GHOST, REMAP_LINKED):
                what = remap.file.path if remap.file else "a file"
                raise AccessRefusedError(
                    f"The process had {what} open after it was deleted; the gpucr daemon does not recreate deleted "
                    "files for a user.", f"{KEPT} Restore it with a server that runs as its owner, or delete it.")
        return []

    def handed(self, images: Path, proc_dir: Path) -> dict[str, str]:
        """Check 3: the image's files of the daemon's (see :func:`external_files`), each to be opened
        by the holder as itself, from the process's folder of the store (``proc_dir``) only."""
        logs = {_inode(proc_dir / log): str(proc_dir / log) for log in LOGS}
        handed = {}
        for f in read_image(images).files:
            external = _EXTERNAL.match(f.path)
            if external and int(external.group(1), 16) in logs:
                handed[f.path] = logs[int(external.group(1), 16)]
            elif Path(f.path).is_relative_to(self.trusted):  # dumped as root, by an earlier daemon
                handed[f.path] = f.path
        return handed

    def _check_creds(self, c: Creds) -> None:
        o = self.owner
        wrong = [f"{k} {v}" for k, v in c.ids.items() if v != (o.uid if "uid" in k else o.gid)]
        wrong += [f"group {g}" for g in c.groups if g not in o.groups]
        wrong += [f"{k} capabilities {v:#x}" for k, v in c.caps.items() if v]
        if wrong:
            raise AccessRefusedError(
                f"The checkpoint holds a thread ({c.image}) with {', '.join(wrong)}, which {o.name} (uid {o.uid}) does "
                "not have: a set-user-ID or set-group-ID program ran in it.",
                f"The gpucr daemon restores only processes with their owner's own credentials. {KEPT}")

    def refused(self, workdir: Path) -> AccessRefusedError | None:
        """Check 4: why CRIU, as the owner, could not restore in ``workdir``, if the owner may not have a file."""
        try:
            with os.fdopen(os.open(workdir / "restore.log", os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - (256 << 10)))  # its end says why; never all of it
                tail = f.read().decode(errors="replace")
        except OSError:
            return None
        found = _DENIED.search(tail)
        if found is None:
            return None
        path, why = found.groups()
        shown = path if path.startswith("/") else f"/{path}"
        return AccessRefusedError(
            f"The process had {shown} open, but its owner {self.owner.name} may not open it now ({why}), so the "
            "restore did not give it back.",
            f"Put the file back as it was, with the owner's access, then restore again. {KEPT}")


def external_files(pid: int, proc_dir: Path) -> list[str]:
    """CRIU's ids (``file[MNT_ID:INODE]``) of the daemon's files (``LOGS`` of ``proc_dir``) that the
    tree at ``pid`` holds. CRIU, as the owner, cannot reach them by their path (a root-only folder)
    to check them at the dump; marked external, the image keeps only their place, and the restore
    gets them from the holder (:meth:`RestoreGuard.handed`), never from a path."""
    logs = {_file_id(proc_dir / log) for log in LOGS} - {None}
    found: set[str] = set()
    for p in tree(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{p}/fd/{fd}")
                with open(f"/proc/{p}/fdinfo/{fd}") as info:
                    mnt_id = next(int(line.split()[1]) for line in info if line.startswith("mnt_id:"))
            except (OSError, StopIteration, ValueError):
                continue
            if (st.st_dev, st.st_ino) in logs and stat.S_ISREG(st.st_mode):
                found.add(f"file[{mnt_id:x}:{st.st_ino:x}]")
    return sorted(found)


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inode(path: Path) -> int | None:
    found = _file_id(path)
    return found[1] if found else None


def deleted_files(pid: int) -> list[str]:
    """Files the tree rooted at ``pid`` holds (open or mapped) that have been deleted; the daemon
    refuses to checkpoint them, so the process keeps running rather than being lost later."""
    found: set[str] = set()
    for p in tree(pid):
        for folder in ("fd", "map_files"):
            try:
                links = list(Path(f"/proc/{p}/{folder}").iterdir())
            except (FileNotFoundError, PermissionError):
                continue
            for link in links:
                try:
                    target = os.readlink(link)
                except OSError:
                    continue
                if target.endswith(" (deleted)") and not NOT_A_PATH.match(target):
                    found.add(target.removesuffix(" (deleted)"))
    return sorted(found)
