"""Bring a restored process's memory back with many threads, in place of CRIU's lazy-pages daemon.

CRIU's eager restore reads every page with one thread (``preadv`` in its restorer), faulting in one
4 KiB page at a time: 1.2 s for the 1.6 GB image of a GPU kernel on the H200 machine, the largest
part of its restore. With ``criu restore --lazy-pages`` CRIU rebuilds the process without that
memory (0.2-0.3 s) and hands each restored task's userfaultfd to the daemon listening on
``lazy-pages.socket`` in its work directory. This is such a daemon: it serves the few pages the
restore itself touches, and once CRIU says the restore is finished (the tree is left stopped) it
copies every remaining page in with ``UFFDIO_COPY`` from a pool of threads, each reading its own
part of the pages image, then closes the userfaultfds and exits 0. Only then is the tree continued,
so it never runs with memory missing; any failure exits non-zero and the holder kills the tree
(missing pages would read as zeros).

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

SOCKET_NAME = "lazy-pages.socket"  # what CRIU connects to, relative to its work directory
RESTORE_FINISHED = 0x52535446  # CRIU's "ReSTore Finished" word; PIDs are below 2**22
PAGE = 4096
CHUNK = 4 << 20  # bytes one thread reads and copies in at a time

# CRIU image framing: two magic words, then entries of (u32 size, protobuf message).
_IMG_COMMON, _PAGEMAP_MAGIC = 0x54564319, 0x56084025
_PE_PARENT, _PE_LAZY, _PE_PRESENT = 1, 2, 4

# <linux/userfaultfd.h>
_UFFD_EVENT_PAGEFAULT = 0x12
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


# -- the images ------------------------------------------------------------------------------

def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _fields(b: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message (all a pagemap entry has)."""
    out, i = {}, 0
    while i < len(b):
        key, i = _varint(b, i)
        if key & 7 != 0:
            raise FillError(f"unexpected protobuf wire type {key & 7} in a pagemap entry")
        out[key >> 3], i = _varint(b, i)
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
        entries.append(_fields(data[i + 4:i + 4 + size]))
        i += 4 + size
    pm = Pagemap(os.path.join(images, f"pages-{entries[0][1]}.img"))
    offset = 0
    for e in entries[1:]:
        flags, nr = e.get(4, 0), e.get(5) or e.get(2, 0)  # CRIU 4 moved nr_pages to field 5
        if flags & _PE_PARENT:
            raise FillError("incremental checkpoints (pages in a parent image) are not supported")
        if not flags & _PE_PRESENT:
            continue  # zero pages: nothing in the file, read as zeros once the process runs
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

@dataclass
class Task:
    """A restored task: its userfaultfd (from CRIU) and where its lazy memory lies in the images."""

    pid: int
    uffd: int
    pagemap: Pagemap
    stop: threading.Event
    pages_fd: int = -1

    def copy(self, dst: int, src: int, length: int) -> None:
        """Copy ``length`` bytes at ``src`` into the task at ``dst``; pages already there (a
        fault got them first) are skipped."""
        done = 0
        while done < length:
            c = _Copy(dst + done, src + done, length - done, 0, 0)
            if _libc.ioctl(self.uffd, _UFFDIO_COPY, ctypes.byref(c)) == 0:
                done += c.copy
                continue
            err = ctypes.get_errno()
            if c.copy > 0:
                done += c.copy
            elif err == errno.EEXIST or c.copy == -errno.EEXIST:
                done += PAGE
            elif err != errno.EAGAIN:
                raise FillError(f"task {self.pid}: UFFDIO_COPY at {dst + done:#x} failed: {os.strerror(err)}")
            elif self.stop.is_set():  # the event that made the copy retry was not a page fault
                raise FillError(f"task {self.pid}: its memory layout changed while it was restored")

    def serve_fault(self, addr: int, buffer: mmap.mmap, buffer_addr: int) -> None:
        """A page the restore itself touched, before the bulk copy."""
        page = addr & ~(PAGE - 1)
        where = self.pagemap.find(page)
        if where is None:  # a zero page of a registered mapping
            z = _Zero(page, PAGE, 0, 0)
            if _libc.ioctl(self.uffd, _UFFDIO_ZEROPAGE, ctypes.byref(z)) != 0 and ctypes.get_errno() != errno.EEXIST:
                raise FillError(f"task {self.pid}: UFFDIO_ZEROPAGE at {page:#x} failed: {os.strerror(ctypes.get_errno())}")
            return
        start, _, offset = where
        got = os.preadv(self.pages_fd, [memoryview(buffer)[:PAGE]], offset + page - start)
        if got != PAGE:
            raise FillError(f"task {self.pid}: the pages image ends early at {offset + page - start}")
        self.copy(page, buffer_addr, PAGE)
        r = _Range(page, PAGE)  # the copy woke the faulting thread, unless the page was there already
        _libc.ioctl(self.uffd, _UFFDIO_WAKE, ctypes.byref(r))


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


