"""``gpucr install-criu``: CRIU 4.2+ for a pip user, by the same script the repository's setup uses.

The wheel ships scripts/install-criu.sh as package data (an editable install runs the repository's
copy). It builds a self-contained bundle from the Debian mirror in this machine's own apt
configuration and installs it as PREFIX/bin/criu, where gpucr looks for it (beside the Python).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ..core.errors import PreconditionError

SCRIPT = "install-criu.sh"


def script_path() -> Path:
    for cand in (Path(__file__).with_name(SCRIPT), Path(__file__).resolve().parents[2] / "scripts" / SCRIPT):
        if cand.is_file():
            return cand
    raise PreconditionError(f"{SCRIPT} is missing from this installation.", "Reinstall jupyter-gpucr.")


def default_prefix() -> Path:
    """This Python's prefix when it can be written (a venv, or root), else the user's base (~/.local)."""
    prefix = Path(sys.prefix)
    if os.access(prefix, os.W_OK) and os.access(prefix / "bin", os.W_OK):
        return prefix
    return Path(sysconfig.get_config_var("userbase") or Path.home() / ".local")


def install(prefix: str | None = None, force: bool = False) -> tuple[dict[str, Any], str]:
    bash = shutil.which("bash")
    if not bash:
        raise PreconditionError("bash is needed to install CRIU.", "Install bash.")
    target = Path(prefix) if prefix else default_prefix()
    argv = [bash, str(script_path()), *(["--force"] if force else []), str(target)]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise PreconditionError(f"Installing CRIU into {target} failed:\n{proc.stdout.strip()}",
                                "Read the message above; the script's --help explains the options.")
    criu = target / "bin" / "criu"
    return {"prefix": str(target), "criu": str(criu)}, f"{proc.stdout.strip()}\nCRIU is at {criu}."
