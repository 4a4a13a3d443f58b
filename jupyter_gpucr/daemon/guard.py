"""What the daemon checks so that a restore never gives a process more than its owner may have.

``criu restore`` runs as root: it reopens every file of the image by path (following whatever links
are there now; CRIU compares only size and mode), recreates deleted files, binds socket paths and
hands each task the credentials recorded in the image. Between the checkpoint and the restore the
owner controls their own paths, so each of these is checked first, as the owner, and the restored
tree is checked again before it runs:

1. before: every credential in the image is the owner's own (no other uid or gid, no group they
   lack, no capability); no deleted file is to be recreated; every path is reached without a
   symbolic link and may be opened by the owner as the process had it (``pathprobe``, run with
   the owner's uid, gid and groups); every socket path lies in a folder the owner may write.
2. inside CRIU, once the tree is restored and before it gets the owner's credentials: every file
   the tree holds is one of the files found in 1 (same device and inode; ``restorecheck``, CRIU's
   post-restore action script). A path changed between 1 and CRIU's open is caught there, and CRIU
   kills the tree before it runs.

Files in the owner's store of the daemon (the process's own stdout.log, stderr.log) are root's and
out of the owner's reach; they are found the same way, as root.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import AccessRefusedError, EngineError, PreconditionError
from ..core.images import REMAP_GHOST, REMAP_LINKED, Creds, RegFile, read_image
from ..core.procs import tree
from . import restorecheck
from .pathprobe import probe, verbs
from .restorecheck import NOT_A_PATH, REFUSED

PROBE = Path(__file__).with_name("pathprobe.py")
KEPT = "The checkpoint is kept."
# A process's own /proc folder: the image names it by its PID inside the namespace, which only the
# restored namespace's /proc has; it is never looked up on the host.
_PROC_PID = re.compile(r"^/proc/(\d+|self|thread-self)(/|$)")


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


@dataclass
class Approved:
    """What the checked image may hold once restored: files by (device, inode), /proc paths by
    name; ``fds``: each process's own descriptors (until CRIU is done it holds some of CRIU's too)."""

    inodes: set[tuple[int, int]] = field(default_factory=set)
    proc_paths: set[str] = field(default_factory=set)
    fds: dict[int, list[int]] = field(default_factory=dict)


class RestoreGuard:
    """The checks of the module docstring for one owner; ``trusted``: their store in the daemon."""

    def __init__(self, owner: Owner, trusted: Path) -> None:
        self.owner = owner
        self.trusted = trusted

    # -- before the restore ----------------------------------------------------------------
    def approve(self, images: Path, workdir: Path) -> list[str]:
        """Step 1 for the image in ``images``; the options for step 2 (see the module docstring)."""
        return self.options(self.approved(images), workdir)

    def approved(self, images: Path) -> Approved:
        image = read_image(images)
        for creds in image.creds:
            self._check_creds(creds)
        for remap in image.remaps:
            if remap.kind in (REMAP_GHOST, REMAP_LINKED):
                what = remap.file.path if remap.file else "a file"
                raise AccessRefusedError(
                    f"The process had {what} open after it was deleted; the gpucr daemon does not recreate deleted "
                    "files as root for a user.", f"{KEPT} Restore it with a server that runs as its owner, or delete it.")
        approved = Approved(fds=image.fds)
        own: list[RegFile] = []
        for f in image.files:
            if _PROC_PID.match(f.path):
                approved.proc_paths.add(f.path)
            elif self._is_trusted(f.path):
                self._found(approved, f, probe([[f.path, 0, "file"]])[0])
            else:
                own.append(f)
        answers = self._probe_as_owner([[f.path, f.access, "file"] for f in own]
                                       + [[b.path, 0, "bind"] for b in image.unix_binds])
        for f, answer in zip(own, answers, strict=False):
            self._found(approved, f, answer)
        for b, answer in zip(image.unix_binds, answers[len(own):], strict=False):
            if "refused" in answer:
                raise AccessRefusedError(f"The process had a UNIX socket bound to {b.path}, and {answer['refused']}.",
                                         f"Remove what is there, or make the folder the owner's again. {KEPT}")
        return approved

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

    def _is_trusted(self, path: str) -> bool:
        return Path(path).is_relative_to(self.trusted)

    def _probe_as_owner(self, requests: list[list[object]]) -> list[dict]:
        if not requests:
            return []
        o = self.owner
        try:
            proc = subprocess.run([sys.executable, "-I", "-S", str(PROBE)], input=json.dumps(requests), capture_output=True,
                                  text=True, user=o.uid, group=o.gid, extra_groups=sorted(o.groups), cwd="/",
                                  env={"LANG": "C.UTF-8"}, timeout=120)
            answers = json.loads(proc.stdout) if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            raise EngineError(f"The gpucr daemon could not check the checkpoint's files as {o.name}: {e}.", KEPT) from None
        if not isinstance(answers, list) or len(answers) != len(requests):
            raise EngineError(f"The gpucr daemon could not check the checkpoint's files as {o.name}: "
                              f"{proc.stderr.strip()[-500:] or 'no answer'}.", KEPT)
        return answers

    def _found(self, approved: Approved, f: RegFile, answer: dict) -> None:
        if "refused" in answer:
            raise AccessRefusedError(
                f"The process had {f.path} open to {verbs(f.access)}, but {answer['refused']}, so its owner "
                f"{self.owner.name} may not have it back.",
                f"Put the file back as it was (a plain file, not a link) with the owner's access, then restore again. {KEPT}")
        if stat.S_IFMT(answer["mode"]) != stat.S_IFMT(f.mode):
            raise AccessRefusedError(f"{f.path} is not the kind of file the process had open (it was replaced).",
                                     f"Put the file back as it was, then restore again. {KEPT}")
        approved.inodes.add((answer["dev"], answer["ino"]))

    def options(self, approved: Approved, workdir: Path) -> list[str]:
        """``criu restore`` options for step 2: the approved files and the action script that checks
        the tree against them, written into the restore's work folder (root-only). CRIU runs an
        action script without arguments, so the script names the file itself."""
        path, script = workdir / "restore-approved.json", workdir / "restore-check"
        (workdir / REFUSED).unlink(missing_ok=True)
        _write_private(path, json.dumps({"inodes": sorted(approved.inodes), "proc_paths": sorted(approved.proc_paths),
                                          "fds": approved.fds}))
        check = shlex.join([sys.executable, "-I", "-S", restorecheck.__file__, str(path)])
        # CRIU runs it at every stage of the restore; Python starts only for the one that checks.
        _write_private(script, f'#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-restore ] || exit 0\nexec {check}\n', 0o700)
        return ["--action-script", str(script)]

    @staticmethod
    def refused(workdir: Path) -> AccessRefusedError | None:
        """Why step 2 ended a restore in ``workdir``, if it did."""
        try:
            why = json.loads((workdir / REFUSED).read_text())["refused"]
        except (OSError, ValueError, KeyError):
            return None
        return AccessRefusedError(why, f"Put the process's files back as they were, then restore again. {KEPT}")


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as f:
        f.write(text)


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
