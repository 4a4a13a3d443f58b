"""The Jupyter kernel conformance suite (``jupyter_kernel_test``) over the server's websocket, as
JupyterLab and agent frameworks talk to a kernel, once with the kernel suspended before every test
(each request then meets a kernel on disk: ``kernel_info`` is answered from what was saved, every
other request restores it) and once without suspends, as a baseline through the same server.

After a restore a client must see what a fresh kernel sends: for each request one ``busy`` and one
``idle`` (parent: that request), the busy before the request's other messages and the idle after
them, and nothing without a parent. The suite checks part of that (a ``status: busy`` first, then
only the request's own messages up to its ``idle``); :meth:`_Conformance.tearDown` checks all of it
over every message of the test. The suspended run also has the keep-alive of a waiting request fire
during each restore (``restore_keepalive_s`` 0.1 s): a keep-alive must not add messages either.

The suite's own tests run in full (12; about 40 s in all on 2 cores, most of it 11 restores)."""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from pathlib import Path
from typing import Any

import jupyter_kernel_test
import pytest
import websocket
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session

from tests.agent_servers import TOKEN, free_port, kill_leftovers
from tests.conftest import criu_or_skip

pytestmark = pytest.mark.timeout(300)


class WebsocketChannel:
    """One channel of :class:`WebsocketKernelClient`: what the suite calls on a channel."""

    def __init__(self, client: WebsocketKernelClient, name: str) -> None:
        self.client, self.name = client, name
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()

    def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return self.messages.get(timeout=timeout)  # queue.Empty when none came, as jupyter_client's

    def send(self, msg: dict[str, Any]) -> None:
        self.client.send(msg, self.name)


