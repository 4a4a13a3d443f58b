"""What the server reads about a kernel process from /proc, checked against real processes."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import psutil

from jupyter_gpucr.core.process.procs import tcp_connections_to

PEER = """
import socket, sys, time
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
print(listener.getsockname()[1], flush=True)
own = socket.create_connection(listener.getsockname()); mine, _ = listener.accept()  # as an ipykernel does
conn, _ = listener.accept()
while conn.recv(4096):  # until the other side closes
    pass
conn.close()
time.sleep(60)
"""


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_connection_counts_until_the_process_closed_its_side():
    """As when the server detaches from a kernel before a dump: its FIN arrives, the kernel's
    ZeroMQ closes the socket, and only then is the connection gone from the kernel."""
    peer = subprocess.Popen([sys.executable, "-c", PEER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(peer.stdout.readline())
        assert _until(lambda: len(psutil.Process(peer.pid).net_connections(kind="tcp")) == 3)
        assert tcp_connections_to(peer.pid, {port}) == 0, "neither a listening socket nor one to itself counts"
        client = socket.create_connection(("127.0.0.1", port))
        assert _until(lambda: tcp_connections_to(peer.pid, {port}) == 1)
        assert tcp_connections_to(peer.pid, {port + 1}) == 0, "only connections on the ports asked for"
        client.close()
        assert _until(lambda: tcp_connections_to(peer.pid, {port}) == 0, timeout=1.0)
    finally:
        peer.kill()
        peer.wait()
    assert tcp_connections_to(peer.pid, {port}) == 0, "a process that is gone holds nothing"
