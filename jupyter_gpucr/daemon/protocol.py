"""The daemon's wire format: one JSON object per line over a Unix stream socket.

A request is ``{"op": VERB, "args": {...}}``. The daemon answers with any number of progress lines
``{"progress": [phase, done, total]}`` and then one final line, ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"error": CLASS, "message": ..., "hint": ...}}``. Who asks is never part of
the request: the daemon reads it from the socket (SO_PEERCRED).

A checkpoint asked with ``"ask_before_dump": true`` has one more exchange: once the GPU is free,
before CRIU freezes the process, the daemon sends ``{"before_dump": true}`` and waits for the
client's line, ``{"ok": true}`` to go on or an error line as above to put the process back.
"""
from __future__ import annotations

import json
import math
import socket
import struct
from typing import Any

from ..core import errors
from ..core.errors import GPUCRError

DEFAULT_SOCKET = "/run/gpucr/daemon.sock"
DEFAULT_STATE = "/var/lib/gpucr"
PROTOCOL_VERSION = 1
#: The longest answer a client reads (a listing carries every checkpoint's manifest).
MAX_LINE = 4 << 20
#: The longest request the daemon reads. A request carries a kernel's command, environment and
#: record (a few KiB; Linux's default limit for a command and its environment together is 2 MiB),
#: never images; anything longer is refused before it is parsed.
MAX_REQUEST = 1 << 20
VERBS = ("hello", "run", "checkpoint", "restore", "recover", "recover_all", "list", "remove", "kill", "poll", "await_pages",
         "copy", "files", "in_trash")


class ProtocolError(GPUCRError):
    status = 400


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def read_line(f: Any) -> dict[str, Any] | None:
    """One message from a socket file; None at end of stream."""
    line = f.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise ProtocolError("The message is too long or truncated.")
    return parse(line)


def parse(line: bytes) -> dict[str, Any]:
    """One message from its line: a JSON object in UTF-8 with finite numbers. Whatever the line
    holds (nesting deeper than the parser's stack, digits past Python's limit, invalid UTF-8), the
    error is a ProtocolError."""
    try:
        msg = json.loads(line.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except UnicodeDecodeError:
        raise ProtocolError("The message is not UTF-8.") from None
    except RecursionError:
        raise ProtocolError("The message is nested too deeply.") from None
    except ValueError as e:
        raise ProtocolError(f"The message is not JSON: {printable(e)}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("The message is not a JSON object.")
    return msg


def request(line: bytes) -> dict[str, Any]:
    """A request from its line: a message whose ``op`` is a verb and whose ``args``, if any, an
    object. Checked before the request is dispatched, so that a malformed one is refused (and
    logged) as a connection is, never as a request."""
    msg = parse(line)
    op, args = msg.get("op"), msg.get("args")
    if not isinstance(op, str) or op not in VERBS:
        raise ProtocolError(f"Unknown request {printable(op)!r}.", f"The daemon knows: {', '.join(VERBS)}.")
    if args is not None and not isinstance(args, dict):
        raise ProtocolError("args must be a JSON object.")
    return msg


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {printable(text, 40)} is out of range")
    return value


def printable(value: object, limit: int = 200) -> str:
    """``value`` as it may go into a log line: a request's op and names come from the user, and a
    line break in them would write a line of their own; so control characters, non-ASCII and
    backslashes are escaped, and the text is cut at ``limit`` characters."""
    text = str(value)
    cut = f"...({len(text)} characters)" if len(text) > limit else ""
    return text[:limit].encode("unicode_escape").decode("ascii") + cut


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel recorded them at connect."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def error_from(payload: dict[str, Any]) -> GPUCRError:
    """The client-side exception for an error the daemon sent (same class, message, hint, summary and
    retryable)."""
    cls = getattr(errors, str(payload.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, GPUCRError)):
        cls = ProtocolError if payload.get("error") == "ProtocolError" else errors.EngineError
    message = str(payload.get("message", "The gpucr daemon failed."))
    summary, retryable = payload.get("summary"), payload.get("retryable")
    error = cls(message, str(payload.get("hint", "")),
                summary=summary if isinstance(summary, str) and summary != message else None,
                retryable=retryable if isinstance(retryable, bool) else None)
    if isinstance(error, errors.PutBackError):
        error.started = payload.get("started")
    return error
