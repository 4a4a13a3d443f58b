"""The wire between the server-side driver and the hooks.

The driver sends ``run(name, arguments_json)`` as silent code and reads ``reply()`` back as a
user expression. Running the hook as code (not as the expression) means a failure comes back
as a normal execute error with the full traceback; the reply's ``repr`` is plain JSON, so the
driver parses it without trusting IPython's pretty printer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_hooks: dict[str, Callable[..., Any]] = {}
_reply: str = "null"


class JSONText:
    """A value whose text/plain representation in IPython is exactly its JSON text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def register(*functions: Callable[..., Any]) -> None:
    """Make functions callable by name from the server."""
    _hooks.update({f.__name__: f for f in functions})


def run(name: str, arguments: str) -> None:
    """Call hook ``name`` with keyword arguments decoded from JSON and keep its result."""
    global _reply
    _reply = "null"
    result = _hooks[name](**json.loads(arguments))
    _reply = json.dumps(result, separators=(",", ":"))


def reply() -> JSONText:
    """Hand the last result to the driver (once)."""
    global _reply
    text, _reply = _reply, "null"
    return JSONText(text)
