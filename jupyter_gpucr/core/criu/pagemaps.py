"""CRIU's page images, and the same images rewritten to take pages from another dump or to hold
the pages they take from one.

A pagemap image (``pagemap-ID.img``, one per task and one per shared-memory segment) lists the
dumped memory in address order, each entry a run of pages with flags; the bytes of the entries
flagged ``PE_PRESENT`` lie one after another in the pages image it names. An entry flagged
``PE_PARENT`` has no bytes there: the restore reads them from the same image of the dump that
``parent`` (a link beside the images) names, which may take them from its own parent. CRIU's
incremental dumps (``--track-mem --prev-images-dir``) write such entries; :func:`share` writes
them where a page equals another dump's at its address (for a kernel without dirty-page
tracking, whose every dump is full); :func:`take_in` copies a parent's pages in before the
parent goes. Pages taken from a parent are never lazy (as CRIU writes them): the restore reads
them itself, and the page daemon (``pagefill``) leaves them to it. Standard library only.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from .pagefill import FillError, varint_fields

PAGE = 4096
#: The link, beside a dump's images, to the images its ``PE_PARENT`` pages are read from.
PARENT_LINK = "parent"
PE_PARENT, PE_LAZY, PE_PRESENT = 1, 2, 4
_IMG_COMMON, _PAGEMAP_MAGIC = 0x54564319, 0x56084025
#: Pages compared at once before a block that differs is compared page by page.
_BLOCK_PAGES = 64
#: The longest chain followed: a link that leads back into itself is refused, never followed for ever.
MAX_CHAIN = 64


class PagemapError(Exception):
    """An image this module cannot read, or a chain whose parent lacks pages a child takes from it."""


@dataclass(frozen=True)
class Entry:
    """A run of ``pages`` pages from ``vaddr``; ``flags``: ``PE_*``."""

    vaddr: int
    pages: int
    flags: int


@dataclass(frozen=True)
class Pagemap:
    pages_id: int
    entries: list[Entry]

    @property
    def pages_name(self) -> str:
        return f"pages-{self.pages_id}.img"

    @property
    def own_bytes(self) -> int:
        return sum(e.pages * PAGE for e in self.entries if e.flags & PE_PRESENT)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(b: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message (all a pagemap entry has)."""
    try:
        return varint_fields(b)
    except FillError as e:
        raise PagemapError(str(e)) from e


def read_pagemap(path: Path) -> Pagemap:
    data = path.read_bytes()
    if len(data) < 8 or struct.unpack_from("<II", data) != (_IMG_COMMON, _PAGEMAP_MAGIC):
        raise PagemapError(f"{path} is not a CRIU pagemap image")
    messages, i = [], 8
    while i < len(data):
        (size,) = struct.unpack_from("<I", data, i)
        messages.append(_fields(data[i + 4:i + 4 + size]))
        i += 4 + size
    if not messages:
        raise PagemapError(f"{path} has no header")
    # CRIU 4 keeps the number of pages in field 5, older ones in field 2
    entries = [Entry(m[1], m.get(5) or m.get(2, 0), m.get(4, 0) | (PE_PARENT if m.get(3) else 0)) for m in messages[1:]]
    return Pagemap(messages[0][1], entries)


def write_pagemap(path: Path, pagemap: Pagemap) -> None:
    """The image as CRIU 4 writes it (the page count in field 5, field 2 zero)."""
    out = bytearray(struct.pack("<II", _IMG_COMMON, _PAGEMAP_MAGIC))
    for message in [b"\x08" + _varint(pagemap.pages_id)] + [
            b"\x08" + _varint(e.vaddr) + b"\x10\x00" + b"\x20" + _varint(e.flags) + b"\x28" + _varint(e.pages)
            for e in pagemap.entries]:
        out += struct.pack("<I", len(message)) + message
    with open(path, "wb") as f:
        f.write(out)


def pagemap_names(images: Path) -> list[str]:
    return sorted(p.name for p in images.glob("pagemap-*.img"))


def own_page_bytes(images: Path) -> int:
    """The bytes of memory the images hold themselves (not those they take from a parent)."""
    return sum(read_pagemap(images / n).own_bytes for n in pagemap_names(images))


def parent_images(images: Path) -> Path | None:
    """The images ``images`` takes pages from (its ``parent`` link, resolved); None without one."""
    link = images / PARENT_LINK
    return link.resolve() if link.is_symlink() else None


# -- where each page's bytes lie ---------------------------------------------------------------

