"""Closing a fork's copies of connections to outside it (core/process/forknet.py), inside a real network
namespace of its own with real kernel sockets. A copy that nothing ever answers is made as CRIU
makes one (TCP repair mode, here without the window probe that would draw a reset): a read on it
waits for good until gpucr destroys it; connections between the namespace's own sockets are kept."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import jupyter_gpucr.core.process.forknet as forknet

SCRIPT = textwrap.dedent("""
    import importlib.util, json, socket, subprocess, sys, threading
    spec = importlib.util.spec_from_file_location("forknet", sys.argv[1])
    forknet = importlib.util.module_from_spec(spec); spec.loader.exec_module(forknet)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    TCP_REPAIR, TCP_REPAIR_OFF_NO_WP = 19, -1
    orphan = socket.socket()  # a copy of a connection whose peer is not here
    orphan.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
    orphan.bind(("127.0.0.1", 40000)); orphan.connect(("127.0.0.1", 40001))
    orphan.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, TCP_REPAIR_OFF_NO_WP)
    listener = socket.socket(socket.AF_INET6); listener.bind(("::", 40002)); listener.listen()
    inner = socket.create_connection(("127.0.0.1", 40002)); accepted = listener.accept()[0]  # IPv4 to IPv6
    got = {}
    def read():
        try:
            got["read"] = repr(orphan.recv(10))
        except OSError as e:
            got["read"] = e.strerror
    reader = threading.Thread(target=read, daemon=True); reader.start(); reader.join(0.5)
    waited = reader.is_alive()
    cut, problem = forknet.cut_outside()
    reader.join(5)
    inner.sendall(b"kept"); kept = accepted.recv(4).decode()
    print(json.dumps({"waited": waited, "read": got.get("read"), "cut": [[c.local, c.remote] for c in cut],
                      "problem": problem, "kept": kept}))
""")


def test_a_copy_without_peer_is_destroyed_and_inner_connections_kept():
    if os.geteuid() != 0 or not shutil.which("ss") or not shutil.which("ip"):
        pytest.skip("root and iproute2 (ss, ip) are needed")
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", SCRIPT, forknet.__file__],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["waited"], "the copy's read should wait while nothing destroys it"
    assert out["read"] == "Software caused connection abort"  # at once, once destroyed
    assert out["cut"] == [[["127.0.0.1", 40000], ["127.0.0.1", 40001]]] and out["problem"] is None
    assert out["kept"] == "kept"


def test_only_unanswered_ends_are_outside():
    """Pairing the namespace's sockets: both ends of a connection here (an IPv4 client of an IPv6
    listener too) are inside; a listener and a closed socket have no peer to miss."""
    v4, v6, mapped = forknet.socket.AF_INET, forknet.socket.AF_INET6, "::ffff:127.0.0.1"
    conns = [
        forknet.Conn(v4, ("127.0.0.1", 5000), ("127.0.0.1", 6000), 1),
        forknet.Conn(v6, (mapped, 6000), (mapped, 5000), 1),
        forknet.Conn(v6, ("::", 6000), ("::", 0), 0x0A),
        forknet.Conn(v4, ("192.0.2.2", 7000), ("198.51.100.1", 443), 1),
        forknet.Conn(v4, ("127.0.0.1", 7001), ("127.0.0.1", 8000), 0x06),
    ]
    assert forknet.outside(conns) == [conns[3]]
    assert conns[3].ss_filter() == "( src 192.0.2.2:7000 and dst 198.51.100.1:443 )"
    assert forknet.Conn(v6, ("fd00::2", 1), ("fd00::3", 2), 1).ss_filter() == "( src [fd00::2]:1 and dst [fd00::3]:2 )"
