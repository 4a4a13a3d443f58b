"""Forking a `gpucr run` process with the CLI: real CRIU, a real process with a listening port, an
established connection and a file open for writing. What a user checks: the fork answers on its
own port with the source's state and goes its own way; the source keeps its port, its client and
its file."""
from __future__ import annotations

import json
import socket
import sys
import textwrap
import time

import pytest

from tests.conftest import criu_or_skip
from tests.core.test_core import gpucr

pytestmark = pytest.mark.timeout(180)

AGENT = textwrap.dedent("""
    import os, socket, sys, threading
    log = open(sys.argv[2], "a", buffering=1)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
    x = 42

    def serve(c):
        global x
        try:
            for line in c.makefile():
                if line.startswith("set"):
                    x = int(line.split()[1])
                log.write(f"x={x}\\n")
                c.sendall(f"x={x} pid={os.getpid()}\\n".encode())
        except OSError:  # a fork's copy of its source's client: it leads nowhere
            pass
        c.close()

    while True:
        threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
""")



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ask(conn: socket.socket, line: str) -> str:
    conn.sendall(line.encode() + b"\n")
    return conn.makefile().readline().strip()


def _once(port: int, line: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        return _ask(c, line)


def test_fork_a_process_with_the_cli(tmp_path):
    criu_or_skip()
    store, port, log = tmp_path / "store", _free_port(), tmp_path / "agent.log"
    (tmp_path / "agent.py").write_text(AGENT)
    gpucr(store, "run", "--name", "src", "--", sys.executable, str(tmp_path / "agent.py"), str(port), str(log))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the agent never listened"
                time.sleep(0.1)
        source_answer = _ask(client, "set 7")  # a connection the source keeps across the fork

        (rec,) = json.loads(gpucr(store, "--json", "fork", "src", "--as", "copy").stdout)
        (route,) = rec["netns"]["relay"]
        assert rec["name"] == "copy" and route["inner"] == port and route["port"] != port
        assert _once(route["port"], "get") == source_answer  # the source's state, on its own port
        assert _once(route["port"], "set 0").startswith("x=0")
        assert _ask(client, "get") == source_answer  # the source's client still talks to the source
        assert _once(port, "get") == source_answer
        # the fork wrote to a copy of the file, made when it was forked; the source's file never saw it
        copy = rec["files"][str(log)]
        assert "x=0" in open(copy).read() and "x=0" not in log.read_text()
        client.close()

        listed = {p["name"]: p for p in json.loads(gpucr(store, "--json", "ls").stdout)}
        assert listed["copy"]["state"] == "running" and listed["copy"]["forked_from"]["name"] == "src"
        # a fork's later suspend and restore keep its namespace and its host port
        gpucr(store, "checkpoint", "copy")
        gpucr(store, "restore", "copy")
        assert _once(route["port"], "get").startswith("x=0")
    finally:
        for name in ("copy", "src"):
            gpucr(store, "rm", "--kill", name, check=False)