@dataclass(frozen=True)
class _Run:
    """Pages from ``vaddr`` with ``flags``, their bytes at ``offset`` of ``source`` (None: in the
    parent, which the run's images take them from)."""

    vaddr: int
    pages: int
    flags: int
    source: Path | None
    offset: int = 0

    @property
    def end(self) -> int:
        return self.vaddr + self.pages * PAGE

    def part(self, start: int, end: int) -> _Run:
        """The run's pages in ``[start, end)``."""
        return _Run(start, (end - start) // PAGE, self.flags, self.source,
                    self.offset + (start - self.vaddr) if self.source is not None else 0)


def _layout(images: Path, name: str) -> list[_Run]:
    """The runs of one pagemap: its own pages where they lie in its pages image, and those it
    takes from its parent (zero pages, which have neither, are left out)."""
    pagemap = read_pagemap(images / name)
    pages = images / pagemap.pages_name
    runs, offset = [], 0
    for e in pagemap.entries:
        if e.flags & PE_PRESENT:
            runs.append(_Run(e.vaddr, e.pages, e.flags, pages, offset))
            offset += e.pages * PAGE
        elif e.flags & PE_PARENT:
            runs.append(_Run(e.vaddr, e.pages, e.flags, None))
    if offset and offset != os.path.getsize(pages):
        raise PagemapError(f"{images / name} describes {offset} bytes, {pages} holds {os.path.getsize(pages)}")
    return runs


class _Runs:
    """Runs sorted by address and apart, to look up the parts inside a range."""

    def __init__(self, runs: list[_Run]) -> None:
        self.runs = runs
        self.starts = [r.vaddr for r in runs]

    def within(self, start: int, end: int) -> Iterator[_Run]:
        """The parts of the runs inside ``[start, end)``."""
        for run in self.runs[max(0, bisect.bisect_right(self.starts, start) - 1):]:
            if run.vaddr >= end:
                return
            if run.end > start:
                yield run.part(max(start, run.vaddr), min(end, run.end))


def _resolved(images: Path, name: str, levels: int) -> list[_Run]:
    """The runs of a pagemap with what it takes from its parents looked up ``levels`` deep: the
    parent's own pages become runs with a source, what the parent takes from its own parent stays
    a run without one (past ``levels``). Raises where a parent lacks a page a child takes from it."""
    runs = _layout(images, name)
    if levels == 0 or all(r.source is not None for r in runs):
        return runs
    parent = parent_images(images)
    if parent is None or not (parent / name).is_file():
        raise PagemapError(f"{images / name} takes pages from a parent, and {parent or 'its parent'} has no {name}")
    theirs = _Runs(_resolved(parent, name, levels - 1))
    out: list[_Run] = []
    for run in runs:
        if run.source is not None:
            out.append(run)
            continue
        covered = run.vaddr
        for piece in theirs.within(run.vaddr, run.end):
            if piece.vaddr != covered:
                break
            out.append(piece)
            covered = piece.end
        if covered != run.end:
            raise PagemapError(f"{parent / name} lacks the page at {covered:#x} that {images / name} takes from it")
    return out


# -- rewriting ---------------------------------------------------------------------------------

def _write(out: Path, name: str, pages_id: int, runs: list[_Run]) -> None:
    """``out/name`` and its pages image: every run with a source copied in, in address order."""
    entries = []
    with open(out / f"pages-{pages_id}.img", "wb") as dst, ExitStack() as stack:
        fds: dict[Path, int] = {}
        for run in runs:
            entries.append(Entry(run.vaddr, run.pages, run.flags))
            if run.source is None:
                continue
            if run.source not in fds:
                fds[run.source] = os.open(run.source, os.O_RDONLY)
                stack.callback(os.close, fds[run.source])
            left, offset = run.pages * PAGE, run.offset
            while left:
                n = os.copy_file_range(fds[run.source], dst.fileno(), left, offset)
                if n <= 0:
                    raise PagemapError(f"{run.source} ends early at {offset}")
                left, offset = left - n, offset + n
    write_pagemap(out / name, Pagemap(pages_id, entries))


def _merged(runs: list[_Run]) -> list[_Run]:
    """Neighbouring runs of one entry merged where their bytes lie one after the other."""
    out: list[_Run] = []
    for run in runs:
        last = out[-1] if out else None
        if (last is not None and last.end == run.vaddr and last.flags == run.flags and last.source == run.source
                and (run.source is None or last.offset + last.pages * PAGE == run.offset)):
            out[-1] = _Run(last.vaddr, last.pages + run.pages, last.flags, last.source, last.offset)
        else:
            out.append(run)
    return out


