"""What restoring through the daemon, with CRIU working as the process's owner, costs against CRIU
run by root on root's own process: the same agent (``cpu_agent.py``, ``--mb`` of memory) checkpointed
and restored ``--rounds`` times each way, rounds alternating. The daemon's side is measured as its
user's client sees it (the request's wall time) and as the daemon reports it (``timings.total``).

    python bench/bench_daemon_checks.py --user NAME [--mb 300] [--rounds 5] [--json-out FILE]

Needs root, CRIU and an ordinary user NAME (created if missing). Prints a table and the same figures
as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr.core.checkpointer import Checkpointer  # noqa: E402
from jupyter_gpucr.core.storage.store import Store  # noqa: E402
from tests import hub as H  # noqa: E402
from tests.conftest import AGENTS, ask, wait_for_line  # noqa: E402

AGENT = str(AGENTS / "cpu_agent.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", default="gpucr-bench")
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    user = H.ensure_user(args.user)
    root = Path(tempfile.mkdtemp(prefix="gpucr-bench-owner-"))
    times: dict[str, list[float]] = {"root's CRIU, root's process": [], "daemon, owner's CRIU (client)": [],
                                     "daemon, owner's CRIU (daemon)": []}
    try:
        plain = Checkpointer(Store(root / "store"))
        os.environ["AGENT_FILE"] = str(root / "agent.txt")
        plain.run("agent", [sys.executable, AGENT, str(args.mb)], cwd="/")
        hello = wait_for_line(plain.store.proc_dir("agent") / "stdout.log")
        with H.daemon_for([args.user], "gpucr-bench-daemon-") as daemon:
            store = Path(user.pw_dir) / "gpucr-bench-store"
            H.as_user(args.user, f"""
import json, sys
from jupyter_gpucr.daemon.client import DaemonCheckpointer
cr = DaemonCheckpointer({str(store)!r}, {str(daemon.socket)!r})
cr.run("agent", [sys.executable, {AGENT!r}, "{args.mb}"], cwd={user.pw_dir!r},
       env={{"AGENT_FILE": {user.pw_dir + '/agent.txt'!r}, "PATH": {H.CLEAN_PATH!r}}})
print("{{}}")
""")
            owned = wait_for_line(daemon.user_store(user.pw_uid) / "procs" / "agent" / "stdout.log")
            for _ in range(args.rounds):
                plain.checkpoint("agent")
                times["root's CRIU, root's process"].append(plain.restore("agent").timings["total"])
                assert ask(hello["port"])["checksum"] == hello["checksum"]
                got = H.as_user(args.user, f"""
import json, time
from jupyter_gpucr.daemon.client import DaemonClient
c = DaemonClient({str(daemon.socket)!r})
c.call("checkpoint", name="agent")
t0 = time.perf_counter()
out = c.call("restore", name="agent")
print(json.dumps({{"client": time.perf_counter() - t0, "daemon": out["timings"]["total"]}}))
""", timeout=300)
                times["daemon, owner's CRIU (client)"].append(got["client"])
                times["daemon, owner's CRIU (daemon)"].append(got["daemon"])
                assert ask(owned["port"])["checksum"] == owned["checksum"]
        plain.remove("agent", kill=True)
        figures = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "mb": args.mb, "rounds": args.rounds, **{f"restore, {k} (median s)": statistics.median(v)
                                                            for k, v in times.items()}}
        for k, v in figures.items():
            print(f"{k:52} {v:.3f}" if isinstance(v, float) else f"{k:52} {v}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({**figures, "raw": times}, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
