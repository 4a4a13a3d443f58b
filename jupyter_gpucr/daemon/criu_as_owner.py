"""Run ``criu dump`` under the uid of the process it dumps, where root lacks CAP_SYS_RESOURCE.

CRIU reads every task's rlimits with prlimit(), which the kernel allows across uids only with
CAP_SYS_RESOURCE; containers often drop it from the bounding set (this CI machine does), and the
dump of another user's process then fails with ``Can't get rlimit 0``. Run as the owner (same real
uid and gid) with the capabilities CRIU needs kept as ambient capabilities and ``--unprivileged``,
it dumps. The owner cannot trace that CRIU (it holds capabilities the owner lacks) but can signal
it: this script stays its parent, as root, and ends a dump whose CRIU was stopped or killed, so that
the daemon's request fails at once with the reason instead of hanging. Every other command, and every
dump where root has CAP_SYS_RESOURCE, runs CRIU unchanged, but dumps never make link remaps: CRIU would
link a deleted file into a folder of the user's as root, and the user could have swapped that folder
for a link to any other (the daemon refuses to checkpoint deleted files instead).
A plain script (``python -I -S``), installed by the daemon as its criu binary.
"""
from __future__ import annotations

import os
import signal
import sys
import time

CAP_SYS_RESOURCE = 24
STALLED_S = 3.0
CAPS = ("sys_admin", "sys_ptrace", "checkpoint_restore", "net_admin", "dac_override", "dac_read_search", "fowner", "chown",
        "setuid", "setgid", "kill", "sys_chroot", "fsetid", "setpcap", "sys_nice")


def _status(pid: str) -> dict[str, list[str]]:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.split() for k, _, v in (line.partition(":") for line in f)}


def main(criu: str, args: list[str]) -> None:
    if args[:1] == ["dump"]:
        args = [a for a in args if a != "--link-remap"]
    own = _status("self")
    if args[:1] == ["dump"] and "-t" in args and not int(own["CapEff"][0], 16) & (1 << CAP_SYS_RESOURCE):
        target = _status(args[args.index("-t") + 1])
        uid, gid = target["Uid"][0], target["Gid"][0]
        if target["Uid"] == [uid] * 4 and target["Gid"] == [gid] * 4 and uid != "0":
            caps = ",".join(f"+{c}" for c in CAPS)
            sys.exit(_run_as_owner(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", f"--inh-caps={caps}",
                                    f"--ambient-caps={caps}", "--", criu, "dump", "--unprivileged", *args[1:]]))
    os.execv(criu, [criu, *args])


def _run_as_owner(argv: list[str]) -> int:
    """Run a CRIU that its owner can signal; a stop of it, a kill, or a process it forked left
    stopped (CRIU would wait for it for good) ends the dump with a reason. CRIU stops helpers of
    its own for moments; only one stopped for ``STALLED_S`` counts."""
    pid = os.spawnvp(os.P_NOWAIT, argv[0], argv)
    stopped_since: dict[int, float] = {}
    while True:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        now = time.monotonic()
        stopped_since = {p: stopped_since.get(p, now) for p in _descendants(pid) if _state(p) == "T"}
        if done and os.WIFSTOPPED(status) or any(now - t > STALLED_S for t in stopped_since.values()):
            for p in [pid, *_descendants(pid)]:
                _kill(p)
            os.waitpid(pid, 0)
            print("Error (gpucr): CRIU, which dumps as the process's owner, was stopped by a signal; the dump was "
                  "abandoned.", file=sys.stderr)
            return 1
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                print(f"Error (gpucr): CRIU, which dumps as the process's owner, was killed by "
                      f"{signal.Signals(-code).name}; the dump was abandoned.", file=sys.stderr)
                return 1
            return code
        time.sleep(0.02)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            continue
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
