"""Validation of user-given names: they become directory names in the store."""
from __future__ import annotations

import re

from ..errors import InvalidNameError

# ASCII only, matched in full: '$' would also accept a trailing newline, and \w or str.isdigit
# accept letters and digits of any script.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)


def validate_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it is safe as one path component, else raise with the rule."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(
            f"Invalid {what} {name!r}.",
            "Use 1-128 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit, "
            "with no '/', no '..' and no spaces or line breaks.",
        )
    return name