def share(images: Path, base: Path, out: Path) -> list[str]:
    """Write into ``out`` the pagemaps of ``images`` (which takes nothing from a parent) rewritten
    to take every lazy page equal to ``base``'s at its address from ``base``, with their pages
    images; the names of the files written (the other files stay as they are). The caller makes
    ``base`` the parent of the result."""
    if parent_images(images) is not None:
        raise PagemapError(f"{images} takes pages from a parent already")
    written = []
    with _Mapped() as address:
        for name in pagemap_names(images):
            if not (base / name).is_file():
                continue
            mine, theirs = _layout(images, name), _Runs(_resolved(base, name, MAX_CHAIN))
            runs: list[_Run] = []
            for run in mine:
                if not run.flags & PE_LAZY or run.source is None:  # only lazy pages (never a stack's)
                    runs.append(run)
                    continue
                runs += _merged(list(_compared(run, list(theirs.within(run.vaddr, run.end)), address)))
            if any(r.source is None for r in runs):
                pagemap = read_pagemap(images / name)
                _write(out, name, pagemap.pages_id, runs)
                written += [name, pagemap.pages_name]
    return written


class _Mapped:
    """Files mapped while they are compared, each once (copy on write, never written: ctypes
    needs a writable buffer for an address); unmapped at the end."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap] = {}
        self._anchors: dict[Path, ctypes.c_char] = {}

    def __call__(self, path: Path) -> int:
        """The address ``path`` is mapped at."""
        if path not in self._anchors:
            with open(path, "rb") as f:
                self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            self._anchors[path] = ctypes.c_char.from_buffer(self._maps[path])
        return ctypes.addressof(self._anchors[path])

    def __enter__(self) -> _Mapped:
        return self

    def __exit__(self, *exc: object) -> None:
        self._anchors.clear()  # the mappings can only be closed once nothing points into them
        for m in self._maps.values():
            m.close()


_libc = ctypes.CDLL(None)
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.memcmp.restype = ctypes.c_int


def _compared(run: _Run, theirs: list[_Run], address: Callable[[Path], int]) -> Iterator[_Run]:
    """``run`` cut into pages equal to ``theirs`` (then taken from the parent) and pages of its own."""
    assert run.source is not None
    mine = address(run.source) + run.offset - run.vaddr  # where the page at an address lies in memory
    pos = run.vaddr
    for other in theirs:
        if other.source is None or not other.flags & PE_PRESENT:
            continue
        if other.vaddr > pos:
            yield run.part(pos, other.vaddr)
        same = address(other.source) + other.offset - other.vaddr
        for at in range(other.vaddr, other.end, _BLOCK_PAGES * PAGE):
            n = min(_BLOCK_PAGES * PAGE, other.end - at)
            if _libc.memcmp(mine + at, same + at, n) == 0:
                yield _Run(at, n // PAGE, PE_PARENT, None)
                continue
            for page in range(at, at + n, PAGE):
                if _libc.memcmp(mine + page, same + page, PAGE) == 0:
                    yield _Run(page, 1, PE_PARENT, None)
                else:
                    yield run.part(page, page + PAGE)
        pos = other.end
    if pos < run.end:
        yield run.part(pos, run.end)


def take_in(images: Path, out: Path, all_levels: bool = False) -> list[str]:
    """Write into ``out`` the pagemaps of ``images`` rewritten to hold the pages they take from
    their parent: those the parent holds itself (what it takes from its own parent is then taken
    from that one) or, with ``all_levels``, every page, whatever parent held it. A page copied in
    is lazy where the dump that wrote it made it lazy. The names of the files written."""
    written = []
    for name in pagemap_names(images):
        runs = _layout(images, name)
        if all(r.source is not None for r in runs):
            continue
        pagemap = read_pagemap(images / name)
        runs = [_keep_lazy(r) for r in _resolved(images, name, MAX_CHAIN if all_levels else 1)]
        if all_levels and any(r.source is None for r in runs):
            raise PagemapError(f"{images} has a chain of parents over {MAX_CHAIN} long (a link leads back into it)")
        _write(out, name, pagemap.pages_id, runs)
        written += [name, pagemap.pages_name]
    return written


def _keep_lazy(run: _Run) -> _Run:
    """A run copied in from a parent keeps the parent's flags (present, lazy where it was); one
    still taken from further up is a parent run, never lazy."""
    if run.source is None:
        return _Run(run.vaddr, run.pages, PE_PARENT, None)
    return _Run(run.vaddr, run.pages, run.flags & (PE_PRESENT | PE_LAZY), run.source, run.offset)
