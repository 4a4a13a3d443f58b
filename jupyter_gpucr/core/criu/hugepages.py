"""Give a restored process its transparent huge pages back.

CRIU restores anonymous memory by writing it page by page into fresh mappings, so a process that
had its large arrays in 2 MiB pages (numpy advises them; THP "always" gives them to all) comes back
in 4 KiB pages. That costs its own work TLB misses: on the CPU machine a sum over a 1.7 GB array
took 1.4x as long, a random gather 1.3x (``bench/bench_repeat.py``). The next dump is not slower
for it (an earlier reading said so; that was the VM's host taking back freed memory, see
``hostmemory``). After a restore, the dense regions the kernel would back with huge pages are collapsed again
(``process_madvise(MADV_COLLAPSE)``, Linux 6.1+), in a background thread at the lowest CPU
priority. Regions mostly unpopulated are left alone, so the process does not grow. Where the
kernel cannot do it (older kernels, no CAP_SYS_NICE), nothing happens.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterable

import psutil

log = logging.getLogger(__name__)

HUGE = 2 << 20
STEP = 64 << 20  # per call: a stop request waits for one step at most
MADV_COLLAPSE = 25
SYS_PROCESS_MADVISE = 440  # the same in x86_64's table and the generic one (arm64)
DENSE = 0.9  # collapse a region only if this much of it is in memory already

_libc = ctypes.CDLL(None, use_errno=True)


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def dense_regions(pid: int) -> list[tuple[int, int]]:
    """2 MiB-aligned ranges of the process's THP-eligible, mostly populated memory that is not
    in huge pages yet."""
    regions: list[tuple[int, int]] = []
    start = end = rss = huge = 0
    eligible = False

    def close() -> None:
        lo, hi = (start + HUGE - 1) & ~(HUGE - 1), end & ~(HUGE - 1)
        if eligible and hi > lo and rss >= DENSE * (end - start) and huge < rss:
            regions.append((lo, hi))

    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            key, _, value = line.partition(" ")
            if "-" in key and not key.endswith(":"):
                if end:
                    close()
                lo_hex, hi_hex = key.split("-")
                start, end, rss, huge, eligible = int(lo_hex, 16), int(hi_hex, 16), 0, 0, False
            elif key == "Rss:":
                rss = int(value.split()[0]) << 10
            elif key == "AnonHugePages:":
                huge = int(value.split()[0]) << 10
            elif key == "THPeligible:":
                eligible = value.strip() == "1"
    if end:
        close()
    return regions


def collapse(pids: Iterable[int], stop: threading.Event | None = None) -> int:
    """Collapse the dense regions of each process into huge pages, until ``stop`` is set;
    returns the bytes done."""
    done = 0
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            for lo, hi in dense_regions(pid):
                for step in range(lo, hi, STEP):
                    if stop is not None and stop.is_set():
                        return done
                    iov = _IOVec(step, min(STEP, hi - step))
                    n = _libc.syscall(SYS_PROCESS_MADVISE, pidfd, ctypes.byref(iov), 1, MADV_COLLAPSE, 0)
                    if n >= 0:
                        done += n
                        continue
                    err = ctypes.get_errno()
                    log.debug("gpucr: no huge pages at %#x of %d: %s", step, pid, os.strerror(err))
                    if err in (errno.EINVAL, errno.EPERM, errno.ENOSYS):  # none will work
                        return done
        except OSError:  # the process exited meanwhile
            pass
        finally:
            os.close(pidfd)
    return done


_running: dict[int, Collapse] = {}  # by the restored tree's root pid, whichever Checkpointer started it


def start(pids: list[int], after: Callable[[], bool] | None = None) -> None:
    """Collapse the restored tree ``pids`` (its root first) in the background, once ``after``
    returned True (its memory is all back; False: it never will be, leave it)."""
    if pids:
        _running[pids[0]] = Collapse(pids, after)


def stop(pid: int) -> None:
    """A checkpoint of the tree rooted at ``pid`` begins: stop its collapse, if one runs."""
    running = _running.pop(pid, None)
    if running is not None:
        running.stop()


class Collapse:
    """:func:`collapse` in a daemon thread at nice 19 (the kernel does the work in the caller's
    context, so the thread's priority is what counts)."""

    def __init__(self, pids: list[int], after: Callable[[], bool] | None = None) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pids, after), name="gpucr-hugepages", daemon=True)
        self._thread.start()

    def _run(self, pids: list[int], after: Callable[[], bool] | None) -> None:
        try:
            if after is not None and not after():
                return
            psutil.Process(threading.get_native_id()).nice(19)
            log.debug("gpucr: collapsed %d MiB into huge pages", collapse(pids, self._stop) >> 20)
        except Exception as e:  # best effort: never disturbs the restored process
            log.debug("gpucr: collapsing into huge pages failed: %s", e)
        finally:
            if _running.get(pids[0]) is self:
                del _running[pids[0]]

    def stop(self) -> None:
        """Stop after the current step and wait for it."""
        self._stop.set()
        self._thread.join()
