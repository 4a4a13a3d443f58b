"""Attacks on what gpucr-daemon and the host share, by one unprivileged user (limatt) while another
(limvic) uses the daemon: floods of idle connections, long and slow requests, a forged log line, a
log that grows without end, a checkpoint past the store quota, and CRIU's network locks. Each attack
fails, and the daemon answers the victim within a second meanwhile. Runs as root: it starts the
daemon and creates the users."""
from __future__ import annotations

import json
import os
import pwd
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_gpucr.core.criu.commands import drop_network_locks, dump_id, network_lock_tables
from jupyter_gpucr.core.errors import PreconditionError, PutBackError
from jupyter_gpucr.core.files import make_private_dir
from jupyter_gpucr.core.storage.store import Store
from jupyter_gpucr.daemon.quotas import Quotas, QuotaSettings, disk_usage
from tests import hub as H
from tests.conftest import criu_or_skip

ATTACKER, VICTIM = "limatt", "limvic"
PER_USER = 16
REQUEST_TIMEOUT = 3
LOG_QUOTA = 256 << 10
STORE_QUOTA = 512 << 20
LOCKS_PER_USER = 2
OPTIONS = ("--max-requests-per-user", str(PER_USER), "--request-timeout", str(REQUEST_TIMEOUT), "--log-quota",
           str(LOG_QUOTA), "--store-quota", str(STORE_QUOTA), "--network-locks-per-user", str(LOCKS_PER_USER))

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def daemon() -> Iterator[H.Daemon]:
    criu_or_skip()
    with H.daemon_for([ATTACKER, VICTIM], 'gpucr-limits-', *OPTIONS) as d:
        try:
            yield d
        finally:
            drop_network_locks([p.parent for p in d.state.glob("users/*/checkpoints/*/images/inventory.img")])
            print(f"daemon log:\n{d.log.read_text()[-4000:]}")


def uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def spawn_as(user: str, code: str) -> subprocess.Popen:
    """Python ``code`` running as ``user`` in the background, stdin and stdout as pipes."""
    return subprocess.Popen(["runuser", "-u", user, "--", sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=H.user_env(user))


def finish(proc: subprocess.Popen, timeout: float = 30) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def victim_served(d: H.Daemon) -> None:
    """The victim's ``hello`` is answered within a second (timed inside the victim's process)."""
    out = H.as_user(VICTIM, f"""
import json, time
from jupyter_gpucr.daemon.client import DaemonClient
t = time.monotonic()
r = DaemonClient({str(d.socket)!r}).call("hello")
print(json.dumps({{"seconds": time.monotonic() - t, "uid": r["uid"]}}))
""")
    assert out["uid"] == uid(VICTIM)
    assert out["seconds"] < 1.0, f"the victim waited {out['seconds']:.2f} s"


def call_as(user: str, d: H.Daemon, op: str, **args: object) -> dict:
    """``op`` as ``user``: {"result": ...} or {"error": class, "message", "hint"}."""
    return H.as_user(user, f"""
import json
from jupyter_gpucr.core.errors import GPUCRError
from jupyter_gpucr.daemon.client import DaemonClient
try:
    out = {{"result": DaemonClient({str(d.socket)!r}).call({op!r}, **json.loads({json.dumps(args)!r}))}}
except GPUCRError as e:
    out = {{"error": type(e).__name__, "message": e.message, "hint": e.hint}}
print(json.dumps(out))
""", timeout=120)


def run_as(user: str, d: H.Daemon, name: str, body: str) -> int:
    """Start Python ``body`` as ``user`` through the daemon; the process's host PID once it printed "ready"."""
    home = pwd.getpwnam(user).pw_dir
    out = call_as(user, d, "run", name=name, command=[sys.executable, "-c", body], cwd=home,
                  env={"PATH": H.CLEAN_PATH, "HOME": home})
    assert "result" in out, out
    stdout = d.user_store(uid(user)) / "procs" / name / "stdout.log"
    H.wait_until(f"{name} to start", lambda: stdout.exists() and b"ready" in stdout.read_bytes()[:4096], 30, 0.05)
    return out["result"]["pid"]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_idle_connections_are_capped_per_user(daemon: H.Daemon) -> None:
    """About 1,100 idle connections: the daemon keeps 16 of the attacker's, refuses the rest at once
    with the reason, and stays far from its descriptor limit."""
    attacker = spawn_as(ATTACKER, f"""
import json, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
conns = []
for _ in range(min(1100, hard - 64)):
    s = socket.socket(socket.AF_UNIX)
    s.connect({str(daemon.socket)!r})
    conns.append(s)
time.sleep(0.3)
idle, answers = 0, {{}}
for s in conns:
    s.setblocking(False)
    try:
        line = s.recv(4096)
    except BlockingIOError:
        idle += 1
        continue
    msg = json.loads(line)["error"]["message"] if line else "closed"
    answers[msg] = answers.get(msg, 0) + 1
print(json.dumps({{"n": len(conns), "idle": idle, "answers": answers}}), flush=True)
sys.stdin.readline()  # holds every connection until told
""")
    try:
        report = json.loads(attacker.stdout.readline())  # type: ignore[union-attr]
        fds = len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))
        victim_served(daemon)
    finally:
        attacker.kill()
        attacker.wait()
    refused = f"too many open requests from uid {uid(ATTACKER)} (limit {PER_USER})."
    assert report["n"] >= min(1000, resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 100), report
    assert report["idle"] <= PER_USER, report
    assert report["answers"].get(refused, 0) >= report["n"] - 3 * PER_USER, report
    assert fds < 64, f"the daemon held {fds} descriptors"


