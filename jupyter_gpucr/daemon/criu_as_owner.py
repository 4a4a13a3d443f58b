"""The daemon's ``criu``: dumps and restores run under the uid of the process's owner.

Whatever CRIU creates for a restored process (its files opened again, its sockets, inotify and
fanotify instances, epoll sets, pipes, memory) it creates with the credentials it runs with. Run
as root, every object would be root's: a file the owner may not open would be opened, a socket
would belong to root (``SO_PEERCRED`` uid 0, root's ``SO_REUSEPORT`` groups joined), limits would
be charged to root. So CRIU runs as the owner: their real, effective, saved and filesystem uid and
gid, the supplementary groups the daemon names, and only these capabilities, kept as ambient ones:

- ``checkpoint_restore``: the PIDs of the image (``clone3`` with ``set_tid``), ``/proc/PID/map_files``;
- ``net_admin``: TCP connections through repair mode, and CRIU's network lock (nftables);
- ``sys_ptrace``: the userfaultfd of a restore whose memory comes in behind it (the host's
  ``vm.unprivileged_userfaultfd`` is off), and reading the tree's memory on a dump;
- ``setpcap``: giving the restored tasks the bounding set the image recorded.

None of them lets CRIU open, create or own anything the owner could not: no ``dac_override``,
``dac_read_search``, ``fowner``, ``chown``, ``setuid`` or ``setgid``. What of the daemon's CRIU
needs must come through descriptors: the images and work folders (root-only folders, which the owner
cannot reach by any path, given to the owner for the length of the operation and taken back after),
the CRIU binary and its libraries (opened here, so a root-only installation works), and files of the
daemon's store that the process had open (its logs, handed down by the holder: ``--inherit-fd``).
The owner may signal their CRIU but not trace it (it holds capabilities they lack); this script stays
its parent, as root, ends a CRIU that was stopped, and says so.

The daemon passes the owner as ``--gpucr-owner=UID:GID:GROUPS`` (groups comma-separated) and, for a
restore, the cgroup the tree belongs in as ``--gpucr-cgroup=FOLDER``: joined here while still root,
so that everything the restore creates is charged to it from the start. Every other command runs
CRIU unchanged, as root. A plain script (``python -I -S``), installed by the daemon as its criu binary.
"""
from __future__ import annotations

import os
import signal
import sys
import time

STALLED_S = 3.0
CAPS = ("checkpoint_restore", "net_admin", "sys_ptrace", "setpcap")
OWNER_FLAG, CGROUP_FLAG = "--gpucr-owner=", "--gpucr-cgroup="
#: The name CRIU writes the restored root's PID to, in its work folder (it must not exist yet).
OWN_PIDFILE = ".restore-as-owner.pid"
#: Where setpriv (util-linux) is looked for: fixed root-owned folders, never the caller's PATH.
SYSTEM_BIN = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
#: The bundle's layout, relative to its bin/criu script (see scripts/install-criu.sh).
BUNDLE = ("..", "lib", "gpucr-criu")


def main(criu: str, args: list[str]) -> None:
    owner = _take(args, OWNER_FLAG)
    cgroup = _take(args, CGROUP_FLAG)
    if args[:1] == ["dump"]:
        args = [a for a in args if a != "--link-remap"]  # CRIU would link a deleted file into the user's folders
    if owner is None or args[:1] not in (["dump"], ["restore"]):
        os.execv(criu, [criu, *args])
    uid, gid, groups = _owner(owner)
    if cgroup:
        _join_cgroup(cgroup)
    sys.exit(_as_owner(criu, args, uid, gid, groups))


def _take(args: list[str], flag: str) -> str | None:
    """Remove the daemon's own option ``flag`` from ``args``; its value."""
    found = [a for a in args if a.startswith(flag)]
    for a in found:
        args.remove(a)
    return found[-1][len(flag):] if found else None


def _owner(spec: str) -> tuple[int, int, list[int]]:
    uid, gid, groups = spec.split(":")
    if int(uid) == 0:
        raise SystemExit("Error (gpucr): the daemon never runs CRIU as the owner uid 0.")
    return int(uid), int(gid), [int(g) for g in groups.split(",") if g]


def _join_cgroup(folder: str) -> None:
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as e:
        raise SystemExit(f"Error (gpucr): could not join the process's cgroup {folder}: {e.strerror}") from None


