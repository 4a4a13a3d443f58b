"""What the daemon's checks of a restore cost: the same process of an ordinary user restored from the
same checkpoint with and without them (the image read and its files probed as the owner before
CRIU; CRIU's post-restore action script after), rounds alternating.

    python bench/bench_daemon_checks.py --user NAME [--mb 300] [--rounds 5] [--json-out FILE]

Needs root, CRIU and an ordinary user NAME (created if missing) who can run this Python.
Prints a table and the same figures as JSON.
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
from jupyter_gpucr.core.store import Store  # noqa: E402
from jupyter_gpucr.daemon.guard import Owner, RestoreGuard  # noqa: E402
from jupyter_gpucr.daemon.server import _criu_wrapper  # noqa: E402
from tests import hub as H  # noqa: E402
from tests.conftest import AGENTS, ask, wait_for_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", default="gpucr-bench")
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    owner = Owner.of(H.ensure_user(args.user).pw_uid)
    opened = H.open_path_for_users([Path(sys.executable).resolve(), H.REPO])
    root = Path(tempfile.mkdtemp(prefix="gpucr-bench-checks-"))
    try:
        store = Store(root / "store")
        criu = _criu_wrapper(root, None)  # the daemon's CRIU: it dumps another uid's process where root cannot
        plain = Checkpointer(store, criu_path=criu)
        checked = Checkpointer(store, criu_path=criu, restore_check=RestoreGuard(owner, store.root))
        os.environ["AGENT_FILE"] = f"/tmp/gpucr-bench-checks-{owner.uid}"
        plain.run("agent", ["setpriv", f"--reuid={owner.uid}", f"--regid={owner.gid}", "--init-groups", "--",
                            sys.executable, str(AGENTS / "cpu_agent.py"), str(args.mb)], cwd="/")
        hello = wait_for_line(store.proc_dir("agent") / "stdout.log")
        times: dict[str, list[float]] = {"without checks": [], "with checks": []}
        approve: list[float] = []
        for i in range(args.rounds * 2):
            cr, label = (plain, "without checks") if i % 2 == 0 else (checked, "with checks")
            cr.checkpoint("agent")
            if cr is checked:
                t0 = time.perf_counter()
                RestoreGuard(owner, store.root).approved(store.latest("agent").images)
                approve.append(time.perf_counter() - t0)
            running = cr.restore("agent")
            times[label].append(running.timings["total"])
            assert ask(hello["port"])["checksum"] == hello["checksum"]
        plain.remove("agent", kill=True)
        figures = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "mb": args.mb, "rounds": args.rounds,
                   **{f"restore {k} (median s)": statistics.median(v) for k, v in times.items()},
                   "owner's file check alone (median s)": statistics.median(approve)}
        for k, v in figures.items():
            print(f"{k:40} {v:.3f}" if isinstance(v, float) else f"{k:40} {v}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({**figures, "raw": times, "approve": approve}, indent=1))
    finally:
        for path, mode in opened.items():
            os.chmod(path, mode)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
