"""The leader of a session of several processes (``gpucr run --group``): their common parent.

CRIU dumps one process tree consistently (every process frozen before any is dumped) and restores
it whole (every process, pipe and socket in place before any runs again). Processes that are
started one by one become one tree by being children of this small process, which is itself the
workload of a holder (``process/holder.py``), so the session is checkpointed, paused and restored as one.

``gpucr`` asks for a member by writing ``members/NAME.request.json`` in the session's folder and
sending SIGUSR1 (once ``members/leader.json`` says the leader waits for it); the leader starts it (its own session, output to ``members/NAME.stdout.log`` and
``.stderr.log``) and answers in ``members/NAME.json``: ``{"ns_pid": N}`` or ``{"error": WHY}``;
once the member exits, ``"exit"`` is added. Nothing of this is open while the leader waits (it
waits in ``sigwaitinfo``), so a checkpoint holds no more than the leader's few MiB. SIGTERM,
SIGINT and SIGHUP are passed to every member; the leader exits when its last member has.

A plain script (``python -I -S groupleader.py FOLDER``): it needs only the standard library.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WAITED = {signal.SIGUSR1, signal.SIGCHLD, *_PASSED_ON}
READY = "leader.json"


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _start(request: dict, out: Path, err: Path) -> tuple[int, str | None]:
    """Fork and exec a member: its PID, and why it could not start (None once it runs)."""
    ready, report = os.pipe()  # both close on exec
    pid = os.fork()
    if pid == 0:
        os.close(ready)
        try:
            os.setsid()
            null = os.open("/dev/null", os.O_RDONLY)
            for src, dst in ((null, 0), (os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), 1),
                             (os.open(err, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), 2)):
                os.dup2(src, dst)
            os.closerange(3, report)
            os.closerange(report + 1, 65536)
            os.chdir(request["cwd"])
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.execvpe(request["command"][0], request["command"], request["env"])
        except BaseException as e:  # noqa: BLE001 - the child must never return into the leader's code
            why = f"cannot start {request['command'][0]!r}: {e.strerror if isinstance(e, OSError) else e!r}"
            os.write(report, why.encode())
        os._exit(127)
    os.close(report)
    with os.fdopen(ready, "rb") as f:
        why = f.read().decode(errors="replace")
    return pid, why or None


class Leader:
    def __init__(self, folder: Path) -> None:
        self.members_dir = folder / "members"
        self.members: dict[int, str] = {}  # PID -> name
        self.started_any = False

    def take_requests(self) -> None:
        for request_path in sorted(self.members_dir.glob("*.request.json")):
            name = request_path.name[: -len(".request.json")]
            request = json.loads(request_path.read_text())
            request_path.unlink()
            pid, why = _start(request, self.members_dir / f"{name}.stdout.log", self.members_dir / f"{name}.stderr.log")
            self.started_any = True
            if why:
                os.waitpid(pid, 0)
                _write(self.members_dir / f"{name}.json", {"error": why})
            else:
                self.members[pid] = name
                _write(self.members_dir / f"{name}.json", {"ns_pid": pid})

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            name = self.members.pop(pid, None)
            if name is not None:
                answer = self.members_dir / f"{name}.json"
                _write(answer, {**json.loads(answer.read_text()), "exit": os.waitstatus_to_exitcode(status)})

    def pass_on(self, signum: int) -> None:
        for pid in self.members:
            try:
                os.killpg(pid, signum)
            except OSError:
                pass

    def run(self) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
        _write(self.members_dir / READY, {"pid": os.getpid()})  # SIGUSR1 would have ended it before
        while True:
            self.take_requests()
            self.reap()
            if self.started_any and not self.members:
                return 0
            got = signal.sigwaitinfo(_WAITED).si_signo
            if got in _PASSED_ON:
                self.pass_on(got)


if __name__ == "__main__":
    sys.exit(Leader(Path(sys.argv[1])).run())
