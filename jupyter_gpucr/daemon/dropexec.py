"""Become the requesting user, then exec their command (run by the daemon's namespace holder, as root).

The user's environment reaches the command only here, after the privileges are gone: given to the
root processes before (``unshare``, the holder), a variable such as LD_PRELOAD would run the user's
code as root. It comes in a root-only file that is read and deleted first. A plain script
(``python -I -S``): it needs only the standard library.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import sys


def _fail(message: str) -> None:
    print(f"gpucr: {message}", file=sys.stderr)
    os._exit(127)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpucr-dropexec")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--cwd", required=True)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    with open(args.env_file) as f:
        env = json.load(f)
    os.unlink(args.env_file)
    user = pwd.getpwuid(args.uid)
    os.initgroups(user.pw_name, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(args.uid)
    if os.getuid() != args.uid or os.geteuid() != args.uid:
        _fail("could not drop privileges")
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
