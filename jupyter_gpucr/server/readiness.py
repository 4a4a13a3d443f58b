"""Kernel requests wait until the kernels an earlier server left are listed again.

jupyter_server answers HTTP before extensions have started, and listing those kernels can take
seconds (one left running is first put on disk). Until then ``/api/kernels/ID`` would answer
404 for a kernel about to be listed, and a client (JupyterLab reconnecting, an agent) would take
it for gone. :class:`Readiness` holds the requests of the kernel, session, status and gpucr APIs
until :meth:`Readiness.open` is called; everything else (pages, the hub's readiness check of
``/api``) is served at once.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.utils import url_path_join
from tornado import httputil
from tornado.web import Application

HELD = ("api/status", "api/kernels", "api/sessions", "api/gpucr")


class Readiness:
    """See the module docstring."""

    def __init__(self, base_url: str) -> None:
        self._held = tuple(url_path_join(base_url, path) for path in HELD)
        self._open = asyncio.Event()

    def hold_requests(self, app: Application) -> None:
        """Put the gate in front of ``app``: before the server's HTTP server exists, as it
        takes the application's ``start_request`` for each request."""
        start_request = app.start_request

        def gated(server_conn: object, request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
            return _Held(self, start_request(server_conn, request_conn))

        app.start_request = gated  # type: ignore[method-assign]

    def open(self) -> None:
        self._open.set()

    async def open_after(self, relist: Callable[[], Awaitable[None]], log: Any) -> None:
        """Hold requests until ``relist`` (the kernels an earlier server left) has run, whatever it
        raised: what was listed stays listed, and the server must answer all the same."""
        try:
            await relist()
        except Exception:
            log.exception("gpucr: listing the kernels an earlier server left failed")
        finally:
            self.open()

    async def wait(self) -> None:
        await self._open.wait()

    def holds(self, path: str) -> bool:
        return not self._open.is_set() and path.startswith(self._held)


class _Held(httputil.HTTPMessageDelegate):
    """One request; its headers reach the application once the gate is open. Tornado reads
    the body only after the awaitable ``headers_received`` returns has finished."""

    def __init__(self, readiness: Readiness, delegate: httputil.HTTPMessageDelegate) -> None:
        self.readiness = readiness
        self.delegate = delegate

    def headers_received(self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
                         headers: httputil.HTTPHeaders) -> Awaitable[None] | None:
        if isinstance(start_line, httputil.RequestStartLine) and self.readiness.holds(start_line.path):
            return self._when_open(start_line, headers)
        return self.delegate.headers_received(start_line, headers)

    async def _when_open(self, start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> None:
        await self.readiness.wait()
        received = self.delegate.headers_received(start_line, headers)
        if received is not None:
            await received

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        return self.delegate.data_received(chunk)

    def finish(self) -> None:
        self.delegate.finish()

    def on_connection_close(self) -> None:
        self.delegate.on_connection_close()
