"""Idle pause and wake on request with a real CRIU: an HTTP agent started with ``gpucr run
--idle-timeout --wake-on`` is checkpointed when idle and restored by the next connection."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import gone, wait_for_line

AGENT = Path(__file__).with_name("idle_agent.py")


def gpucr(store: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store), *args],
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpucr {args} failed: {proc.stdout}{proc.stderr}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def curl(port: int, query: str = "") -> tuple[dict, float]:
    """What a client sees: the answer (curl fails on a refused or reset connection) and how long."""
    t0 = time.perf_counter()
    out = subprocess.run(["curl", "-sS", "--max-time", "60", f"http://127.0.0.1:{port}/{query}"],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, f"curl failed ({out.returncode}): {out.stderr}"
    return json.loads(out.stdout), time.perf_counter() - t0


def status(store: Path, name: str) -> dict:
    return next(it for it in json.loads(gpucr(store, "--json", "ls").stdout) if it["name"] == name)


def waker_state(store: Path, name: str) -> dict:
    return json.loads((store / "procs" / name / "waker.json").read_text())


def wait_for(what, timeout: float = 60, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(what)


@pytest.fixture
def agent(criu_path, store_dir, tmp_path) -> Iterator:
    """Starts the HTTP agent under a waker; afterwards removes it and ends the waker."""
    started: list[str] = []

    def start(name: str, idle: float, mb: int = 100, *extra: str) -> tuple[int, dict]:
        port = free_port()
        gpucr(store_dir, "run", "--name", name, "--idle-timeout", str(idle), "--wake-on", f"tcp:127.0.0.1:{port}",
              "--", sys.executable, str(AGENT), str(port), str(mb), *extra)
        started.append(name)
        return port, wait_for_line(store_dir / "procs" / name / "stdout.log")

    yield start
    for name in started:
        waker = waker_state(store_dir, name).get("pid")
        gpucr(store_dir, "rm", "--kill", name, check=False)
        if waker and not gone(waker):
            try:
                wait_for(lambda w=waker: gone(w), 10)
            except TimeoutError:
                os.kill(waker, signal.SIGKILL)
                pytest.fail("the waker did not end when its name was removed")


def test_idle_agent_is_paused_and_a_curl_wakes_it_with_its_state(agent, store_dir):
    port, hello = agent("web", idle=1.5)
    first, _ = curl(port)
    assert first["checksum"] == hello["checksum"] and first["counter"] == 1
    pid = status(store_dir, "web")["pid"]

    # a connection made while the dump runs waits, and is served by the restored process
    wait_for(lambda: waker_state(store_dir, "web")["state"] == "pausing", 30, 0.005)
    during, waited = curl(port)
    assert during == {**first, "counter": 2}, during

    wait_for(lambda: status(store_dir, "web")["state"] == "checkpointed", 30)
    assert gone(pid)
    listed = gpucr(store_dir, "ls").stdout
    assert f"checkpointed (idle, wakes on tcp:127.0.0.1:{port})" in listed, listed
    woken, took = curl(port)
    assert woken == {**first, "counter": 3}, woken  # the same process, its memory kept
    again, fast = curl(port)
    assert again["counter"] == 4 and fast < took
    print(f"first byte after a wake: {took:.2f} s; during the dump: {waited:.2f} s; awake: {fast:.3f} s")


def test_busy_or_connected_agent_is_not_paused(agent, store_dir):
    port, _ = agent("busy", idle=1.0, mb=10)
    pid = status(store_dir, "busy")["pid"]
    answer: dict = {}
    worker = threading.Thread(target=lambda: answer.update(curl(port, "?s=3")[0]))
    worker.start()
    worker.join()
    assert status(store_dir, "busy")["pid"] == pid, "paused while it computed for a request"
    with socket.create_connection(("127.0.0.1", port)):  # a client that keeps its connection open, silent
        time.sleep(3)
        assert status(store_dir, "busy")["state"] == "running" and status(store_dir, "busy")["pid"] == pid
    wait_for(lambda: status(store_dir, "busy")["state"] == "checkpointed", 30)  # and once it left, it is paused


def test_failed_restore_closes_the_waiting_connection_and_says_why(agent, store_dir, tmp_path):
    kept = tmp_path / "kept.log"
    port, _ = agent("fails", 1.0, 10, str(kept))
    curl(port)
    wait_for(lambda: status(store_dir, "fails")["state"] == "checkpointed", 30)
    ckpt = status(store_dir, "fails")["latest"]["id"]
    kept.unlink()  # the process had it open: CRIU cannot restore it
    out = subprocess.run(["curl", "-sS", "--max-time", "60", f"http://127.0.0.1:{port}/"], capture_output=True, text=True)
    assert out.returncode == 52, out  # "Empty reply from server": closed after waiting, not refused
    listed = gpucr(store_dir, "ls").stdout
    assert f"{kept}" in listed and "Restoring for a connection failed" in listed, listed
    assert status(store_dir, "fails")["latest"]["id"] == ckpt
    kept.write_text("")  # put back as it was: the next connection wakes it
    assert curl(port)[0]["counter"] == 2


def test_killed_waker_loses_nothing_and_recover_starts_it_again(agent, store_dir):
    port, hello = agent("kill9", idle=1.0, mb=10)
    curl(port)
    wait_for(lambda: status(store_dir, "kill9")["state"] == "checkpointed", 30)
    os.kill(waker_state(store_dir, "kill9")["pid"], signal.SIGKILL)
    listed = wait_for(lambda: "not running" in (out := gpucr(store_dir, "ls").stdout) and out)
    assert "run 'gpucr recover'" in listed, listed
    assert "started again for 'kill9'" in gpucr(store_dir, "recover").stdout
    wait_for(lambda: waker_state(store_dir, "kill9")["state"] == "idle", 30)
    woken, _ = curl(port)
    assert woken["counter"] == 2 and woken["checksum"] == hello["checksum"]
