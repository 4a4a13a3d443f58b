"""PID 1 of a checkpointable process's own PID namespace.

Every process gpucr manages runs (or is restored) as a child of this small init, started by
``unshare --pid --fork --mount-proc``. That gives three things the host cannot:
the process's PIDs are private, so a restore never collides with host PIDs; the init reaps
what it launched (the host's PID 1 here does not); and CRIU can later be run inside the
same namespaces (``nsenter``), so neither namespace needs dumping.

Modes: ``run`` launches a command; ``restore`` runs ``criu restore`` and adopts the result.
The outcome is written as JSON to ``--status`` for the launcher.

A restore with ``--lazy-pages`` first starts a lazy-pages daemon here (CRIU's, so the restored tree
runs before its memory is all back: the daemon serves each page the tree touches and streams the
rest behind it; or gpucr's ``pagefill``, which copies it all in with many threads before the
restore is handed back).
The file ``--pages`` then says ``{"pages": "lazy"}``, later ``"in"`` once the daemon is done.
Should the daemon fail, the tree's untransferred memory would read as zeros: the holder kills
every process of the namespace at once and writes ``"lost"`` (the checkpoint is intact).

A fork is restored with ``--netns`` (the holder was started in a network namespace of its own: it
brings ``lo`` up first, puts the host addresses of ``--address`` on it for the restore and, after it,
takes them off and destroys the copies of connections to outside the namespace: see ``forknet.py``),
``--relay FD:PORT`` (listening sockets on the host, handed down, that
the holder relays to PORT inside: see ``relay.py``) and ``--inherit-file N:PATH`` (the fork's own
copy of a file the source had open for writing, opened here on descriptor N for CRIU's
``--inherit-fd``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

# Workload PIDs start above this, so CRIU and its helpers (low PIDs in a fresh namespace)
# never take a PID the restored tree needs.
FIRST_WORKLOAD_PID = 1000
# Each process gets its own stretch of PIDs above that, from its name: processes in different PID
# namespaces still share the host's network namespace, and libraries that name an abstract UNIX
# socket after getpid() (a GPU kernel has one) would otherwise give every GPU kernel the same name,
# so one kernel's restore could not bind it while another kernel holds it.
PID_STRETCHES = 7000
PID_STRETCH = 4
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _write_status(path: str, status: dict) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)


def first_workload_pid(status: str) -> int:
    """The PID after which the workload of the holder reporting to ``status`` starts (the status
    file's path names the process: the same for every run of it)."""
    return FIRST_WORKLOAD_PID + zlib.crc32(status.encode()) % PID_STRETCHES * PID_STRETCH


def _reserve_low_pids(status: str) -> None:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(first_workload_pid(status)))


def _open_stdio(stdout: str, stderr: str) -> None:
    """Give the child stdio opened inside this mount namespace, so CRIU can resolve them."""
    null = os.open("/dev/null", os.O_RDONLY)
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    err = out if stderr == stdout else os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for src, dst in ((null, 0), (out, 1), (err, 2)):
        os.dup2(src, dst)


class _CannotStart(Exception):
    """Why the command did not start, in words for the user."""


def _chdir(cwd: str | None) -> None:
    if not cwd:
        return
    try:
        os.chdir(cwd)
    except OSError as e:  # Python's own message would read like a missing command
        raise _CannotStart(f"cannot use the working directory {cwd!r}: {e.strerror}") from None


def _signal_group(leader: int, signum: int) -> None:
    """Signal the workload's process group (it is a session leader), as jupyter_client does, so
    its child processes get interrupts too; the leader alone when the group is gone."""
    try:
        os.killpg(leader, signum)
    except OSError:
        try:
            os.kill(leader, signum)
        except ProcessLookupError:
            pass


