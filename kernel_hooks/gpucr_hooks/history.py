"""Point IPython's history database at its new path after the kernel was restored elsewhere.

A kernel restored on another node, or a fork, gets its history database as a file at a new
path (CRIU hands it the open file). SQLite keeps the path it opened and refuses to write when
that path no longer names the same file ("attempt to write a readonly database"), and IPython's
history thread then stops saving for good. Reconnecting both connections at the new path keeps
the session number and every line saved so far (the file is a copy of the old one).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def reopen_history(path: str, again: bool = False) -> dict[str, Any]:
    """Reconnect the shell's history manager and its saving thread to ``path``; ``again``: also
    when it is the path it has open (the file there was replaced by a copy: SQLite would take it
    for a moved database and refuse to write)."""
    from IPython import get_ipython
    from IPython.core.history import HistorySavingThread

    shell = get_ipython()
    manager = getattr(shell, "history_manager", None)
    if manager is None or not manager.enabled or str(manager.hist_file) == ":memory:" or \
            (str(manager.hist_file) == path and not again):
        return {"reopened": False}
    thread = manager.save_thread
    if thread is not None:
        thread.stop()  # joins; it closes its own connection as it ends
    manager.db.close()
    manager.hist_file = Path(path)
    manager.init_db()
    if thread is not None:
        manager.save_thread = HistorySavingThread(manager)
        manager.save_thread.start()
    return {"reopened": True, "session": manager.session_number}