class Daemon:
    """Takes the restored tasks from CRIU, serves their faults until the restore is finished, then
    copies their memory in (see the module's docstring)."""

    def __init__(self, images: str, threads: int, log: Log) -> None:
        self.images, self.threads, self.log = images, threads, log
        self.tasks: list[Task] = []
        self.servers: list[threading.Thread] = []
        self.failure: BaseException | None = None
        self.stop = threading.Event()
        self.wake, self._waker = os.pipe()  # readable once the fault servers are to stop
        self.lock = threading.Lock()
        self.read_s = self.copy_s = 0.0  # summed over the threads: where the copying time goes

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
        buffer = mmap.mmap(-1, PAGE)
        buffer_addr = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        poller = select.poll()
        poller.register(task.uffd, select.POLLIN)
        poller.register(self.wake, select.POLLIN)
        try:
            while not self.stop.is_set():
                if not [fd for fd, _ in poller.poll() if fd == task.uffd]:
                    continue
                try:
                    msg = os.read(task.uffd, _UFFD_MSG_SIZE)
                except BlockingIOError:
                    continue
                event = msg[0]
                if event != _UFFD_EVENT_PAGEFAULT:
                    raise FillError(f"task {task.pid}: unexpected userfaultfd event {event:#x} while its memory is restored")
                (addr,) = struct.unpack_from("<Q", msg, 16)
                task.serve_fault(addr, buffer, buffer_addr)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.log(f"Error: {e}")
            self.failure = self.failure or e
            self.stop.set()
            os.write(self._waker, b"x")

    def fill(self) -> int:
        """Every remaining page of every task, by all threads at once; the bytes copied."""
        spans = [span for task in self.tasks for span in _spans(task, _vma_ends(task.pid))]
        local = threading.local()

        def one(span: Span) -> int:
            if self.stop.is_set():  # a fault server failed: that is the error to report
                raise self.failure or FillError("stopped")
            if not hasattr(local, "buffer"):
                local.buffer = mmap.mmap(-1, CHUNK)
                local.addr = ctypes.addressof(ctypes.c_char.from_buffer(local.buffer))
            task, offset, length, pieces = span
            t0 = time.perf_counter()
            view = memoryview(local.buffer)[:length]
            got = os.preadv(task.pages_fd, [view], offset)
            view.release()
            if got != length:
                raise FillError(f"task {task.pid}: the pages image ends early at {offset + got}")
            t1 = time.perf_counter()
            for dst, at, n in pieces:
                task.copy(dst, local.addr + at, n)
            with self.lock:
                self.read_s += t1 - t0
                self.copy_s += time.perf_counter() - t1
            return sum(n for _, _, n in pieces)

        with ThreadPoolExecutor(self.threads) as pool:
            return sum(pool.map(one, spans))

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
        if daemon.failure:
            raise daemon.failure
        log(f"{copied} bytes copied in by {args.threads} threads in {time.monotonic() - t0:.3f} s "
            f"(reading {daemon.read_s:.3f} s, copying in {daemon.copy_s:.3f} s, summed over the threads)")
        daemon.close()
        log("done")
        return 0
    except BaseException as e:  # noqa: BLE001 - any failure must end the tree: exit non-zero
        log(f"Error: {e}")
        return 1
    finally:
        try:
            os.unlink(SOCKET_NAME)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
