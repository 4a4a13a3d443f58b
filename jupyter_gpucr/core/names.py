"""Validation of user-given names: they become directory names in the store."""
from __future__ import annotations

import re

from .errors import InvalidNameError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it is safe as one path component, else raise with the rule."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidNameError(
            f"Invalid {what} {name!r}.",
            "Use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            "with no '/' and no '..'.",
        )
    return name
