"""An attacker's process: it makes a user and a mount namespace of its own (as ordinary users may),
keeps its own uid in it, bind-mounts ``SOURCE`` over ``TARGET`` (the daemon's state folder) and
then runs ``file_agent.py`` (its arguments follow)."""
import ctypes
import os
import sys
from pathlib import Path

CLONE_NEWUSER, CLONE_NEWNS, MS_BIND = 0x10000000, 0x00020000, 4096
source, target, *rest = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
    sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
Path("/proc/self/setgroups").write_text("deny")
Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
if libc.mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
    sys.exit(f"mount: {os.strerror(ctypes.get_errno())}")
agent = str(Path(__file__).with_name("file_agent.py"))
os.execv(sys.executable, [sys.executable, agent, *rest])
