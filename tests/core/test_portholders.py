"""Who holds a port, in every state a socket can hold it: listening, bound only (which
/proc/net/tcp does not list), connected, and a closed connection's TIME_WAIT (no process)."""
from __future__ import annotations

import os
import socket
import time

from jupyter_gpucr.core.process.portholders import sockets_on


def test_every_socket_on_a_port_is_found_with_its_process() -> None:
    listener, bound, client = socket.socket(), socket.socket(), socket.socket()
    bound6 = socket.socket(socket.AF_INET6)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        bound.bind(("127.0.0.1", 0))
        bound6.bind(("::1", 0))
        client.bind(("127.0.0.1", 0))
        lport, bport, b6port, cport = (s.getsockname()[1] for s in (listener, bound, bound6, client))
        client.connect(("127.0.0.1", lport))
        accepted, _ = listener.accept()
        found = {(s.port, s.state, s.peer): s for s in sockets_on({lport, bport, b6port, cport})}
        me = os.getpid()
        assert found[(lport, "LISTEN", None)].pid == me
        assert found[(bport, "CLOSE", None)].pid == me and found[(bport, "CLOSE", None)].ip == "127.0.0.1"
        assert found[(b6port, "CLOSE", None)].ip == "::1"
        assert found[(cport, "ESTABLISHED", ("127.0.0.1", lport))].pid == me

        client.close()  # the side that closes first keeps TIME_WAIT, owned by nobody
        accepted.close()
        deadline = time.monotonic() + 5
        while not [s for s in sockets_on({cport}) if s.state == "TIME_WAIT"]:
            assert time.monotonic() < deadline, sockets_on({cport})
            time.sleep(0.05)
        assert [s.pid for s in sockets_on({cport})] == [None]
    finally:
        for s in (listener, bound, bound6, client):
            s.close()
