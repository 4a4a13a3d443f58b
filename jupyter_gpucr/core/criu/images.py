"""What a CRIU image asks of the machine it is restored on: the paths it reopens, the credentials
its tasks come back with, the ports and socket paths it binds.

``criu restore`` runs as root and reopens every file by path, recreates deleted files and binds
sockets, then gives each task the credentials its image holds. Whoever restores an image for
someone else must know all of that before it starts; this reads it from the images alone (the
protobuf wire format, field numbers from CRIU's ``images/*.proto``), with the standard library.
"""
from __future__ import annotations

import os
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointDamagedError
from .pagefill import read_varint

# Every image starts with magic words: CRIU's common (or service) word, then the image's own.
_FRAMED = (0x54564319, 0x55105940)

# fdinfo.proto: file_entry's type and the message field of each kind read here.
FD_REG, FD_INETSK, FD_UNIXSK = 1, 4, 5
_FE_TYPE, _FE_ID, _FE_REG, _FE_ISK, _FE_USK = 1, 2, 3, 4, 16
# regfile.proto
_REG_ID, _REG_FLAGS, _REG_NAME, _REG_SIZE, _REG_MODE = 1, 2, 6, 8, 10
# sk-unix.proto / sk-inet.proto
_USK_NAME, _USK_NAME_DIR, _USK_STATE = 11, 14, 4
_ISK_FAMILY, _ISK_TYPE, _ISK_STATE, _ISK_SRC_PORT, _ISK_SRC_ADDR, _ISK_DST_ADDR = 3, 4, 6, 7, 11, 12
# remap-file-path.proto: remap_type
REMAP_LINKED, REMAP_GHOST, REMAP_PROCFS = 0, 1, 2
_REMAP_GHOST_BIT = 0x80000000  # images older than remap_type marked ghosts in remap_id
# mm.proto: mm_entry.vmas (14) -> vma.proto; a file mapping's shmid is its file's id, fdflags its open mode
_MM_VMAS, _VMA_SHMID, _VMA_STATUS, _VMA_FDFLAGS = 14, 4, 7, 10
_VMA_FILE_PRIVATE, _VMA_FILE_SHARED = 1 << 6, 1 << 7
# pstree.proto, core.proto (task_kobj_ids_entry), fdinfo.proto (fdinfo_entry)
_PSTREE_PID, _IDS_FILES, _FDINFO_FD = 1, 2, 4
# core.proto: core_entry.thread_core (5) -> thread_core_entry.creds (10) -> creds.proto
_CORE_THREAD, _THREAD_CREDS = 5, 10
_CREDS_IDS = ("uid", "gid", "euid", "egid", "suid", "sgid", "fsuid", "fsgid")
_CAP_INH, _CAP_PRM, _CAP_EFF, _GROUPS = 9, 10, 11, 14

O_PATH = 0o10000000
Fields = dict[int, list]