def _launch(args: argparse.Namespace) -> tuple[int, str | None]:
    """Fork and exec the command: its PID, and why it could not start (None once it runs).

    The answer waits for the exec itself through a close-on-exec pipe, so a missing command or
    working directory is reported as such, never as a process that started and then vanished."""
    ready, report = os.pipe()  # both close on exec
    pid = os.fork()
    if pid == 0:
        os.close(ready)
        try:
            os.setsid()
            _open_stdio(args.stdout, args.stderr)
            os.closerange(3, report)
            os.closerange(report + 1, 65536)
            _chdir(args.cwd)
            for sig in _FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(args.command[0], args.command)
        except BaseException as e:  # noqa: BLE001 - the child must never return into the holder's code
            why = str(e) if isinstance(e, _CannotStart) else f"cannot start {args.command[0]!r}: {_reason(e)}"
            print(f"gpucr: {why}", file=sys.stderr)
            os.write(report, why.encode())
        os._exit(127)
    os.close(report)
    with os.fdopen(ready, "rb") as f:
        why = f.read().decode(errors="replace")
    return pid, why or None


def _reason(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else repr(e)


def _spawn(command: list[str], keep: tuple[int, ...] = ()) -> int:
    """Fork and exec ``command`` with no descriptor of ours but stdio and ``keep``."""
    pid = os.fork()
    if pid == 0:
        edges = [2, *sorted(keep), 65536]
        for low, high in zip(edges, edges[1:]):
            os.closerange(low + 1, high)
        for fd in keep:
            os.set_inheritable(fd, True)
        os.execvp(command[0], command)
    return pid


def _open_inherited(specs: list[str]) -> tuple[int, ...]:
    """Open each ``N:FLAGS:POS:PATH`` on descriptor N, with the open flags and at the position the
    image has (CRIU takes the descriptor as it is), inside this mount namespace (a file opened
    outside it would carry a mount that the fork's later dumps cannot find)."""
    fds = []
    for spec in specs:
        fd, flags, pos, path = spec.split(":", 3)
        opened = os.open(path, int(flags))
        os.lseek(opened, int(pos), os.SEEK_SET)
        os.dup2(opened, int(fd))
        os.close(opened)
        fds.append(int(fd))
    return tuple(fds)


def _sibling(name: str) -> ModuleType:
    """``NAME.py`` beside this file (a plain script: the package is not importable here)."""
    spec = importlib.util.spec_from_file_location(f"gpucr_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _criu_restore(args: argparse.Namespace) -> int | None:
    """Run ``criu restore``, with the files of ``--inherit-file`` open for it (closed here after)."""
    keep = _open_inherited(args.inherit_file)
    pid = _spawn(args.command, keep)
    for fd in keep:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return None
    with open(args.pidfile) as f:
        return int(f.read().strip())


def _start_lazy_pages(command: list[str], socket: Path, timeout: float = 30.0) -> int | None:
    """Start CRIU's lazy-pages daemon and wait until it listens on ``socket``; None if it died."""
    socket.unlink(missing_ok=True)  # a stale one from an earlier restore would look like readiness
    pid = _spawn(command)
    deadline = time.monotonic() + timeout
    while not socket.exists():
        if os.waitpid(pid, os.WNOHANG)[0] or time.monotonic() > deadline:
            _kill(pid)
            return None
        time.sleep(0.002)
    return pid


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _others_in_namespace() -> bool:
    """Processes of this namespace that are not our children: a CRIU entered with nsenter."""
    return any(entry.isdigit() and entry != "1" for entry in os.listdir("/proc"))


def _reap_until_empty(main: int, on_exit: dict[int, Callable[[int], None]] | None = None) -> int:
    """Reap every child (adopted orphans too) and exit with the main process's status once the
    namespace is empty. Exiting earlier would kill, with the namespace, a CRIU that dumped the
    process and is still finishing: its checkpoint would be complete but reported as failed.
    ``on_exit[pid](code)`` runs when that child is reaped."""
    code = 0
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            if not _others_in_namespace():
                return code
            time.sleep(0.02)
            continue
        if pid == main:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
        elif on_exit and pid in on_exit:
            on_exit.pop(pid)(os.waitstatus_to_exitcode(status))


def _pages_settled(pages_path: str, socket: Path, main: int) -> Callable[[int], None]:
    """What to do when the lazy-pages daemon exits: all pages are in, or the tree must die now
    (if it is not dead already: it may have been killed for a page it waited for)."""
    def settled(code: int) -> None:
        socket.unlink(missing_ok=True)
        if code == 0:
            _write_status(pages_path, {"pages": "in"})
            return
        # Said first: whoever sees the tree die must find out why.
        _write_status(pages_path, {"pages": "lost", "error": f"the lazy-pages daemon exited with {code}", "exit": code})
        if os.getpid() == 1:  # init of the namespace: -1 is every other process in it
            os.kill(-1, signal.SIGKILL)
        else:
            _signal_group(main, signal.SIGKILL)
    return settled


def _say(lines: list[str]) -> None:
    """Into the holder's log (the process's ``holder.log``)."""
    for line in lines:
        print(f"gpucr-holder: {line}", file=sys.stderr, flush=True)


def _cut_outside(forknet: ModuleType) -> None:
    """Destroy the restored copies of connections to outside the fork, before the relay opens
    connections of its own (see ``forknet.py``); say which in the holder's log."""
    cut, problem = forknet.cut_outside()
    if cut:
        _say([f"closed {len(cut)} connection(s) to outside the fork: "
              + ", ".join(f"{c.local[0]}:{c.local[1]} -> {c.remote[0]}:{c.remote[1]}" for c in cut)])
    _say([problem] if problem else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpucr-holder")
    parser.add_argument("mode", choices=["run", "restore"])
    parser.add_argument("--status", required=True)
    parser.add_argument("--stdout", default="/dev/null")
    parser.add_argument("--stderr", default="/dev/null")
    parser.add_argument("--cwd")
    parser.add_argument("--pidfile")
    parser.add_argument("--lazy-pages", help="the lazy-pages daemon's command, as a JSON list; "
                        "then --lazy-socket is where it listens and --pages where the holder says how far it is")
    parser.add_argument("--lazy-socket")
    parser.add_argument("--pages")
    parser.add_argument("--netns", action="store_true", help="this is a network namespace of its own: bring lo up")
    parser.add_argument("--relay", action="append", default=[], help="FD:PORT, a listening socket to relay to PORT")
    parser.add_argument("--inherit-file", action="append", default=[], help="N:FLAGS:POS:PATH, opened on descriptor N for CRIU")
    parser.add_argument("--address", action="append", default=[], help="a host address on lo while CRIU restores")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1:]

    os.setsid()
    main_pid = 0

    def forward(signum: int, _frame: object) -> None:
        if main_pid:
            _signal_group(main_pid, signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    if args.mode == "run":
        _reserve_low_pids(args.status)
        main_pid, failure = _launch(args)
        if failure:
            _write_status(args.status, {"ok": False, "error": failure})
            return _reap_until_empty(main_pid)
        _write_status(args.status, {"ok": True, "ns_pid": main_pid})
        return _reap_until_empty(main_pid)
    # What CRIU and the page daemon write beside the checkpoint (logs, stats) stays private; the
    # restored tree gets its own umask back from the images.
    os.umask(0o077)
    relay, forknet = (_sibling("relay"), _sibling("forknet")) if args.netns else (None, None)
    if relay is not None and forknet is not None:
        relay.bring_lo_up()
        _say(forknet.add_addresses(args.address))
    lazy = None
    if args.lazy_pages:
        socket = Path(args.lazy_socket)
        lazy = _start_lazy_pages(json.loads(args.lazy_pages), socket)
        if lazy is None:
            _write_status(args.status, {"ok": False})
            return 1
    restored = _criu_restore(args)
    if forknet is not None:
        if restored is not None:
            _cut_outside(forknet)
        _say(forknet.remove_addresses(args.address))
    if restored is None:
        if lazy is not None:
            _kill(lazy)
        _write_status(args.status, {"ok": False})
        return 1
    main_pid = restored
    if relay is not None:
        relay.start([(int(fd), int(port)) for fd, port in (r.split(":") for r in args.relay)])
    if lazy is not None:
        _write_status(args.pages, {"pages": "lazy"})
    _write_status(args.status, {"ok": True, "ns_pid": main_pid})
    return _reap_until_empty(main_pid, {lazy: _pages_settled(args.pages, socket, main_pid)} if lazy else None)


if __name__ == "__main__":
    sys.exit(main())
