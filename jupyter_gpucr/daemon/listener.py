"""The daemon's socket: accepts connections so that no user can exhaust the daemon for the others.

Every local user may connect, so every resource a connection takes is bounded before it is spent:

- Connections are counted per uid and in total (SO_PEERCRED is read at accept). One over either cap
  gets one error line and is closed at once, in the accepting thread: no thread, no buffer.
- The request line must arrive whole within ``request_timeout`` (a client that sends a byte now
  and then holds nothing for long), and is read in chunks up to ``MAX_REQUEST`` without parsing.
- The first ``FREE_BYTES`` of each request cost nothing (every ordinary request is smaller); larger
  requests draw on one budget for the whole daemon until their connection ends, so the daemon's
  memory stays bounded whatever the number of users, and small requests are never refused for it.
- Answers that the client does not read time out (``SEND_TIMEOUT``) instead of holding a thread.

A long operation (a checkpoint can take minutes) holds its connection, which is why the per-uid cap
counts open requests rather than a rate: a user may suspend several kernels at once.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BusyError, GPUCRError, StateError
from .protocol import MAX_REQUEST, ProtocolError, encode, parse, peer_credentials, printable

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
_CHUNK = 64 << 10

Credentials = tuple[int, int, int]  # pid, uid, gid


@dataclass(frozen=True)
class Limits:
    """What connections may take; see the module docstring."""

    per_user: int = 16
    total: int = 256
    request_timeout: float = 10.0


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
        self.sock = _bind(path)

    def serve_forever(self) -> None:
        self.sock.settimeout(0.5)  # to notice shutdown()
        while not self._stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._stopping.is_set():
                    break
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._refusals.note(-1, f"cannot accept connections: {e.strerror}")
                    time.sleep(0.05)  # the waiting connections stay queued; never spin
                    continue
                raise
            self._admit(conn)

    def shutdown(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        self.sock.close()

    # -- admission ------------------------------------------------------------------------
    def _admit(self, conn: socket.socket) -> None:
        try:
            creds = peer_credentials(conn)
        except OSError:
            conn.close()
            return
        uid = creds[1]
        refusal = self._take_slot(uid)
        if refusal is None:
            try:
                threading.Thread(target=self._serve, args=(conn, creds), daemon=True, name=f"uid-{uid}").start()
                return
            except RuntimeError:  # no thread to be had: the host is out of them
                self._give_slot(uid)
                refusal = BusyError("The gpucr daemon cannot start another thread.", "Retry in a moment.")
        self._refusals.note(uid, refusal.message)
        _send_once(conn, refusal)
        conn.close()

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

    # -- one connection -------------------------------------------------------------------
    def _serve(self, conn: socket.socket, creds: Credentials) -> None:
        uid = creds[1]
        reserved = 0
        try:
            try:
                line, reserved = self._read_request(conn)
                if not line:
                    return  # closed without a request
                msg = parse(line)
            except GPUCRError as e:
                self._refusals.note(uid, e.message)
                _send_once(conn, e)
                return
            del line
            self.handler(creds, msg, Connection(conn))
        except Exception:  # noqa: BLE001 - one connection's failure never stops the daemon
            log.exception("uid %d: the connection failed", uid)
        finally:
            conn.close()
            self._budget.give(reserved)
            self._give_slot(uid)

    def _read_request(self, conn: socket.socket) -> tuple[bytes, int]:
        """The request line, or b"" when the client closed first; and the bytes it took from the
        budget (given back by the caller once the connection ends)."""
        timeout = self.limits.request_timeout
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        size = reserved = 0
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                conn.settimeout(left)
                chunk = conn.recv(_CHUNK)
                if not chunk:
                    if chunks:
                        raise ProtocolError("The request ended without a line break.")
                    return b"", reserved
                end = chunk.find(b"\n")
                if end >= 0:
                    chunk = chunk[:end + 1]
                size += len(chunk)
                if size > MAX_REQUEST:
                    raise ProtocolError(f"The request is longer than {MAX_REQUEST >> 20} MiB, the daemon's limit.",
                                        "A request carries a command, its environment and a record: make the environment smaller.")
                need = size - FREE_BYTES - reserved
                if need > 0:
                    if not self._budget.take(need):
                        raise BusyError("The gpucr daemon is reading its limit of large requests "
                                        f"({LARGE_BUDGET >> 20} MiB).", "Retry in a moment.")
                    reserved += need
                chunks.append(chunk)
                if end >= 0:
                    return b"".join(chunks), reserved
        except TimeoutError:
            self._budget.give(reserved)
            raise ProtocolError(f"The request did not arrive within {timeout:g} s.", "Send the whole request line at once.") from None
        except BaseException:
            self._budget.give(reserved)
            raise


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
    """Logs refused connections at most once per ``LOG_EVERY`` per uid, with how many more there
    were: a flood of connections must not become a flood of log lines."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[int, float] = {}
        self.quiet: Counter[int] = Counter()

    def note(self, uid: int, why: str) -> None:
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(uid, -LOG_EVERY) < LOG_EVERY:
                self.quiet[uid] += 1
                return
            self.last[uid] = now
            more = self.quiet.pop(uid, 0)
        who = "the daemon" if uid < 0 else f"uid {uid}"
        log.warning("%s: %s%s", who, printable(why), f" ({more} more refusals not logged)" if more else "")


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
