"""Bring a restored process's memory back with many threads, in place of CRIU's lazy-pages daemon.

CRIU's eager restore reads every page with one thread (``preadv`` in its restorer), faulting in one
4 KiB page at a time: 1.2 s for the 1.6 GB image of a GPU kernel on the H200 machine, the largest
part of its restore. With ``criu restore --lazy-pages`` CRIU rebuilds the process without that
memory (0.2-0.3 s) and hands each restored task's userfaultfd to the daemon listening on
``lazy-pages.socket`` in its work directory. This is such a daemon: it serves the few pages the
restore itself touches, and once CRIU says the restore is finished (the tree is left stopped) it
copies every remaining page in with ``UFFDIO_COPY`` from a pool of threads, each reading its own
4 MiB span of the pages image, then closes the userfaultfds and exits 0; the restore is handed
back only then. An eager restore continues the tree after that. A GPU process is continued at
once, for the driver's restore, which overlaps the copy: a page it touches brings its whole span
in (one fault, not one per page), and memory it unmaps or drops (MADV_DONTNEED) is crossed off so
that the image's old bytes never land in it; a task that exits needs none of it. A fork or an
mremap meanwhile exits with ``LAYOUT_CHANGED``: the checkpointer restores again, the tree stopped.
Any failure exits non-zero and the holder kills the tree (missing pages would read as zeros).

    python -I -S pagefill.py -D IMAGES -W WORKDIR [-o LOG] [--threads N]

Standard library only, run as a plain script like the holder (importing the package costs 0.3 s).
"""
from __future__ import annotations

import argparse
import bisect
import ctypes
import errno
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

SOCKET_NAME = "lazy-pages.socket"  # what CRIU connects to, relative to its work directory
RESTORE_FINISHED = 0x52535446  # CRIU's "ReSTore Finished" word; PIDs are below 2**22
PAGE = 4096
CHUNK = 4 << 20  # bytes one thread reads and copies in at a time
STUCK_S = 5.0  # how long a copy may find its mapping gone before the unmap's message arrives

# CRIU image framing: two magic words, then entries of (u32 size, protobuf message).
_IMG_COMMON, _PAGEMAP_MAGIC = 0x54564319, 0x56084025
_PE_LAZY, _PE_PRESENT = 2, 4

# <linux/userfaultfd.h>
_UFFD_EVENT_PAGEFAULT, _UFFD_EVENT_REMOVE, _UFFD_EVENT_UNMAP = 0x12, 0x15, 0x16
_UFFDIO_COPY, _UFFDIO_ZEROPAGE, _UFFDIO_WAKE = 0xC028AA03, 0xC020AA04, 0x8010AA02
_UFFD_MSG_SIZE = 32

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


class _Copy(ctypes.Structure):
    _fields_ = [("dst", ctypes.c_uint64), ("src", ctypes.c_uint64), ("len", ctypes.c_uint64),
                ("mode", ctypes.c_uint64), ("copy", ctypes.c_int64)]


class _Zero(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("zeropage", ctypes.c_int64)]