def _as_owner(criu: str, args: list[str], uid: int, gid: int, groups: list[int]) -> int:
    """Run ``criu ARGS`` as the owner (see the module docstring), its folders handed over by
    descriptor for the length of the run and taken back after."""
    folders = [p for p in dict.fromkeys((_opt(args, "-D"), _opt(args, "-W"))) if p]
    fds = {path: _open_dir(path) for path in folders}
    workdir = fds[_opt(args, "-W") or folders[0]]
    pidfile = _opt(args, "--pidfile")
    for fd in fds.values():
        _give(fd, uid, gid)
    try:
        if pidfile:
            _unlink_at(workdir, OWN_PIDFILE)
            _set_opt(args, "--pidfile", OWN_PIDFILE)  # relative: in the work folder, which CRIU enters
        for flag in ("-D", "-W"):
            path = _opt(args, flag)
            if path:
                _set_opt(args, flag, f"/proc/self/fd/{fds[path]}")
        binary, bundle = _binary(criu)
        caps = ",".join(f"+{c}" for c in CAPS)
        argv = [_setpriv(), f"--reuid={uid}", f"--regid={gid}", f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
                f"--inh-caps={caps}", f"--ambient-caps={caps}", "--", *binary, args[0], "--unprivileged", *args[1:]]
        try:
            code = _run_owned(argv, args[0])
        finally:
            if bundle is not None:
                os.close(bundle)
        if pidfile and code == 0:
            _move_pidfile(workdir, pidfile)
        return code
    finally:
        for fd in fds.values():
            _give(fd, 0, 0)
            os.close(fd)


def _setpriv() -> str:
    for folder in SYSTEM_BIN:
        path = os.path.join(folder, "setpriv")
        if os.access(path, os.X_OK):
            return path
    raise SystemExit("Error (gpucr): setpriv (util-linux) is not installed; the daemon needs it to run CRIU as "
                     "the process's owner.")


def _opt(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def _set_opt(args: list[str], flag: str, value: str) -> None:
    for i, a in enumerate(args):
        if a == flag:
            args[i + 1] = value
            return
        if a.startswith(flag + "="):
            args[i] = f"{flag}={value}"
            return


def _open_dir(path: str) -> int:
    """A root-only folder of the daemon's store, opened as root without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    os.set_inheritable(fd, True)
    return fd


def _give(folder: int, uid: int, gid: int) -> None:
    """Make ``uid`` own the folder and the files and sockets in it (not what links point at): CRIU
    as the owner reads and writes there. The folder's parents stay root's, so the owner reaches
    none of it by a path; only this descriptor, which CRIU has, leads there."""
    os.fchown(folder, uid, gid)
    for name in os.listdir(folder):
        try:
            os.chown(name, uid, gid, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            pass


def _unlink_at(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _move_pidfile(folder: int, pidfile: str) -> None:
    """The PID CRIU wrote (as the owner) into its work folder, where the daemon looks for it."""
    fd = os.open(OWN_PIDFILE, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
    with os.fdopen(fd) as f:
        pid = int(f.read(32).strip())
    os.unlink(OWN_PIDFILE, dir_fd=folder)
    out = os.open(pidfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(out, "w") as f:
        f.write(str(pid))


def _binary(criu: str) -> tuple[list[str], int | None]:
    """How the owner runs ``criu``, and the descriptor that leads there: gpucr's bundle through a
    descriptor of its folder (the owner may not reach the installation by its path, such as a
    virtualenv under /root), any other CRIU by its path."""
    bundle = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(criu)), *BUNDLE))
    if not os.path.isfile(os.path.join(bundle, "criu.bin")):
        return [criu], None
    fd = os.open(bundle, os.O_RDONLY | os.O_DIRECTORY)
    os.set_inheritable(fd, True)
    here = f"/proc/self/fd/{fd}"
    return [f"{here}/lib/ld-linux-x86-64.so.2", "--library-path", f"{here}/lib", f"{here}/criu.bin"], fd


def _run_owned(argv: list[str], verb: str) -> int:
    """Run a CRIU that its owner can signal; a stop of it, a kill, or a process it forked left
    stopped (CRIU would wait for it for good) ends the operation with a reason. CRIU stops helpers
    of its own for moments; only one stopped for ``STALLED_S`` counts."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(argv[0], argv)
        except OSError as e:
            print(f"Error (gpucr): cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        os._exit(127)
    stopped_since: dict[int, float] = {}
    while True:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        now = time.monotonic()
        stopped_since = {p: stopped_since.get(p, now) for p in _descendants(pid) if _state(p) == "T"}
        if done and os.WIFSTOPPED(status) or any(now - t > STALLED_S for t in stopped_since.values()):
            for p in [pid, *_descendants(pid)]:
                _kill(p)
            os.waitpid(pid, 0)
            print(f"Error (gpucr): CRIU, which runs as the process's owner, was stopped by a signal; the {verb} was "
                  "abandoned.", file=sys.stderr)
            return 1
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                print(f"Error (gpucr): CRIU, which runs as the process's owner, was killed by "
                      f"{signal.Signals(-code).name}; the {verb} was abandoned.", file=sys.stderr)
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
