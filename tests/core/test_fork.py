"""Forking a `gpucr run` process with the CLI: real CRIU, a real process with a listening port, an
established connection and a file open for writing. What a user checks: the fork answers on its
own port with the source's state and goes its own way; the source keeps its port, its client and
its file."""
from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from jupyter_gpucr.core.errors import PreconditionError
from jupyter_gpucr.core.forks.copies import gpu_targets
from jupyter_gpucr.core.gpu.gpus import Gpu
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
        except OSError:  # a fork's copy of its source's client: closed at the fork's restore
            pass
        c.close()

    while True:
        threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
""")

# One connection at a time, as many simple servers are: while it waits on a client, nothing else is
# served. A fork's copy of that client must end at once, or the fork would wait on it for good.
SERIAL_AGENT = textwrap.dedent("""
    import socket, sys
    log = open(sys.argv[2], "a", buffering=1)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
    x = 42
    while True:
        c = s.accept()[0]
        try:
            for line in c.makefile():
                c.sendall(f"x={x}\\n".encode())
            log.write("client left\\n")
        except OSError as e:
            log.write(f"client lost: {e.strerror}\\n")
        c.close()
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


def _outside_address() -> str:
    """An IPv4 address of this machine other than loopback: none exists in a fork's namespace."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("this machine has no IPv4 address but loopback")


def _start(store: Path, tmp_path: Path, program: str, host: str = "127.0.0.1",
           source: str | None = None, log: Path | None = None) -> tuple[int, Path, socket.socket]:
    """Run ``program`` as 'src' with its log at ``log`` (else in ``tmp_path``) and connect a client
    to it on ``host`` (from ``source``, if given): its port, its log, the client."""
    port, log = _free_port(), log or tmp_path / "agent.log"
    (tmp_path / "agent.py").write_text(program)
    gpucr(store, "run", "--name", "src", "--", sys.executable, str(tmp_path / "agent.py"), str(port), str(log))
    deadline = time.monotonic() + 30
    while True:
        try:
            return port, log, socket.create_connection((host, port), timeout=30,
                                                       source_address=(source, 0) if source else None)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the agent never listened"
            time.sleep(0.1)


def test_fork_a_process_with_the_cli(tmp_path):
    criu_or_skip()
    store = tmp_path / "store"
    log = Path("/dev/shm") / f"gpucr-fork-test-{os.getpid()}.log"  # a tmpfs, as a store in /dev/shm is
    try:
        port, log, client = _start(store, tmp_path, AGENT, log=log)
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
        log.unlink(missing_ok=True)


@pytest.mark.parametrize("over", ["from-host-address", "to-host-address"])
def test_a_forks_copy_of_an_outside_connection_ends_at_once(tmp_path, over):
    """The source waits on a client when it is forked, a client from one of the host's addresses
    (none of which exists in the fork's namespace). Its copy in the fork has no peer. From a host
    address to loopback: nothing ever answers the copy, a read on it would wait for good; it is
    destroyed at the restore. To a host address: CRIU could not bind the copy back (the fork failed);
    the address is lent to the namespace for the restore. Either way the fork's read fails at once and
    the fork serves its next client; the source's client still talks to the source."""
    criu_or_skip()
    store, host = tmp_path / "store", _outside_address()
    try:
        port, log, client = _start(store, tmp_path, SERIAL_AGENT, **(
            {"host": "127.0.0.1", "source": host} if over == "from-host-address" else {"host": host}))
        assert _ask(client, "get") == "x=42"  # the source now waits for this client's next line

        (rec,) = json.loads(gpucr(store, "--json", "fork", "src", "--as", "copy").stdout)
        (route,) = rec["netns"]["relay"]
        with socket.create_connection(("127.0.0.1", route["port"]), timeout=10) as c:
            assert _ask(c, "get") == "x=42"  # served: the fork no longer waits on its copy of the client
        lost = open(rec["files"][str(log)]).read()  # reset by the namespace's lo, or destroyed by gpucr
        assert lost.startswith(("client lost: Connection reset by peer", "client lost: Software caused")), lost
        assert _ask(client, "get") == "x=42" and "client lost" not in log.read_text()
        client.close()
    finally:
        for name in ("copy", "src"):
            gpucr(store, "rm", "--kill", name, check=False)


def test_forks_are_placed_beside_each_other_on_the_gpus():
    """Forks restored in parallel would each see the same free GPU memory: each is placed with the
    memory of the ones before it taken; when they do not all fit, nothing is restored."""
    gib = 1 << 30
    used = [{"uuid": "GPU-a", "name": "H200", "memory_used": 40 * gib}]

    def machine(*free_gib):
        return [Gpu(i, f"GPU-{'ab'[i]}", "H200", 140 * gib, (140 - f) * gib, f * gib) for i, f in enumerate(free_gib)]

    assert gpu_targets(used, ["GPU-a", "GPU-b"], "auto", machine(100, 10), 2) == ["GPU-a", "GPU-a"]
    assert gpu_targets(used, ["GPU-a", "GPU-b"], "auto", machine(60, 60), 2) == ["GPU-a", "GPU-b"]
    with pytest.raises(PreconditionError, match="Only 1 of the 2 forks fit on the GPUs"):
        gpu_targets(used, ["GPU-a", "GPU-b"], "auto", machine(60, 10), 2)
    with pytest.raises(PreconditionError, match="Only 1 of the 2 forks fit"):
        gpu_targets(used, ["GPU-a", "GPU-b"], 0, machine(60, 60), 2)  # pinned to GPU 0
