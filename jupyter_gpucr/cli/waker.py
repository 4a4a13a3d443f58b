"""``python -m jupyter_gpucr.cli.waker --store DIR NAME``: the waker of one name (see
:mod:`jupyter_gpucr.core.pausing.waker`), with the backend its start asked for: the gpucr daemon's
when ``start_waker`` was given its socket, else a checkpointer in this process. The choice lives
here, above the core, because the daemon's client is not the core's to import."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..core.backend import CheckpointBackend
from ..core.checkpointer import Checkpointer
from ..core.jsonfile import read_json
from ..core.pausing.activation import WakeOn
from ..core.pausing.waker import WAKER_FILE, Waker
from ..core.storage.store import Store
from ..daemon.client import DaemonCheckpointer


def _backend(store: Path, status: dict[str, Any]) -> CheckpointBackend:
    if status.get("daemon"):
        return DaemonCheckpointer(store, status["daemon"])
    return Checkpointer(store, criu_path=status.get("criu"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpucr-waker")
    p.add_argument("--store", required=True)
    p.add_argument("name")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = Store(args.store)
    status = read_json(store.proc_dir(args.name) / WAKER_FILE) or {}
    waker = Waker(_backend(store.root, status), args.name, [WakeOn.parse(w) for w in status.get("wake_on", [])],
                  float(status.get("idle_timeout", 300)))
    waker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