def decode(b: bytes) -> Fields:
    """One protobuf message: field number -> its values (ints, or bytes for length-delimited ones).
    Packed repeated fields stay bytes (see :func:`packed`)."""
    out: Fields = {}
    i = 0
    while i < len(b):
        key, i = read_varint(b, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = read_varint(b, i)
        elif wire == 2:
            n, i = read_varint(b, i)
            value, i = b[i:i + n], i + n
            if i > len(b):
                raise ValueError("a field runs past its message")
        elif wire == 5:
            value, i = struct.unpack_from("<I", b, i)[0], i + 4
        elif wire == 1:
            value, i = struct.unpack_from("<Q", b, i)[0], i + 8
        else:
            raise ValueError(f"protobuf wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def packed(values: list) -> list[int]:
    """A repeated uint32 field, packed (bytes of varints) or not (ints)."""
    out: list[int] = []
    for v in values:
        if isinstance(v, bytes):
            i = 0
            while i < len(v):
                x, i = read_varint(v, i)
                out.append(x)
        else:
            out.append(v)
    return out


def entries(path: Path) -> Iterator[Fields]:
    """The messages of an image file (after its magic words, each prefixed by its u32 size)."""
    data = path.read_bytes()
    try:
        (magic,) = struct.unpack_from("<I", data)
        i = 8 if magic in _FRAMED else 4
        while i + 4 <= len(data):
            (size,) = struct.unpack_from("<I", data, i)
            yield decode(data[i + 4:i + 4 + size])
            i += 4 + size
    except (struct.error, IndexError, ValueError) as e:
        raise CheckpointDamagedError(f"The CRIU image {path} cannot be read ({e}).",
                                     "The checkpoint is damaged; delete it and suspend again.") from None


def _one(f: Fields, n: int, default: Any = None) -> Any:
    return f[n][0] if n in f else default


@dataclass(frozen=True)
class RegFile:
    """A file the restore reopens by path: a descriptor, a mapping, a task's cwd, root or executable.
    ``access``: what the owner must be allowed to do with it (``os.access`` bits), from its open
    mode and that of its mappings (a shared writable mapping is restored by opening it read-write).
    ``size``: the size CRIU requires of it at the restore (None: not checked, a file only appended to)."""

    id: int
    path: str
    mode: int
    access: int
    size: int | None = None


#: Called once a process dumped and left running runs again, before its checkpoint is verified and
#: durable, with the checkpoint's id and the files its image has open: what must be copied as it was
#: at the dump (a kernel's history) is copied then, and the process may go on.
RunningAgain = Callable[[str, list[RegFile]], None]


def access_of(open_flags: int, mode: int) -> int:
    if stat.S_ISDIR(mode):
        return os.X_OK
    if open_flags & O_PATH:
        return os.F_OK
    return {os.O_RDONLY: os.R_OK, os.O_WRONLY: os.W_OK}.get(open_flags & os.O_ACCMODE, os.R_OK | os.W_OK)


@dataclass(frozen=True)
class UnixBind:
    """A UNIX socket the restore binds to a name in the file system."""

    path: str


@dataclass(frozen=True)
class InetSocket:
    family: int  # AF_INET or AF_INET6
    type: int  # SOCK_STREAM, SOCK_DGRAM
    state: int  # TCP state (10: listening)
    port: int
    addr: tuple[int, ...]
    peer: tuple[int, ...] = ()  # a connected socket's peer address, as ``addr``


@dataclass(frozen=True)
class Creds:
    """The credentials one restored thread gets."""

    image: str
    ids: dict[str, int]
    groups: tuple[int, ...]
    caps: dict[str, int]  # inheritable, permitted, effective: as one integer each


@dataclass(frozen=True)
class Remap:
    """A file the restore does not simply reopen: deleted (ghost), reached through a link made at
    the dump (linked), or a dead process's /proc folder."""

    file: RegFile | None
    kind: int


@dataclass(frozen=True)
class Image:
    files: list[RegFile]
    unix_binds: list[UnixBind]
    inet: list[InetSocket]
    creds: list[Creds]
    remaps: list[Remap]
    fds: dict[int, list[int]]  # the descriptors each process (by its PID in the image) gets back


def read_image(images: Path) -> Image:
    """Everything of the image in ``images`` that touches the host (see the module docstring)."""
    files, unix_binds, inet = [], [], []
    for e in entries(images / "files.img") if (images / "files.img").exists() else ():
        kind = _one(e, _FE_TYPE)
        if kind == FD_REG and _FE_REG in e:
            r = decode(e[_FE_REG][0])
            mode = int(_one(r, _REG_MODE, 0))
            size = _one(r, _REG_SIZE)
            files.append(RegFile(int(_one(r, _REG_ID, 0)), bytes(_one(r, _REG_NAME, b"")).decode(errors="surrogateescape"),
                                 mode, access_of(int(_one(r, _REG_FLAGS, 0)), mode), None if size is None else int(size)))
        elif kind == FD_UNIXSK and _FE_USK in e:
            u = decode(e[_FE_USK][0])
            name = bytes(_one(u, _USK_NAME, b"")).rstrip(b"\0")
            if name and not name.startswith(b"\0"):  # an abstract name touches no file system
                base = bytes(_one(u, _USK_NAME_DIR, b"")).decode(errors="surrogateescape")
                text = name.decode(errors="surrogateescape")
                unix_binds.append(UnixBind(text if text.startswith("/") or not base else f"{base.rstrip('/')}/{text}"))
        elif kind == FD_INETSK and _FE_ISK in e:
            s = decode(e[_FE_ISK][0])
            inet.append(InetSocket(int(_one(s, _ISK_FAMILY, 0)), int(_one(s, _ISK_TYPE, 0)), int(_one(s, _ISK_STATE, 0)),
                                   int(_one(s, _ISK_SRC_PORT, 0)), tuple(packed(s.get(_ISK_SRC_ADDR, []))),
                                   tuple(packed(s.get(_ISK_DST_ADDR, [])))))
    files = _with_mapping_modes(images, files)
    by_id = {f.id: f for f in files}
    remaps = []
    if (images / "remap-fpath.img").exists():
        for e in entries(images / "remap-fpath.img"):
            orig, remap_id = int(_one(e, 1, 0)), int(_one(e, 2, 0))
            kind = int(_one(e, 3, REMAP_GHOST if remap_id & _REMAP_GHOST_BIT else REMAP_LINKED))
            remaps.append(Remap(by_id.get(orig), kind))
    return Image(files, unix_binds, inet, _creds(images), remaps, _fds(images))


def _with_mapping_modes(images: Path, files: list[RegFile]) -> list[RegFile]:
    """The files with what their mappings need added to what their descriptors need."""
    needs: dict[int, int] = {}
    for mm in images.glob("mm-*.img"):
        for e in entries(mm):
            for raw in e.get(_MM_VMAS, []):
                v = decode(raw)
                if int(_one(v, _VMA_STATUS, 0)) & (_VMA_FILE_PRIVATE | _VMA_FILE_SHARED):
                    fid = int(_one(v, _VMA_SHMID, 0))
                    needs[fid] = needs.get(fid, 0) | access_of(int(_one(v, _VMA_FDFLAGS, 0)), 0)
    return [RegFile(f.id, f.path, f.mode, f.access | needs.get(f.id, 0), f.size) for f in files]


def _fds(images: Path) -> dict[int, list[int]]:
    """pstree.img names the processes; ids-PID.img their descriptor table; fdinfo-ID.img its fds."""
    out = {}
    for e in entries(images / "pstree.img") if (images / "pstree.img").exists() else ():
        pid = int(_one(e, _PSTREE_PID, 0))
        ids = next(entries(images / f"ids-{pid}.img"), {}) if (images / f"ids-{pid}.img").exists() else {}
        table = images / f"fdinfo-{_one(ids, _IDS_FILES, 0)}.img"
        out[pid] = sorted(int(_one(f, _FDINFO_FD, -1)) for f in entries(table)) if table.exists() else []
    return out


def _creds(images: Path) -> list[Creds]:
    out = []
    for core in sorted(images.glob("core-*.img")):
        for e in entries(core):
            thread = decode(e[_CORE_THREAD][0]) if _CORE_THREAD in e else {}
            if _THREAD_CREDS not in thread:
                continue
            c = decode(thread[_THREAD_CREDS][0])
            caps = {name: _cap_set(packed(c.get(n, []))) for name, n in
                    (("inheritable", _CAP_INH), ("permitted", _CAP_PRM), ("effective", _CAP_EFF))}
            out.append(Creds(core.name, {name: int(_one(c, i + 1, 0)) for i, name in enumerate(_CREDS_IDS)},
                             tuple(packed(c.get(_GROUPS, []))), caps))
    return out


def _cap_set(words: list[int]) -> int:
    return sum(w << (32 * i) for i, w in enumerate(words))