def test_long_lines_keep_the_daemon_small(daemon: H.Daemon) -> None:
    """Rounds of 100 connections each sending 4 MiB without a line break for 3 s: each is cut off at
    the request limit, and the daemon's memory grows by far less than what was sent."""
    proc = psutil.Process(daemon.proc.pid)
    victim_served(daemon)
    before = proc.memory_info().rss
    peak = before
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.02):
            peak = max(peak, proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    attacker = spawn_as(ATTACKER, f"""
import json, socket, threading, time
answers, lock = {{}}, threading.Lock()
def one():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    try:
        s.connect({str(daemon.socket)!r})
        try:
            s.sendall(b"x" * (4 << 20))
        except OSError:
            pass
        line = s.makefile("rb").readline()
        msg = json.loads(line)["error"]["message"] if line else "closed"
    except OSError as e:
        msg = type(e).__name__
    finally:
        s.close()
    with lock:
        answers[msg] = answers.get(msg, 0) + 1
end, rounds = time.monotonic() + 3, 0
while time.monotonic() < end:
    threads = [threading.Thread(target=one) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rounds += 1
print(json.dumps({{"rounds": rounds, "answers": answers}}))
""")
    try:
        time.sleep(1)
        victim_served(daemon)
        report = finish(attacker)
    finally:
        attacker.kill()
        stop.set()
        sampler.join()
    too_long = "The request is longer than 1 MiB, the daemon's limit."
    assert report["answers"].get(too_long, 0) >= PER_USER, report
    assert set(report["answers"]) <= {too_long, f"too many open requests from uid {uid(ATTACKER)} (limit {PER_USER}).",
                                      "BrokenPipeError", "ConnectionResetError", "closed"}, report
    sent = report["rounds"] * 100 * 4
    assert peak - before < 64 << 20, f"the daemon grew by {(peak - before) >> 20} MiB while {sent} MiB were sent"


def test_slow_senders_are_cut_off(daemon: H.Daemon) -> None:
    """Sixteen connections sending a byte every 0.2 s: each is closed with the reason once the
    request timeout has passed, whatever it keeps sending; the victim is served meanwhile."""
    attacker = spawn_as(ATTACKER, f"""
import json, select, socket, time
conns = []
for _ in range({PER_USER}):
    s = socket.socket(socket.AF_UNIX)
    s.connect({str(daemon.socket)!r})
    conns.append(s)
start, done = time.monotonic(), {{}}
while len(done) < len(conns) and time.monotonic() - start < 20:
    for s in conns:
        if s not in done:
            try:
                s.sendall(b" ")
            except OSError:
                pass
    for s in select.select([s for s in conns if s not in done], [], [], 0.2)[0]:
        line = s.recv(4096)
        done[s] = (time.monotonic() - start, json.loads(line)["error"]["message"] if line else "closed")
print(json.dumps(sorted(done.values())))
""")
    try:
        time.sleep(1)
        victim_served(daemon)
        out, _ = attacker.communicate(timeout=30)
    finally:
        attacker.kill()
    closed = json.loads(out.strip().splitlines()[-1])
    assert len(closed) == PER_USER
    for seconds, message in closed:
        assert message == f"The request did not arrive within {REQUEST_TIMEOUT} s."
        assert REQUEST_TIMEOUT - 0.5 < seconds < REQUEST_TIMEOUT + 1.5, closed


def test_a_crafted_op_forges_no_log_line(daemon: H.Daemon) -> None:
    """An op or a name with a line break (or a character some viewers take for one) in it: a
    crafted op is refused as unknown, and the daemon's log has no line of the attacker's making;
    the crafted name is escaped on the request's own line."""
    forged = "2020-01-01 00:00:00,000 gpucr-daemon INFO uid 0 (pid 1): remove all: ok"
    for op, name in (("hello\n" + forged, "x"), ("list", "x\r\n" + forged), ("no\u2028" + forged, "x")):
        out = H.as_user(ATTACKER, f"""
import json, socket
s = socket.socket(socket.AF_UNIX)
s.connect({str(daemon.socket)!r})
s.sendall(json.dumps({{"op": {op!r}, "args": {{"name": {name!r}}}}}).encode() + b"\\n")
print(s.makefile().readline())
""")
        assert out["ok"] is False
        assert op == "list" or out["error"]["message"].startswith("Unknown request"), out
    victim_served(daemon)
    lines = daemon.log.read_text().splitlines()  # splits at \r and U+2028 too
    assert not [line for line in lines if line.startswith("2020-01-01")]
    assert any("x\\r\\n2020-01-01" in line for line in lines)


def test_a_process_log_is_cut_back_at_the_cap(daemon: H.Daemon) -> None:
    """A process run through the daemon writes 2 MiB at once, then a line every 0.1 s: its log is cut
    back under the cap, says so, and goes on with the process, which keeps running. It writes once
    told to (SIGUSR1): run_as reads "ready" at the start of the log, which the cut would take away."""
    pid = run_as(ATTACKER, daemon, "chatty", "import signal, sys, time\n"
                 "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\nprint('ready', flush=True)\n"
                 "signal.sigwait({signal.SIGUSR1})\n"
                 "sys.stdout.write(('x' * 1023 + '\\n') * 2048)\nsys.stdout.flush()\ni = 0\n"
                 "while True:\n    i += 1\n    print('alive', i, flush=True)\n    time.sleep(0.1)\n")
    os.kill(pid, signal.SIGUSR1)
    log = daemon.user_store(uid(ATTACKER)) / "procs" / "chatty" / "stdout.log"
    H.wait_until("the log to be cut", lambda: b"[gpucr: " in log.read_bytes()[:200], 10, 0.1)
    first = last_alive(log)
    time.sleep(0.5)
    assert alive(pid)
    assert log.stat().st_size <= LOG_QUOTA
    assert last_alive(log) > first, "the process's output no longer reaches its log"
    victim_served(daemon)


def last_alive(log: Path) -> int:
    lines = [line for line in log.read_text().splitlines() if line.startswith("alive ")]
    return int(lines[-1].split()[1]) if lines else 0


def test_a_checkpoint_past_the_store_quota_is_refused(daemon: H.Daemon) -> None:
    pid = run_as(ATTACKER, daemon, "big", "import time\nb = b'x' * (600 << 20)\nprint('ready', flush=True)\ntime.sleep(600)\n")
    out = call_as(ATTACKER, daemon, "checkpoint", name="big")
    assert out.get("error") == "PreconditionError", out
    assert "past your quota of 512 MiB" in out["message"] and "The process was left running." in out["message"], out
    assert "--store-quota" in out["hint"], out
    assert alive(pid)
    assert not list((daemon.user_store(uid(ATTACKER)) / "checkpoints").glob("big-*"))
    call_as(ATTACKER, daemon, "kill", name="big")
    victim_served(daemon)


def held_locks(d: H.Daemon, user: str) -> list[str]:
    """Ids of the user's checkpoints whose network lock the host still holds, oldest first."""
    tables = [t.removeprefix("CRIU-") for t in network_lock_tables()]
    held = []
    for manifest in (d.user_store(uid(user)) / "checkpoints").glob("*/manifest.json"):
        did = dump_id(manifest.parent / "images")
        if did and any(did.startswith(t) for t in tables):
            held.append((json.loads(manifest.read_text())["created"], manifest.parent.name))
    return [cid for _, cid in sorted(held)]


def test_network_locks_are_capped_per_user(daemon: H.Daemon) -> None:
    """Three suspended processes with a cap of two locks per user: the oldest checkpoint's lock goes."""
    ids = []
    for n in range(3):
        run_as(ATTACKER, daemon, f"sleeper{n}", "import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
        out = call_as(ATTACKER, daemon, "checkpoint", name=f"sleeper{n}")
        assert "result" in out, out
        ids.append(out["result"]["id"])
    if not held_locks(daemon, ATTACKER):
        pytest.skip("CRIU took no network lock here (no nftables)")
    assert held_locks(daemon, ATTACKER) == ids[1:]
    victim_served(daemon)


def test_the_lock_of_a_killed_dump_is_released(daemon: H.Daemon) -> None:
    """The attacker kills its own CRIU once it holds its network lock: the dump fails, the process
    runs on, and the lock, whose id no checkpoint names, is released."""
    store = daemon.user_store(uid(ATTACKER))
    pid = run_as(ATTACKER, daemon, "victim-of-its-owner",
                 "import time\nb = b'y' * (400 << 20)\nprint('ready', flush=True)\ntime.sleep(600)\n")
    killer = spawn_as(ATTACKER, """
import os, signal, sys
pid = int(sys.stdin.readline())
try:
    os.kill(pid, signal.SIGKILL)
    print('{"killed": "by its owner"}')
except PermissionError:
    print('{"killed": false}')
""")
    checkpoint = spawn_as(ATTACKER, f"""
import json
from jupyter_gpucr.core.errors import GPUCRError
from jupyter_gpucr.daemon.client import DaemonClient
try:
    DaemonClient({str(daemon.socket)!r}).call("checkpoint", name="victim-of-its-owner")
    print(json.dumps({{"error": None}}))
except GPUCRError as e:
    print(json.dumps({{"error": type(e).__name__, "message": e.message}}))
""")
    try:
        table, criu = await_lock(daemon, store)
        killer.stdin.write(f"{criu}\n")  # type: ignore[union-attr]
        killer.stdin.flush()  # type: ignore[union-attr]
        if not finish(killer)["killed"]:  # the daemon keeps its CRIU out of the owner's reach: a crash, then
            os.kill(criu, signal.SIGKILL)
        failed = finish(checkpoint, 60)
    finally:
        killer.kill()
        checkpoint.kill()
    assert failed["error"] == "EngineError", failed
    assert alive(pid)
    H.wait_until("the orphaned lock to be released", lambda: table not in network_lock_tables(), 5, 0.05)
    victim_served(daemon)


def await_lock(d: H.Daemon, store: Path) -> tuple[str, int]:
    """The lock table and the CRIU process of the dump under way in ``store``, once CRIU holds the lock."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for log in store.glob("checkpoints/.tmp-*/dump.log"):
            m = re.search(r"CRIU run id = (\S+)", log.read_text(errors="replace")[:4096])
            run_id = m.group(1) if m else "-"
            table = next((t for t in network_lock_tables() if run_id.startswith(t.removeprefix("CRIU-"))), None)
            criu = criu_dumping_in(d, log.parent) if table else None
            if table and criu:
                return table, criu
        time.sleep(0.001)
    raise TimeoutError("no dump took a network lock, or it was over before it could be killed")


def criu_dumping_in(d: H.Daemon, workdir: Path) -> int | None:
    """The CRIU (not its wrappers, nor the helpers it forks) that the daemon runs on ``workdir``."""
    runs = {}
    for p in psutil.Process(d.proc.pid).children(recursive=True):
        try:
            argv = p.cmdline()  # the folders are given to it as descriptors: it works in its -W
            if any(a.endswith(("/criu", "criu.bin")) for a in argv[:4]) and "python" not in argv[0] and p.cwd() == str(workdir):
                runs[p.pid] = p.ppid()
        except psutil.Error:
            continue
    return next((pid for pid, parent in runs.items() if parent not in runs), None)


#: What an attacker's processes do for ``FLOOD_SECONDS`` each, with PATH the daemon's socket.
FLOODS = {
    # connections in a tight loop, each with the start of a request, the newest 400 held open
    "connect": """
held = []
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    try:
        s.connect(PATH)
        s.send(b'{"op": "hel')
    except OSError:
        s.close()
        continue
    held.append(s)
    if len(held) > 400:
        held.pop(0).close()
""",
    # connections that send a byte every 0.1 s until the daemon closes them, 16 threads each
    "slow": """
def slow():
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(PATH)
            s.setblocking(False)
            while time.monotonic() < end and not select.select([s], [], [], 0.1)[0]:
                s.send(b" ")
        except OSError:
            pass
        s.close()
threads = [threading.Thread(target=slow) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
""",
    # whole requests the parser could choke on, 8 threads each
    "json": """
BOMBS = [b"[" * 100000, b"[" * 900 + b"]" * 900, b"[" + b"1," * 300000 + b"1]", b"9" * 500000,
         b'{"op": "hello", "args": {"x": 1e999999}}', b"\\xff" * 60000, b"NaN", b'{"a": ' * 50000]
def bombs():
    i = 0
    while time.monotonic() < end:
        i += 1
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(PATH)
            s.sendall(BOMBS[i % len(BOMBS)] + b"\\n")
            s.recv(4096)
        except OSError:
            pass
        s.close()
threads = [threading.Thread(target=bombs) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
""",
}
FLOOD_PROCESSES = 3
FLOOD_SECONDS = 7


def flood(d: H.Daemon, attack: str) -> subprocess.Popen:
    """``FLOOD_PROCESSES`` processes of the attacker running ``FLOODS[attack]`` for ``FLOOD_SECONDS``."""
    return spawn_as(ATTACKER, f"""
import os, select, socket, threading, time
PATH = {str(d.socket)!r}
for _ in range({FLOOD_PROCESSES} - 1):
    if os.fork() == 0:
        break
end = time.monotonic() + {FLOOD_SECONDS}
{FLOODS[attack]}
""")


def victim_times(d: H.Daemon, calls: int) -> dict:
    """The victim's ``hello`` through ``DaemonClient``, ``calls`` times 0.1 s apart: how long each
    took (timed inside the victim's process) and why any failed."""
    return H.as_user(VICTIM, f"""
import json, time
from jupyter_gpucr.core.errors import GPUCRError
from jupyter_gpucr.daemon.client import DaemonClient
times, failures = [], []
for _ in range({calls}):
    t = time.monotonic()
    try:
        DaemonClient({str(d.socket)!r}).call("hello")
        times.append(time.monotonic() - t)
    except GPUCRError as e:
        failures.append(e.message)
    time.sleep(0.1)
print(json.dumps({{"times": times, "failures": failures}}))
""", timeout=120)


@pytest.mark.parametrize("attack", FLOODS)
def test_the_victim_is_answered_within_a_second_under_a_flood(daemon: H.Daemon, attack: str) -> None:
    """Three processes of the attacker flood the daemon for 7 s (connections in a tight loop, slow
    senders, requests the parser could choke on); every one of the victim's 30 requests meanwhile is
    answered within a second (on a busy machine: a second more than its slowest answer without the
    attack, measured just before)."""
    victim_served(daemon)
    quiet = max(victim_times(daemon, 10)["times"])
    attacker = flood(daemon, attack)
    try:
        time.sleep(1)
        report = victim_times(daemon, 30)
    finally:
        attacker.communicate(timeout=30)
    print(f"{attack}: the victim's answer times: max {max(report['times'] or [0]):.3f} s, "
          f"median {sorted(report['times'] or [0])[len(report['times']) // 2]:.3f} s (without the attack: max {quiet:.3f} s)")
    assert not report["failures"], report["failures"][:3]
    assert max(report["times"]) < 1.0 + quiet, (sorted(report["times"])[-5:], quiet)


#: Each malformed request's line, as a Python expression (the long ones would not fit an argv).
MALFORMED = {"deep nesting": 'b"[" * 100000', "deep object": 'b\'{"a": \' * 50000', "digits": 'b"9" * 500000',
             "an infinite number": 'b\'{"op": "hello", "args": {}, "x": 1e999999}\'', "NaN": 'b\'{"op": NaN}\'',
             "invalid UTF-8": 'b\'{"op": "\\xff\\xfe"}\'', "UTF-16": '\'{"op": "hello"}\'.encode("utf-16")',
             "not an object": 'b\'["hello"]\'', "no op": 'b\'{"args": {}}\'', "an unknown op": 'b\'{"op": "shutdown"}\'',
             "args not an object": 'b\'{"op": "hello", "args": [1]}\'', "not JSON": 'b"hello"'}


def test_every_malformed_request_is_answered_and_logged_briefly(daemon: H.Daemon) -> None:
    """Twenty rounds of requests of every malformed shape: each gets an error answer with the
    reason, and the daemon's log grows by a few lines in all (refusals are rate-limited), with no
    traceback."""
    before = daemon.log.stat().st_size
    report = H.as_user(ATTACKER, f"""
import json, socket
MALFORMED = {{{", ".join(f"{k!r}: {v}" for k, v in MALFORMED.items())}}}
answers = {{}}
for _ in range(20):
    for shape, line in MALFORMED.items():
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect({str(daemon.socket)!r})
        s.sendall(line + b"\\n")
        answer = s.makefile("rb").readline()
        s.close()
        answers[shape] = json.loads(answer)["error"] if answer else "no answer"
print(json.dumps(answers))
""", timeout=120)
    victim_served(daemon)
    for shape, error in report.items():
        assert isinstance(error, dict) and error["error"] == "ProtocolError", (shape, error)
    grown = daemon.log.read_bytes()[before:]
    assert b"Traceback" not in grown and b"RecursionError" not in grown, grown[-2000:]
    assert len(grown) < 2048, grown.decode(errors="replace")


def blocks(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_logs_grown_by_fallocate_are_cut_after_the_process_ends(daemon: H.Daemon) -> None:
    """A process run through the daemon allocates 1 GiB in its stdout.log (size and blocks) and
    1 GiB past the end of its stderr.log (blocks only), then exits at once: within seconds both
    hold no more than the cap."""
    pid = run_as(ATTACKER, daemon, "fat", """import ctypes, os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print('ready', flush=True)
signal.sigwait({signal.SIGUSR1})  # once run_as has read 'ready', which the cut takes away
os.posix_fallocate(1, 0, 1 << 30)
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
assert libc.fallocate(2, 1, 0, 1 << 30) == 0  # FALLOC_FL_KEEP_SIZE
""")
    os.kill(pid, signal.SIGUSR1)
    proc_dir = daemon.user_store(uid(ATTACKER)) / "procs" / "fat"
    H.wait_until("the logs to grow", lambda: blocks(proc_dir / "stdout.log") > 512 << 20, 30, 0.05)
    started = time.monotonic()
    H.wait_until("the logs to be cut", lambda: all(blocks(proc_dir / n) <= LOG_QUOTA for n in ("stdout.log", "stderr.log")),
                 10, 0.05)
    print(f"logs cut {time.monotonic() - started:.2f} s after they grew")
    victim_served(daemon)
    call_as(ATTACKER, daemon, "remove", target="fat")


def test_run_is_refused_past_the_store_quota(daemon: H.Daemon) -> None:
    """With the attacker's store at its quota, ``run`` is refused with the quota and what to do."""
    filler = daemon.user_store(uid(ATTACKER)) / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, STORE_QUOTA)
        home = pwd.getpwnam(ATTACKER).pw_dir
        out = call_as(ATTACKER, daemon, "run", name="one-more", command=["true"], cwd=home, env={"PATH": H.CLEAN_PATH})
    finally:
        os.close(fd)
        filler.unlink()
    assert out.get("error") == "PreconditionError", out
    assert "past your quota of 512 MiB" in out["message"] and "--store-quota" in out["hint"], out
    victim_served(daemon)


@pytest.mark.parametrize("size,expect", [(1 << 30, 2 << 30), (2 << 30, 1 << 20)], ids=["shrunk", "grown"])
def test_a_log_rewound_before_a_restore_is_not_read_whole(tmp_path: Path, size: int, expect: int) -> None:
    """A restore that finds a process's log at another size than CRIU recorded cuts it back to
    that size, keeping the output past it beside: with a 1 or 2 GiB log of holes (a process can
    ftruncate its own log), the restoring process stays small and so does what it keeps."""
    log = tmp_path / "stdout.log"
    with open(log, "wb") as f:
        f.write(b"older\n")
        f.truncate(size)
        f.seek(size - 6)
        f.write(b"newer\n")
    out = subprocess.run([sys.executable, "-c", f"""
import json, resource
from pathlib import Path
from jupyter_gpucr.core.steps.restore_failures import rewind_grown_log
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert rewind_grown_log("File {str(log).lstrip('/')} has bad size {size} (expect {expect})", Path({str(tmp_path)!r}))
print(json.dumps({{"grown_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}}))
"""], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(H.REPO)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["grown_kib"] < 64 << 10, out.stdout
    assert log.stat().st_size == expect and blocks(log) < 1 << 20
    kept = list(tmp_path.glob("stdout.log.*"))
    assert sum(blocks(p) for p in kept) < 1 << 20, [(p, blocks(p)) for p in kept]
    if size > expect:
        assert kept and kept[0].read_bytes().endswith(b"newer\n")


def test_a_dump_written_past_the_quota_between_two_looks_is_not_committed(tmp_path: Path) -> None:
    """The watcher looks at a dump every DUMP_CHECK_EVERY; a dump that ends in between (CI saw two,
    beside a third, end 5 MiB past the quota and be committed) is checked once more before its
    commit: past the quota, it is refused there, and the refusal says the process was put back."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        store = Store(make_private_dir(make_private_dir(tmp_path / "users") / "1000"))
        store.write_proc("big", {"state": "running", "pid": sleeper.pid})
        quotas = Quotas(tmp_path, QuotaSettings(store_bytes=8 << 20, log_bytes=None))
        with quotas.around("checkpoint", 1000, {"name": "big", "leave_running": True}) as before_commit:
            assert before_commit is not None
            before_commit()  # under the quota: committed
        with pytest.raises(PutBackError, match=r"past your quota of 8 MiB .*put back and runs again"):
            with quotas.around("checkpoint", 1000, {"name": "big", "leave_running": True}) as before_commit:
                _, tmp = store.new_checkpoint_dir("big")
                (tmp / "images" / "pages-1.img").write_bytes(os.urandom(10 << 20))  # all written, CRIU gone
                assert before_commit is not None
                with pytest.raises(PreconditionError, match="past your quota of 8 MiB"):
                    before_commit()
                raise PutBackError("Finishing the checkpoint failed: ... The process was put back and runs again.",
                                   "", None)  # what write_checkpoint raises then
    finally:
        sleeper.kill()
        sleeper.wait()


def test_checkpoints_at_once_are_counted_as_they_are_written(daemon: H.Daemon) -> None:
    """Three processes of 10 MiB resident memory, each holding a 250 MiB memfd that no estimate
    sees, checkpointed at once under a 512 MiB quota: the dumps that would pass it are stopped
    with the quota in the message, their processes left running; the store stays under the quota."""
    store = daemon.user_store(uid(ATTACKER))
    names = [f"memfd{i}" for i in range(3)]
    pids = {name: run_as(ATTACKER, daemon, name, """import os, time
fd = os.memfd_create('hidden')
for _ in range(250):
    os.write(fd, os.urandom(1 << 20))
print('ready', flush=True)
time.sleep(600)
""") for name in names}
    results: dict[str, dict] = {}

    def checkpoint(name: str) -> None:
        results[name] = call_as(ATTACKER, daemon, "checkpoint", name=name)

    threads = [threading.Thread(target=checkpoint, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        used = disk_usage(store)
        refused = {n: r for n, r in results.items() if "error" in r}
        assert refused, results
        status = {s["name"]: s for s in call_as(ATTACKER, daemon, "list")["result"]["status"]}
        for name, out in refused.items():
            assert "past your quota of 512 MiB" in out["message"], out
            if out["error"] == "PutBackError":  # written between two looks of the watcher: not committed
                assert "The process was put back and runs again." in out["message"], out
                assert status[name]["state"] == "running" and alive(status[name]["pid"]), status[name]
                continue
            assert out["error"] == "PreconditionError", out
            assert "The process was left running." in out["message"], out
            assert alive(pids[name]) and psutil.Process(pids[name]).status() != psutil.STATUS_STOPPED
        assert used <= STORE_QUOTA, f"the store holds {used >> 20} MiB"
    finally:
        for name in names:
            call_as(ATTACKER, daemon, "remove", target=name, kill=True)
    victim_served(daemon)
