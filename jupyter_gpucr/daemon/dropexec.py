"""Become the requesting user, then exec their command (run by the daemon's namespace holder, as root).

The user's environment reaches the command only here, after the privileges are gone: given to the
root processes before (``unshare``, the holder), a variable such as LD_PRELOAD would run the user's
code as root. It comes in a root-only file that is read and deleted first. What of the caller's
confinement the daemon keeps (see ``caller``) is applied here too: the process joins the caller's
cgroup while still root (when that fails it stays where it is; the daemon logs it), takes the
supplementary groups it is given instead of all of the user's, and sets no_new_privs after the
uid change when the caller had it. A plain script (``python -I -S``): it needs only the standard
library.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import pwd
import sys

PR_SET_NO_NEW_PRIVS = 38


def _fail(message: str) -> None:
    print(f"gpucr: {message}", file=sys.stderr)
    os._exit(127)


def _join_cgroup(folder: str) -> None:
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass  # the daemon compares the cgroups and says so in its log


def _no_new_privs() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"could not set no_new_privs: {os.strerror(ctypes.get_errno())}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpucr-dropexec")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--groups", required=True, help="supplementary groups, comma-separated (may be empty)")
    parser.add_argument("--no-new-privs", action="store_true")
    parser.add_argument("--cgroup", help="the cgroup v2 folder to join")
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    with open(args.env_file) as f:
        env = json.load(f)
    os.unlink(args.env_file)
    if args.cgroup:
        _join_cgroup(args.cgroup)
    user = pwd.getpwuid(args.uid)
    os.setgroups([int(g) for g in args.groups.split(",") if g])
    os.setgid(user.pw_gid)
    os.setuid(args.uid)
    if os.getuid() != args.uid or os.geteuid() != args.uid:
        _fail("could not drop privileges")
    if args.no_new_privs:
        _no_new_privs()
    try:
        os.chdir(args.cwd)
    except OSError as e:
        _fail(f"cannot use the working directory {args.cwd!r}: {e.strerror}")
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        _fail(f"cannot start {command[0]!r}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
