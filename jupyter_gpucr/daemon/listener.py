"""The daemon's socket: accepts connections so that no user can exhaust the daemon for the others.

Every local user may connect, so every resource a connection takes is bounded before it is spent,
and nothing one user sends can keep another's request waiting:

- One thread accepts every connection and reads every request line, never blocking on a client:
  the kernel's queue of connections is emptied as fast as it fills, so a user who connects in a
  tight loop keeps nobody else from connecting. A request gets a thread of its own only once its
  line is whole; it is parsed there, so a request that is slow to parse holds no one else's.
- Connections are counted per uid and in total (SO_PEERCRED is read at accept). One over either cap
  gets one error line and is closed at once: no thread, no buffer.
- The request line must arrive whole within ``request_timeout`` (a client that sends a byte now
  and then holds nothing for long), and is read in chunks up to ``MAX_REQUEST`` without parsing.
- The first ``FREE_BYTES`` of each request cost nothing (every ordinary request is smaller); larger
  requests draw on one budget for the whole daemon until their connection ends, so the daemon's
  memory stays bounded whatever the number of users, and small requests are never refused for it.
- A request that is not a JSON object naming a verb, whatever its shape, is answered with the
  reason; refusals and failures of connections are logged at most once per ``LOG_EVERY`` per uid.
- Answers that the client does not read time out (``SEND_TIMEOUT``) instead of holding a thread.

A long operation (a checkpoint can take minutes) holds its connection, which is why the per-uid cap
counts open requests rather than a rate: a user may suspend several kernels at once.
"""
from __future__ import annotations

import errno
import logging
import os
import queue
import selectors
import socket
import threading
import time
import traceback
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import BusyError, GPUCRError, StateError
from .protocol import MAX_REQUEST, ProtocolError, encode, parse, peer_credentials, printable, request

log = logging.getLogger("gpucr-daemon")
#: What every request may take without drawing on the budget of large requests.
FREE_BYTES = 64 << 10
#: The budget of large requests (beyond ``FREE_BYTES`` each) over the whole daemon.
LARGE_BUDGET = 64 << 20
#: How long one write of an answer may wait for the client to read.
SEND_TIMEOUT = 60.0
#: The longest line a client sends in reply to a question of the daemon (``Connection.ask``).
MAX_REPLY = 64 << 10
#: How often, at most, refusals of one uid are logged (the rest are counted).
LOG_EVERY = 10.0
#: Connections accepted in a row before the requests under way are read again.
ACCEPT_BATCH = 64
_CHUNK = 64 << 10

Credentials = tuple[int, int, int]  # pid, uid, gid


@dataclass(frozen=True)
class Limits:
    """What connections may take; see the module docstring."""

    per_user: int = 16
    total: int = 256
    request_timeout: float = 10.0


@dataclass(eq=False)
class _Arriving:
    """A connection whose request line is still arriving."""

    conn: socket.socket
    creds: Credentials
    deadline: float
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    reserved: int = 0


