"""Amounts of memory as people write them in configuration: ``"3GiB"``, ``"768 MiB"``, ``2e9``,
or a fraction of a whole (``0.5``: half of the machine's RAM)."""
from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
          "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.I)


def parse_size(value: str | float | int, whole: int | None = None) -> int:
    """Bytes. A bare number up to 1 is a fraction of ``whole`` (when given); ``""`` is 0.
    ValueError says what was wrong, for the configuration's error."""
    if isinstance(value, str):
        if not value.strip():
            return 0
        m = _SIZE.match(value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{value!r} is not an amount of memory: write bytes, '3GiB', '768MiB' or a fraction like 0.5")
        number, unit = float(m.group(1)), m.group(2).lower()
        if unit:
            return int(number * _UNITS[unit])
    else:
        number = float(value)
    if number < 0:
        raise ValueError(f"{value!r}: an amount of memory cannot be negative")
    if 0 < number <= 1 and whole is not None:
        return int(number * whole)
    return int(number)


def human(n: int) -> str:
    """``1.5 GiB``, ``768 MiB``: what a person reads in a message."""
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n >> 20} MiB"