class WebsocketKernelClient:
    """The part of jupyter_client's ``BlockingKernelClient`` that ``KernelTests`` uses, over
    ``/api/kernels/ID/channels`` (the JSON websocket protocol) instead of the kernel's ZeroMQ ports.
    Every message received is also kept, in order, in :attr:`log`."""

    def __init__(self, url: str) -> None:
        self.session = Session(key=b"")  # the server signs what it sends on
        self.ws = websocket.create_connection(f"{url}?session_id={self.session.session}",
                                              header=[f"Authorization: token {TOKEN}"], timeout=60)
        self.ws.settimeout(None)
        self.shell_channel, self.iopub_channel, self.stdin_channel, self.control_channel = (
            WebsocketChannel(self, name) for name in ("shell", "iopub", "stdin", "control"))
        self.log: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                raw = self.ws.recv()
            except Exception:  # closed
                return
            if not raw:
                return
            msg = json.loads(raw)
            channel = msg.pop("channel")
            msg["msg_type"], msg["msg_id"] = msg["header"]["msg_type"], msg["header"]["msg_id"]  # as Session.deserialize
            with self._lock:
                self.log.append((channel, msg))
            getattr(self, f"{channel}_channel").messages.put(msg)

    def send(self, msg: dict[str, Any], channel: str) -> None:
        self.ws.send(json.dumps({**msg, "channel": channel}, default=json_default))

    def take_log(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            log, self.log = self.log, []
        return log

    def _request(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg = self.session.msg(msg_type, content)
        self.send(msg, channel)
        return msg["header"]["msg_id"]

    # -- as jupyter_client.client.KernelClient -------------------------------------------------
    def execute(self, code: str, silent: bool = False, store_history: bool = True, user_expressions: Any = None,
                allow_stdin: bool = False, stop_on_error: bool = True) -> str:
        return self._request("execute_request", {"code": code, "silent": silent, "store_history": store_history,
                                                 "user_expressions": user_expressions or {}, "allow_stdin": allow_stdin,
                                                 "stop_on_error": stop_on_error})

    def complete(self, code: str, cursor_pos: int | None = None) -> str:
        return self._request("complete_request", {"code": code, "cursor_pos": len(code) if cursor_pos is None else cursor_pos})

    def inspect(self, code: str, cursor_pos: int | None = None, detail_level: int = 0) -> str:
        return self._request("inspect_request", {"code": code, "cursor_pos": len(code) if cursor_pos is None else cursor_pos,
                                                 "detail_level": detail_level})

    def history(self, raw: bool = True, output: bool = False, hist_access_type: str = "range", **kwargs: Any) -> str:
        if hist_access_type == "range":
            kwargs.setdefault("session", 0)
            kwargs.setdefault("start", 0)
        return self._request("history_request", {"raw": raw, "output": output, "hist_access_type": hist_access_type, **kwargs})

    def kernel_info(self) -> str:
        return self._request("kernel_info_request", {})

    def is_complete(self, code: str) -> str:
        return self._request("is_complete_request", {"code": code})

    def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return self.shell_channel.get_msg(timeout)

    def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return self.iopub_channel.get_msg(timeout)

    def stop_channels(self) -> None:
        self.ws.close()
        self._reader.join(10)


class Server:
    """``jupyter server`` with gpucr, as a process; REST calls without an event loop."""

    def __init__(self, root: Path, *options: str) -> None:
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1", "--no-browser",
             "--allow-root", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.jpserver_extensions={'jupyter_gpucr': True}", f"--GPUCR.store={root / 'store'}", *options],
            stdout=open(root / "server.log", "ab"), stderr=subprocess.STDOUT, cwd=root,
            env={**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime")})
        deadline = time.monotonic() + 60
        while True:
            try:
                self.rest("api")
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
                time.sleep(0.2)

    def rest(self, path: str, method: str = "GET", body: object = None) -> Any:
        req = urllib.request.Request(f"{self.url}/{path}", method=method, headers={"Authorization": f"token {TOKEN}"},
                                     data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=120) as resp:
            text = resp.read()
        return json.loads(text) if text else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        kill_leftovers(self.root)


class _Conformance(jupyter_kernel_test.KernelTests):
    """IPython's answers to the suite's samples; a kernel started by a real server, talked to over
    its websocket. Subclasses say whether each test meets a suspended kernel."""

    __test__ = False
    suspend_each_test = False
    server_options: tuple[str, ...] = ()
    server: Server
    kc: Any  # WebsocketKernelClient
    kernel_id: str

    kernel_name = "python3"
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('oops', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "print?"
    code_generate_error = "raise"
    code_execute_result = [{"code": "1+2+3", "result": "6"}, {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"}]
    code_display_data = [{"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
                         {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"}]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def setUpClass(cls) -> None:
        try:
            criu_or_skip()
        except pytest.skip.Exception as e:
            raise unittest.SkipTest(str(e)) from None
        cls.root = Path(tempfile.mkdtemp(prefix="gpucr-conformance-"))
        cls.server = Server(cls.root / "server", *cls.server_options)
        cls.kernel_id = cls.server.rest("api/kernels", "POST", {"name": "python3"})["id"]
        cls.kc = WebsocketKernelClient(f"ws://127.0.0.1:{cls.server.port}/api/kernels/{cls.kernel_id}/channels")
        cls.kc.execute("pass")  # ready (the first answer) before the first suspend
        while True:
            msg = cls.kc.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break

    @classmethod
    def tearDownClass(cls) -> None:
        if hasattr(cls, "kc"):
            cls.kc.stop_channels()
        if hasattr(cls, "server"):
            cls.server.stop()
        shutil.rmtree(cls.root, ignore_errors=True)

    def setUp(self) -> None:
        self.kc.take_log()
        path = f"api/gpucr/kernels/{self.kernel_id}"
        if self.suspend_each_test and self.server.rest(path)["state"] != "suspended":  # kernel_info left it so
            self.assertEqual(self.server.rest(f"{path}/suspend", "POST", {})["state"], "suspended")

    def tearDown(self) -> None:
        """Every message the test saw, against what a fresh kernel sends (the module docstring)."""
        time.sleep(0.3)  # what comes late comes now
        seen: dict[str, list[str]] = {}  # the kinds of each request's iopub messages, in order
        log = self.kc.take_log()
        said = "\n".join(f"{channel} {msg['msg_type']} {msg['content'].get('execution_state', '')} for "
                         f"{msg['parent_header'].get('msg_type')} {msg['parent_header'].get('msg_id')}" for channel, msg in log)
        for channel, msg in log:
            kind = msg["msg_type"]
            if kind == "status":
                kind = msg["content"]["execution_state"]
            parent = msg["parent_header"].get("msg_id")
            self.assertTrue(parent, f"a {kind} on {channel} without a parent; all messages:\n{said}")
            if channel == "iopub":  # a reply and its request's iopub messages are not ordered against each other
                seen.setdefault(parent, []).append(kind)
        for parent, kinds in seen.items():
            statuses = [k for k in kinds if k in ("busy", "idle", "starting", "restarting")]
            self.assertEqual(statuses, ["busy", "idle"], f"request {parent}: {kinds}; all messages:\n{said}")
            self.assertEqual((kinds[0], kinds[-1]), ("busy", "idle"), f"request {parent}: {kinds}; all messages:\n{said}")


class TestConformance(_Conformance):
    """The baseline: the same server and websocket, no suspend."""

    __test__ = True


class TestConformanceSuspendedBeforeEachTest(_Conformance):
    __test__ = True
    suspend_each_test = True
    server_options = ("--GPUCR.restore_keepalive_s=0.1",)