class Listener:
    """Accepts connections on a Unix socket and hands each whole request to ``handler`` in its own
    thread, with the ``Connection`` for its answer lines."""

    def __init__(self, path: Path, handler: Handler, limits: Limits = Limits()) -> None:
        self.path, self.handler, self.limits = path, handler, limits
        self._open: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._budget = _Budget(LARGE_BUDGET)
        self._refusals = _RefusalLog()
        self._stopping = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._arriving: OrderedDict[_Arriving, None] = OrderedDict()  # by deadline: as accepted
        self._whole: queue.SimpleQueue[tuple[socket.socket, Credentials, bytes, int] | None] = queue.SimpleQueue()
        self.sock = _bind(path)

    def serve_forever(self) -> None:
        """Accept connections and read their requests in this thread; whole requests go to
        ``_start_threads``, which starts their threads (a start waits for the new thread)."""
        self.sock.setblocking(False)
        self._selector.register(self.sock, selectors.EVENT_READ)
        starter = threading.Thread(target=self._start_threads, daemon=True, name="starter")
        starter.start()
        try:
            while not self._stopping.is_set():
                for key, _ in self._selector.select(self._wait()):
                    if key.data is None:
                        self._accept_waiting()
                    else:
                        self._receive(key.data)
                self._expire()
        finally:
            self._whole.put(None)
            while self._arriving:
                self._finish(next(iter(self._arriving)))

    def shutdown(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        self._selector.close()
        self.sock.close()

    # -- admission ------------------------------------------------------------------------
    def _accept_waiting(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._refusals.note(-1, f"cannot accept connections: {e.strerror}")
                    time.sleep(0.05)  # the waiting connections stay queued; never spin
                    return
                raise
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        try:
            creds = peer_credentials(conn)
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        refusal = self._take_slot(creds[1])
        if refusal is not None:
            self._refusals.note(creds[1], refusal.message)
            _send_once(conn, refusal)
            conn.close()
            return
        arriving = _Arriving(conn, creds, time.monotonic() + self.limits.request_timeout)
        self._arriving[arriving] = None
        self._selector.register(conn, selectors.EVENT_READ, arriving)

    def _take_slot(self, uid: int) -> GPUCRError | None:
        with self._lock:
            if self._open[uid] >= self.limits.per_user:
                return BusyError(f"too many open requests from uid {uid} (limit {self.limits.per_user}).",
                                 "Wait for your running checkpoints and restores to finish, then retry.")
            if self._open.total() >= self.limits.total:
                return BusyError(f"The gpucr daemon serves its limit of {self.limits.total} open requests.",
                                 "Retry in a moment.")
            self._open[uid] += 1
            return None

    def _give_slot(self, uid: int) -> None:
        with self._lock:
            self._open[uid] -= 1
            if self._open[uid] <= 0:
                del self._open[uid]

    # -- request lines --------------------------------------------------------------------
    def _wait(self) -> float:
        """How long the selector may wait: until the oldest request is due, at most 0.5 s (to
        notice ``shutdown``)."""
        due = next(iter(self._arriving)).deadline - time.monotonic() if self._arriving else 0.5
        return min(0.5, max(0.0, due))

    def _receive(self, arriving: _Arriving) -> None:
        """One read of a request under way (one per turn, so that each client gets its turn)."""
        try:
            line = self._read_some(arriving)
        except GPUCRError as e:
            self._refuse(arriving, e)
            return
        except OSError:
            self._finish(arriving)
            return
        if line is None:
            return
        if not line:  # closed without a request
            self._finish(arriving)
            return
        self._selector.unregister(arriving.conn)
        del self._arriving[arriving]
        self._whole.put((arriving.conn, arriving.creds, line, arriving.reserved))

    def _read_some(self, arriving: _Arriving) -> bytes | None:
        """The whole request line; None while more is to come; b"" when the client closed first."""
        try:
            chunk = arriving.conn.recv(_CHUNK)
        except BlockingIOError:
            return None
        if not chunk:
            if arriving.chunks:
                raise ProtocolError("The request ended without a line break.")
            return b""
        end = chunk.find(b"\n")
        if end >= 0:
            chunk = chunk[:end + 1]
        arriving.size += len(chunk)
        if arriving.size > MAX_REQUEST:
            raise ProtocolError(f"The request is longer than {MAX_REQUEST >> 20} MiB, the daemon's limit.",
                                "A request carries a command, its environment and a record: make the environment smaller.")
        need = arriving.size - FREE_BYTES - arriving.reserved
        if need > 0:
            if not self._budget.take(need):
                raise BusyError("The gpucr daemon is reading its limit of large requests "
                                f"({LARGE_BUDGET >> 20} MiB).", "Retry in a moment.")
            arriving.reserved += need
        arriving.chunks.append(chunk)
        if end < 0:
            return None
        line = b"".join(arriving.chunks)
        arriving.chunks.clear()
        return line

    def _expire(self) -> None:
        """Refuse the requests that did not arrive in time."""
        now = time.monotonic()
        while self._arriving and (arriving := next(iter(self._arriving))).deadline <= now:
            timeout = self.limits.request_timeout
            self._refuse(arriving, ProtocolError(f"The request did not arrive within {timeout:g} s.",
                                                 "Send the whole request line at once."))

    def _refuse(self, arriving: _Arriving, error: GPUCRError) -> None:
        self._refusals.note(arriving.creds[1], error.message)
        _send_once(arriving.conn, error)
        self._finish(arriving)

    def _finish(self, arriving: _Arriving) -> None:
        """Close a connection whose request never became whole, and give back what it took."""
        if self._arriving.pop(arriving, False) is False:
            return  # finished already
        self._selector.unregister(arriving.conn)
        arriving.conn.close()
        arriving.chunks.clear()
        self._budget.give(arriving.reserved)
        self._give_slot(arriving.creds[1])

    # -- whole requests -------------------------------------------------------------------
    def _start_threads(self) -> None:
        while (whole := self._whole.get()) is not None:
            conn, (_, uid, _), _, reserved = whole
            try:
                threading.Thread(target=self._serve, args=whole, daemon=True, name=f"uid-{uid}").start()
            except RuntimeError:  # no thread to be had: the host is out of them
                error = BusyError("The gpucr daemon cannot start another thread.", "Retry in a moment.")
                self._refusals.note(uid, error.message)
                _send_once(conn, error)
                self._end(conn, uid, reserved)

    def _serve(self, conn: socket.socket, creds: Credentials, line: bytes, reserved: int) -> None:
        uid = creds[1]
        try:
            try:
                msg = request(line)
            except GPUCRError as e:
                self._refusals.note(uid, e.message)
                _send_once(conn, e)
                return
            del line
            self.handler(creds, msg, Connection(conn))
        except Exception as e:  # noqa: BLE001 - one connection's failure never stops the daemon
            self._refusals.note(uid, f"the connection failed: {e!r}", "".join(traceback.format_tb(e.__traceback__)))
        finally:
            self._end(conn, uid, reserved)

    def _end(self, conn: socket.socket, uid: int, reserved: int) -> None:
        conn.close()
        self._budget.give(reserved)
        self._give_slot(uid)


class Connection:
    """Writes answer lines; once one could not be written (the client is gone or does not read),
    the rest are dropped: the operation still finishes."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.dead = False

    def send(self, obj: Any) -> bool:
        with self.lock:
            if self.dead:
                return False
            try:
                self.conn.settimeout(SEND_TIMEOUT)
                self.conn.sendall(encode(obj))
                return True
            except OSError:
                self.dead = True
                return False

    def ask(self, obj: Any, timeout: float) -> dict[str, Any] | None:
        """Send ``obj`` and wait up to ``timeout`` for the client's one-line reply; None when the
        client is gone, does not answer in time or answers with more than ``MAX_REPLY`` bytes."""
        if not self.send(obj):
            return None
        deadline = time.monotonic() + timeout
        line = b""
        try:
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or len(line) > MAX_REPLY:
                    return None
                self.conn.settimeout(left)
                chunk = self.conn.recv(MAX_REPLY)
                if not chunk:
                    return None
                line += chunk
            return parse(line)
        except (OSError, GPUCRError):
            return None


Handler = Callable[[Credentials, dict[str, Any], Connection], None]


class _Budget:
    """Bytes shared by every connection."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self.lock:
            if n > self.left:
                return False
            self.left -= n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.left += n


class _RefusalLog:
    """Logs refusals and failures of connections at most once per ``LOG_EVERY`` per uid, with how
    many more there were: a flood of connections must not become a flood of log lines."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[int, float] = {}
        self.quiet: Counter[int] = Counter()

    def note(self, uid: int, why: str, detail: str = "") -> None:
        """``why`` (escaped, cut) and ``detail`` (a traceback: the daemon's own text) when logged."""
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(uid, -LOG_EVERY) < LOG_EVERY:
                self.quiet[uid] += 1
                return
            self.last[uid] = now
            more = self.quiet.pop(uid, 0)
        who = "the daemon" if uid < 0 else f"uid {uid}"
        log.warning("%s: %s%s%s", who, printable(why), f" ({more} more refusals not logged)" if more else "",
                    f"\n{detail}" if detail else "")


def _send_once(conn: socket.socket, error: GPUCRError) -> None:
    """An error line to a connection about to be closed, without waiting for its reader."""
    try:
        conn.send(encode({"ok": False, "error": error.to_dict()}), socket.MSG_DONTWAIT)
    except OSError:
        pass


def _bind(path: Path) -> socket.socket:
    """Bind the socket (any local user may connect; each request is authorized by its credentials)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
            raise StateError(f"A gpucr daemon already listens on {path}.")
        except ConnectionRefusedError:
            path.unlink()
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock
