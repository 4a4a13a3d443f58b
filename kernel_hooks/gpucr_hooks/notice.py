"""Tell the user, once, that their kernel came back from disk and what it lost.

Output of the server's own (silent) requests never reaches the notebook, so the notice waits
for the user's next cell and is printed at the top of that cell's output.
"""

from __future__ import annotations

import time
from typing import Any

_pending: str | None = None


def format_duration(seconds: float) -> str:
    """Human duration at the precision people care about: "42 s", "12 min", "3 h 12 min", "2 d 4 h"."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 3600:
        return f"{minutes} min"
    if s < 86400:
        rest = minutes % 60
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    rest = hours % 24
    return f"{days} d {rest} h" if rest else f"{days} d"


def restore_message(info: dict[str, Any], now: float | None = None) -> str:
    """One line such as "gpucr: restored from disk after 3 h 12 min, onto GPU 1 (NVIDIA H200)"."""
    source = "a snapshot" if info.get("engine") == "snapshot" else "disk"
    text = f"gpucr: restored from {source}"
    suspended_at = info.get("suspended_at")
    if suspended_at is not None:
        elapsed = (time.time() if now is None else now) - float(suspended_at)
        text += f" after {format_duration(elapsed)}"
    gpu = info.get("gpu")
    if gpu:
        text += f", onto GPU {gpu.get('index', '?')}"
        if gpu.get("name"):
            text += f" ({gpu['name']})"
    lost = [_describe_lost(item) for item in info.get("lost") or []]
    if lost:
        text += f"; not kept: {', '.join(lost)}"
    return text


def _describe_lost(item: Any) -> str:
    if isinstance(item, dict):
        kind = f" ({item['type']})" if item.get("type") else ""
        return f"{item.get('name', '?')}{kind}"
    return str(item)


def after_restore(info: dict[str, Any]) -> None:
    """Queue the restore notice for the next cell; replaces an earlier notice not yet shown."""
    global _pending
    _pending = restore_message(info)
    from IPython import get_ipython

    ip = get_ipython()
    if ip is None:
        show_pending()
    else:
        ip.extension_manager.load_extension(__package__)


def show_pending(*_info: Any) -> None:
    """``pre_run_cell`` callback: print the queued notice into the running cell, then forget it."""
    global _pending
    if _pending is not None:
        text, _pending = _pending, None
        print(text, flush=True)