class _Range(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class FillError(Exception):
    """Why a page could not be brought in."""


class LayoutChanged(FillError):
    """The task forked or moved memory while it ran and was filled (its restore can be redone
    with the tree stopped until filled: exit status ``LAYOUT_CHANGED``)."""


LAYOUT_CHANGED = 3  # the exit status then (the restore step, steps/restore.py, imports it from here)


# -- the images ------------------------------------------------------------------------------

def read_varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def varint_fields(b: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message (all a pagemap entry has, and CRIU's dump stats)."""
    out, i = {}, 0
    while i < len(b):
        key, i = read_varint(b, i)
        if key & 7 != 0:
            raise FillError(f"unexpected protobuf wire type {key & 7} in a pagemap entry")
        out[key >> 3], i = read_varint(b, i)
    return out


@dataclass
class Pagemap:
    """A task's lazy memory: ``ranges`` of (address, bytes, offset in ``pages``), sorted."""

    pages: str
    ranges: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def lazy_bytes(self) -> int:
        return sum(size for _, size, _ in self.ranges)

    def find(self, addr: int) -> tuple[int, int, int] | None:
        i = bisect.bisect_right(self.ranges, (addr, 1 << 64)) - 1
        if i >= 0 and self.ranges[i][0] <= addr < self.ranges[i][0] + self.ranges[i][1]:
            return self.ranges[i]
        return None


def read_pagemap(images: str, pid: int) -> Pagemap:
    """Where each lazy page of task ``pid`` lies in its pages image. The image is checked against
    the pages file's size, so a format this does not know is refused, never misread."""
    with open(os.path.join(images, f"pagemap-{pid}.img"), "rb") as f:
        data = f.read()
    if struct.unpack_from("<II", data) != (_IMG_COMMON, _PAGEMAP_MAGIC):
        raise FillError(f"pagemap-{pid}.img is not a CRIU pagemap image")
    entries, i = [], 8
    while i < len(data):
        (size,) = struct.unpack_from("<I", data, i)
        entries.append(varint_fields(data[i + 4:i + 4 + size]))
        i += 4 + size
    pm = Pagemap(os.path.join(images, f"pages-{entries[0][1]}.img"))
    offset = 0
    for e in entries[1:]:
        flags, nr = e.get(4, 0), e.get(5) or e.get(2, 0)  # CRIU 4 moved nr_pages to field 5
        if not flags & _PE_PRESENT:
            # zero pages: nothing in the file, read as zeros once the process runs; pages of a
            # parent (an incremental dump's, never lazy): CRIU's restore reads them itself
            continue
        if flags & _PE_LAZY:
            pm.ranges.append((e[1], nr * PAGE, offset))
        offset += nr * PAGE
    if offset != os.path.getsize(pm.pages):
        raise FillError(f"pagemap-{pid}.img describes {offset} bytes, {pm.pages} holds {os.path.getsize(pm.pages)}")
    return pm


def _vma_ends(pid: int) -> list[int]:
    """Ends of the task's mappings: one UFFDIO_COPY must stay inside one."""
    with open(f"/proc/{pid}/maps") as f:
        return sorted(int(line.split("-", 1)[1].split(" ", 1)[0], 16) for line in f)


# -- one restored task -----------------------------------------------------------------------

class _Gate:
    """Copies pass side by side; reading a userfaultfd message waits for them and holds them off,
    so that a range the process gives up (munmap, MADV_DONTNEED) is crossed off before any copy
    can put old bytes into it. Those copies fail with EAGAIN while such a message is unread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._copies = 0
        self._reading = False

    @contextmanager
    def copying(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._reading)
            self._copies += 1
        try:
            yield
        finally:
            with self._cond:
                self._copies -= 1
                self._cond.notify_all()

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._reading)
            self._reading = True
            self._cond.wait_for(lambda: self._copies == 0)
        try:
            yield
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()


@dataclass
class Task:
    """A restored task: its userfaultfd (from CRIU) and where its lazy memory lies in the images.

    Once CRIU has finished, its lazy ranges are cut into ``spans``; a span is copied in by whoever
    claims it first, a fill thread or the fault server (a fault in it brings the whole span in).
    The task may run meanwhile (a GPU process, for the driver's restore): ranges it unmaps or
    drops are ``removed`` and never copied; a fork or an mremap fails the fill (see ``serve``)."""

    pid: int
    uffd: int
    pagemap: Pagemap
    stop: threading.Event
    pages_fd: int = -1
    gate: _Gate = field(default_factory=_Gate)
    removed: list[tuple[int, int]] = field(default_factory=list)
    spans: list[Span] | None = None
    span_starts: list[int] = field(default_factory=list)  # each span's first address, for faults
    claimed: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    exited: bool = False  # it ran and exited before all of it was in

    def set_spans(self, spans: list[Span]) -> None:
        self.claimed = [False] * len(spans)
        self.span_starts = [pieces[0][0] for _, _, _, pieces in spans]
        self.spans = spans

    def claim(self, i: int) -> bool:
        """Whether the caller is the one to copy span ``i``."""
        with self.lock:
            if self.claimed[i]:
                return False
            self.claimed[i] = True
            return True

    def copy(self, dst: int, src: int, length: int, on_pending: Callable[[], bool] | None = None) -> None:
        """Copy ``length`` bytes at ``src`` into the task at ``dst``; pages already there (a
        fault got them first) and ranges the task gave up are skipped. While a message is unread
        the kernel refuses copies: ``on_pending`` reads one (the fault server's own copies; whether
        there was one), others wait."""
        pos, end = dst, dst + length
        stuck_since = None
        while pos < end:
            with self.gate.copying():
                now = self._copy_some(pos, end, src - dst)
            if now < end:
                stuck_since = None if now > pos else stuck_since or time.monotonic()
                if stuck_since is not None and time.monotonic() - stuck_since > STUCK_S:
                    raise FillError(f"task {self.pid}: UFFDIO_COPY at {now:#x} failed for {STUCK_S:.0f} s: the mapping is "
                                    "gone and the task did not say it unmapped it")
                self._pending(on_pending)
            pos = now

    def _pending(self, on_pending: Callable[[], bool] | None) -> None:
        if on_pending is not None and on_pending():
            return
        if on_pending is None and self.stop.is_set():
            raise FillError(f"task {self.pid}: copy stopped (a fault server failed)")
        time.sleep(0.0002)  # the fault server reads the message (and crosses off) first; an unmap's comes soon

    def _copy_some(self, pos: int, end: int, delta: int) -> int:
        """Copy from ``pos`` until ``end`` or until a message is pending; where it stopped."""
        while pos < end:
            gone = min(((a, b) for a, b in self.removed if a < end and b > pos), default=None)  # the first
            if gone is not None and gone[0] <= pos:
                pos = min(gone[1], end)
                continue
            upto = min(end, gone[0]) if gone is not None else end
            c = _Copy(pos, pos + delta, upto - pos, 0, 0)
            if _libc.ioctl(self.uffd, _UFFDIO_COPY, ctypes.byref(c)) == 0:
                pos += c.copy
                continue
            err = ctypes.get_errno()
            if c.copy > 0:
                pos += c.copy
            elif err == errno.EEXIST or c.copy == -errno.EEXIST:
                pos += PAGE
            elif err == errno.ESRCH or c.copy == -errno.ESRCH:  # the task has exited: nothing more to bring in
                self.exited = True
                return end
            elif err in (errno.EAGAIN, errno.ENOENT) or c.copy in (-errno.EAGAIN, -errno.ENOENT):
                # A message is unread, or the mapping is already gone (unmapped, its message
                # not read yet: the kernel looks the mapping up before it checks for messages).
                return pos
            else:
                raise FillError(f"task {self.pid}: UFFDIO_COPY at {pos:#x} failed: {os.strerror(err)}")
        return pos

    def serve(self, msg: bytes) -> int | None:
        """Take one userfaultfd message (read while no copy runs): a range given up is crossed
        off; a page fault's address is returned, to be served outside the gate."""
        event = msg[0]
        if event == _UFFD_EVENT_PAGEFAULT:
            (addr,) = struct.unpack_from("<Q", msg, 16)
            return int(addr)
        if event in (_UFFD_EVENT_REMOVE, _UFFD_EVENT_UNMAP):
            start, end = struct.unpack_from("<QQ", msg, 8)
            self.removed.append((start, end))
            return None
        # A fork would need its child's memory brought in too, an mremap the ranges moved: rare
        # in the tenths of a second a restore is filled; the restore is done again, the tree
        # stopped until filled (exit status LAYOUT_CHANGED).
        raise LayoutChanged(f"task {self.pid}: userfaultfd event {event:#x} (a fork or mremap) while its memory is restored")

    def serve_fault(self, addr: int, buffer: mmap.mmap, buffer_addr: int, on_pending: Callable[[], bool]) -> int | None:
        """Bring in the page at ``addr`` (the whole span around it once there are spans); the
        span's index, if it was one."""
        page = addr & ~(PAGE - 1)
        where = self.pagemap.find(page)
        if where is None or self._given_up(page):  # a zero page of a registered mapping
            self._zero(page, on_pending)
            return None
        spans = self.spans
        if spans is not None:
            i = bisect.bisect_right(self.span_starts, page) - 1
            if self.claim(i):  # otherwise a fill thread is copying it: its copy wakes the faulting thread
                _copy_span(spans[i], buffer, buffer_addr, on_pending)
            return i
        start, _, offset = where
        got = os.preadv(self.pages_fd, [memoryview(buffer)[:PAGE]], offset + page - start)
        if got != PAGE:
            raise FillError(f"task {self.pid}: the pages image ends early at {offset + page - start}")
        self.copy(page, buffer_addr, PAGE, on_pending)
        r = _Range(page, PAGE)  # the copy woke the faulting thread, unless the page was there already
        _libc.ioctl(self.uffd, _UFFDIO_WAKE, ctypes.byref(r))
        return None

    def _given_up(self, page: int) -> bool:
        return any(a <= page < b for a, b in self.removed)

    def _zero(self, page: int, on_pending: Callable[[], bool]) -> None:
        since = time.monotonic()
        while not self._given_up(page):  # unmapped meanwhile: nothing to serve
            z = _Zero(page, PAGE, 0, 0)
            if _libc.ioctl(self.uffd, _UFFDIO_ZEROPAGE, ctypes.byref(z)) == 0:
                return
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                self.exited = True
            if err in (errno.EEXIST, errno.ESRCH):  # there already, or the task has exited
                return
            if err not in (errno.EAGAIN, errno.ENOENT) or time.monotonic() - since > STUCK_S:
                raise FillError(f"task {self.pid}: UFFDIO_ZEROPAGE at {page:#x} failed: {os.strerror(err)}")
            self._pending(on_pending)


# -- the copy ---------------------------------------------------------------------------------

#: What one thread does at a time: read ``length`` bytes of the task's pages image at ``offset``
#: and copy ``pieces`` of them in, each (address, place in what was read, bytes). A span covers
#: many small ranges (a GPU kernel's image has thousands): one read and no thread hand-over each.
Span = tuple[Task, int, int, list[tuple[int, int, int]]]


def _spans(task: Task, vma_ends: list[int]) -> list[Span]:
    """The task's lazy ranges cut at its mappings' ends (one copy stays inside one mapping) and
    gathered into spans of at most CHUNK bytes of the image (lazy ranges lie in it in address order)."""
    spans: list[Span] = []
    for start, size, offset in task.pagemap.ranges:
        pos, end = start, start + size
        while pos < end:
            i = bisect.bisect_right(vma_ends, pos)
            n = min(pos + CHUNK, end, vma_ends[i] if i < len(vma_ends) else end) - pos
            at = offset + pos - start
            if spans and at + n - spans[-1][1] <= CHUNK:
                _, first, _, pieces = spans[-1]
                pieces.append((pos, at - first, n))
                spans[-1] = (task, first, at + n - first, pieces)
            else:
                spans.append((task, at, n, [(pos, 0, n)]))
            pos += n
    return spans


def _copy_span(span: Span, buffer: mmap.mmap, buffer_addr: int,
               on_pending: Callable[[], bool] | None = None) -> tuple[int, float]:
    """Read the span's part of the image into ``buffer`` and copy its pieces in; the bytes, and
    the seconds the read took."""
    task, offset, length, pieces = span
    if task.exited:  # nothing of it is needed any more: not even read
        return 0, 0.0
    t0 = time.perf_counter()
    view = memoryview(buffer)[:length]
    got = os.preadv(task.pages_fd, [view], offset)
    view.release()
    if got != length:
        raise FillError(f"task {task.pid}: the pages image ends early at {offset + got}")
    read_s = time.perf_counter() - t0
    for dst, at, n in pieces:
        task.copy(dst, buffer_addr + at, n, on_pending)
    return sum(n for _, _, n in pieces), read_s


class Daemon:
    """Takes the restored tasks from CRIU, serves their faults, and once CRIU has finished copies
    their memory in (see the module's docstring)."""

    def __init__(self, images: str, threads: int, log: Log) -> None:
        self.images, self.threads, self.log = images, threads, log
        self.tasks: list[Task] = []
        self.servers: list[threading.Thread] = []
        self.failure: BaseException | None = None
        self.stop = threading.Event()
        self.wake, self._waker = os.pipe()  # readable once the fault servers are to stop
        self.lock = threading.Lock()
        self.read_s = self.copy_s = 0.0  # summed over the threads: where the copying time goes
        self.faulted_spans = 0  # spans the fault servers copied (the task ran and touched them first)
        self.queue: deque[tuple[Task, int]] = deque()  # spans for the fill threads, in order

    def receive(self, conn: socket.socket) -> None:
        """Take tasks from CRIU until it says the restore is finished."""
        while True:
            raw = conn.recv(4, socket.MSG_WAITALL)
            if len(raw) < 4:
                raise FillError("CRIU closed the connection before the restore finished (the restore failed)")
            (word,) = struct.unpack("<i", raw)
            if word == RESTORE_FINISHED:
                return
            if word < 0:  # a zombie: no memory
                continue
            _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            if not fds:
                raise FillError(f"CRIU sent task {word} without its userfaultfd")
            task = Task(word, fds[0], read_pagemap(self.images, word), self.stop)
            task.pages_fd = os.open(task.pagemap.pages, os.O_RDONLY)
            self.tasks.append(task)
            server = threading.Thread(target=self._faults, args=(task,), daemon=True)
            server.start()
            self.servers.append(server)
            self.log(f"task {word}: {task.pagemap.lazy_bytes} bytes in {len(task.pagemap.ranges)} ranges")

    def _faults(self, task: Task) -> None:
        buffer = mmap.mmap(-1, CHUNK)
        buffer_addr = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        poller = select.poll()
        poller.register(task.uffd, select.POLLIN)
        poller.register(self.wake, select.POLLIN)
        faults: list[int] = []  # read while this thread was copying, served after

        def take_message() -> bool:
            with task.gate.reading():
                try:
                    msg = os.read(task.uffd, _UFFD_MSG_SIZE)
                except BlockingIOError:
                    return False
                addr = task.serve(msg)
            if addr is not None:
                faults.append(addr)
            return True

        try:
            while not self.stop.is_set():
                if not [fd for fd, _ in poller.poll() if fd == task.uffd]:
                    continue
                take_message()
                while faults:
                    span = task.serve_fault(faults.pop(0), buffer, buffer_addr, take_message)
                    if span is not None:  # what follows is likely touched next: the fill threads take it now
                        self._put_first([(task, i) for i in range(span + 1, min(span + 1 + self.threads, len(task.claimed)))])
                        with self.lock:
                            self.faulted_spans += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.log(f"Error: {e}")
            self.failure = self.failure or e
            self.stop.set()
            os.write(self._waker, b"x")

    def fill(self) -> int:
        """Every remaining page of every task, by all threads at once; the bytes copied."""
        for task in self.tasks:
            task.set_spans(_spans(task, _vma_ends(task.pid)))
        with self.lock:
            self.queue.extend((task, i) for task in self.tasks for i in range(len(task.claimed)))
        with ThreadPoolExecutor(self.threads) as pool:
            return sum(pool.map(lambda _: self._copy_from_queue(), range(self.threads)))

    def _put_first(self, jobs: list[tuple[Task, int]]) -> None:
        with self.lock:
            self.queue.extendleft(reversed(jobs))

    def _copy_from_queue(self) -> int:
        """One fill thread: spans from the queue until it is empty; the bytes it copied."""
        buffer = mmap.mmap(-1, CHUNK)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        copied = 0
        while True:
            if self.stop.is_set():  # a fault server failed: that is the error to report
                raise self.failure or FillError("stopped")
            with self.lock:
                if not self.queue:
                    return copied
                task, i = self.queue.popleft()
            if not task.claim(i):
                continue
            t0 = time.perf_counter()
            assert task.spans is not None
            n, read_s = _copy_span(task.spans[i], buffer, addr)
            copied += n
            with self.lock:
                self.read_s += read_s
                self.copy_s += time.perf_counter() - t0 - read_s

    def close(self) -> None:
        self.stop.set()
        os.write(self._waker, b"x")
        for server in self.servers:
            server.join()
        for task in self.tasks:
            os.close(task.uffd)  # unregisters: the memory is the process's own from here
            os.close(task.pages_fd)


class Log:
    def __init__(self, path: str | None) -> None:
        self.f = open(path, "a") if path else sys.stderr
        self.t0 = time.monotonic()

    def __call__(self, line: str) -> None:
        print(f"({time.monotonic() - self.t0:8.3f}) {line}", file=self.f, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpucr-pagefill")
    parser.add_argument("-D", dest="images", required=True)
    parser.add_argument("-W", dest="workdir", required=True)
    parser.add_argument("-o", dest="log")
    # 8 copied fastest on the H200 machine (16 cores): 1.7 GB in 0.16 s; 16 took 0.19 s, 1 0.82 s.
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    os.chdir(args.workdir)  # the socket's name is relative, as CRIU's (a full path may be too long)
    log = Log(args.log)
    images = os.path.abspath(args.images)
    daemon = Daemon(images, args.threads, log)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(SOCKET_NAME)
    except FileNotFoundError:
        pass
    listener.bind(SOCKET_NAME)
    listener.listen(1)
    try:
        conn, _ = listener.accept()
        daemon.receive(conn)
        t0 = time.monotonic()
        log(f"restore finished; copying {sum(t.pagemap.lazy_bytes for t in daemon.tasks)} bytes in")
        copied = daemon.fill()
        daemon.close()  # waits for a span a fault server is still copying
        if daemon.failure:
            raise daemon.failure
        log(f"{copied} bytes copied in by {args.threads} threads in {time.monotonic() - t0:.3f} s "
            f"(reading {daemon.read_s:.3f} s, copying in {daemon.copy_s:.3f} s, summed over the threads); "
            f"{daemon.faulted_spans} spans copied for faults, {sum(len(t.removed) for t in daemon.tasks)} ranges given up, "
            f"{sum(t.exited for t in daemon.tasks)} tasks exited meanwhile")
        log("done")
        return 0
    except BaseException as e:  # noqa: BLE001 - any failure must end the tree: exit non-zero
        failure = daemon.failure or e  # a fault server's failure stops the copies: it is the cause
        log(f"Error: {failure}")
        return LAYOUT_CHANGED if isinstance(failure, LayoutChanged) else 1
    finally:
        try:
            os.unlink(SOCKET_NAME)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
