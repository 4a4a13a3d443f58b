"""The waker: one small process per name that pauses its process when idle and wakes it on the next
connection (see ``activation`` for how the sockets are kept).

It lives exactly as long as its name is in use: it exits when the process exits on its own or its
name is removed, never leaving a port bound for nothing. What it does and why it failed is in
``waker.json`` beside the process's record (``gpucr ls`` shows it) and in ``waker.log``.
Run as ``python -m jupyter_gpucr.cli.waker --store DIR NAME`` (which picks the backend); started by
:func:`start_waker`.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

from ..backend import CheckpointBackend
from ..criu.images import read_image
from ..errors import GPUCRError
from ..jsonfile import read_json, write_json_atomic
from ..process.procs import is_alive
from ..storage.store import Store
from .activation import WakeOn, bind_anew, cpu_seconds, drain, find_listeners, hold, open_connections, pending, relay, steer_to_restored

WAKER_FILE = "waker.json"
WAKER_LOG = "waker.log"
# Below this much CPU per second of the idle window, a process counts as doing nothing (an idle
# Python server still wakes up now and then).
IDLE_CPU_SHARE = 0.01
TCP_ESTABLISHED = 1
log = logging.getLogger("gpucr.waker")


def read_status(store: Store, name: str) -> dict[str, Any] | None:
    """What the waker of ``name`` last said, with ``alive`` (whether it still runs); None without one."""
    status = read_json(store.proc_dir(name) / WAKER_FILE)
    if not status:
        return None
    return {**status, "alive": is_alive(status.get("pid"))}


def start_waker(store: Store, name: str, wake_on: list[WakeOn], idle_timeout: float, criu_path: str | None = None,
                daemon_socket: str | None = None) -> int:
    """Start the waker of ``name`` (detached: it outlives the caller, not the process); its PID."""
    d = store.proc_dir(name)
    write_json_atomic(d / WAKER_FILE, {"wake_on": [str(w) for w in wake_on], "idle_timeout": idle_timeout,
                                       "criu": criu_path, "daemon": daemon_socket, "state": "starting"}, durable=False)
    with open(d / WAKER_LOG, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyter_gpucr.cli.waker", "--store", str(store.root), name],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True)
    return proc.pid


def restart_wakers(store: Store) -> list[str]:
    """Start again the wakers that died (killed, or the machine restarted) for names still in use."""
    restarted = []
    for name in store.proc_names():
        status = read_status(store, name)
        if status is None or status["alive"] or status.get("state") == "ended" or not store.has_proc(name):
            continue
        rec = store.read_proc(name)
        if rec.get("state") == "checkpointed" or is_alive(rec.get("pid")):
            start_waker(store, name, [WakeOn.parse(w) for w in status["wake_on"]], status["idle_timeout"],
                        status.get("criu"), status.get("daemon"))
            restarted.append(name)
    return restarted


class Waker:
    """Watch one process: checkpoint it once idle, restore it on the next connection."""

    def __init__(self, backend: CheckpointBackend, name: str, wake_on: list[WakeOn], idle_timeout: float) -> None:
        self.backend, self.name, self.wake_on, self.idle_timeout = backend, name, wake_on, idle_timeout
        self.dir = backend.store.proc_dir(name)
        self.held: dict[WakeOn, socket.socket] = {}
        self.status: dict[str, Any] = dict(read_json(self.dir / WAKER_FILE) or {})

    def say(self, state: str, error: str | None = None) -> None:
        self.status.update({"pid": os.getpid(), "state": state, "since": time.time(), "error": error})
        write_json_atomic(self.dir / WAKER_FILE, self.status, durable=False)

    def run(self) -> None:
        self.say("starting")
        while True:
            rec = self.record()
            if rec is None:
                return self.end("its name was removed")
            if rec.get("state") == "running" and is_alive(rec.get("pid")):
                self.watch(cast(int, rec["pid"]))
            elif rec.get("state") == "checkpointed":
                self.sleep_until_asked()
            else:
                return self.end("the process exited")

    def record(self) -> dict[str, Any] | None:
        try:
            return dict(self.backend.store.read_proc(self.name))
        except GPUCRError:
            return None

    def end(self, why: str) -> None:
        log.info("waker of %s ends: %s", self.name, why)
        if self.dir.is_dir():
            self.say("ended", why)
        for s in self.held.values():
            s.close()

    def grab(self, pid: int) -> None:
        """Hold the listening sockets of the running process that are not held yet."""
        missing = [w for w in self.wake_on if w not in self.held]
        for w, (p, fd) in find_listeners(pid, missing).items() if missing else []:
            self.held[w] = hold(p, fd, w)

    def watch(self, pid: int) -> None:
        """Until the process is checkpointed or gone: checkpoint it once it was idle for the timeout."""
        self.say("watching")
        last_busy, cpu = time.monotonic(), cpu_seconds(pid)
        step = max(0.05, min(1.0, self.idle_timeout / 5))
        while is_alive(pid) and (self.record() or {}).get("pid") == pid:
            time.sleep(step)
            self.grab(pid)
            now_cpu = cpu_seconds(pid)
            if (now_cpu - cpu > IDLE_CPU_SHARE * step or open_connections(self.wake_on)
                    or pending(list(self.held.values())) or len(self.held) < len(self.wake_on)):
                last_busy = time.monotonic()
            cpu = now_cpu
            if time.monotonic() - last_busy >= self.idle_timeout:
                self.pause()
                return

    def pause(self) -> None:
        self.say("pausing")
        try:
            ckpt = self.backend.checkpoint(self.name, reason="idle")
        except GPUCRError as e:
            log.warning("idle checkpoint of %s failed: %s", self.name, e.message)
            self.say("watching", f"The idle checkpoint failed: {e.message}")
            return
        log.info("%s was idle for %.0f s: checkpointed", self.name, self.idle_timeout)
        if self.clients_inside(ckpt.images):
            log.info("a client of %s connected as it was frozen: waking it at once", self.name)
            self.wake()

    def clients_inside(self, images: Path) -> bool:
        """Whether the process had accepted a connection on a wake address when it was frozen (it
        came after the idle check): that client waits, and no new connection will say so."""
        ports = {w.port for w in self.wake_on if w.kind == "tcp"}
        try:
            return any(s.state == TCP_ESTABLISHED and s.port in ports for s in read_image(images).inet)
        except (GPUCRError, OSError):  # the daemon's images are not readable here
            return False

    def sleep_until_asked(self) -> None:
        """Hold the ports until a connection comes, then restore the process and hand it over."""
        for w in self.wake_on:
            if w not in self.held:  # this waker was restarted while the process slept
                self.held[w] = bind_anew(w)
        if self.status.get("state") != "failed":
            self.say("idle")
        while (self.record() or {}).get("state") == "checkpointed":
            if pending(list(self.held.values()), 0.5):
                self.wake()
                return

    def wake(self) -> None:
        self.say("waking")
        t0 = time.perf_counter()
        try:
            running = self.backend.restore(self.name)
        except GPUCRError as e:
            for s in self.held.values():
                for conn in drain(s, 0.0):
                    _close_gently(conn)
            log.error("restoring %s for a connection failed: %s %s", self.name, e.message, e.hint)
            self.say("failed", f"Restoring for a connection failed: {e.message} The waiting connections were closed; "
                               "the checkpoint is kept and the next connection tries again.")
            return
        log.info("%s woken in %.2f s", self.name, time.perf_counter() - t0)
        self.status["last_wake"] = {**running.timings, "waker_total": time.perf_counter() - t0}
        self.say("waking")  # the wake's timings are on record before its first client is served
        held, self.held = self.held, {}
        for w, s in held.items():
            try:
                steer_to_restored(s)
            except OSError as e:  # new connections may then still reach the held socket: relayed too
                log.warning("steering new connections of %s: %s", w, e)
        for w, s in held.items():
            for conn in drain(s):
                threading.Thread(target=_relay_logged, args=(conn, w), daemon=True).start()
            s.close()


def _close_gently(conn: socket.socket) -> None:
    """Close with a FIN, not a reset: what the client sent is read first (closing over unread data
    resets the connection)."""
    conn.settimeout(1.0)
    try:
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):
            pass
    except OSError:
        pass
    conn.close()


def _relay_logged(conn: socket.socket, w: WakeOn) -> None:
    try:
        relay(conn, w)
    except OSError as e:
        log.warning("relaying a connection that came while asleep to %s: %s", w, e)
