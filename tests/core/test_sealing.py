"""The encryption key file as an operator makes it (raw, hex or base64; the user's own, closed to
others), refused with the file and the fix named otherwise."""
from __future__ import annotations

import base64
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpucr.core.objectstore.sealing import EncryptionKeyError, load_key


def test_a_key_made_as_the_docs_say_loads_in_each_format(tmp_path: Path) -> None:
    raw = tmp_path / "raw.key"
    subprocess.run(f"umask 077; head -c 32 /dev/urandom > {raw}", shell=True, check=True)
    secret = raw.read_bytes()
    ids = {load_key(raw).id}
    for name, text in [("hex.key", secret.hex() + "\n"), ("b64.key", base64.b64encode(secret).decode() + "\n"),
                       ("url.key", base64.urlsafe_b64encode(secret).decode())]:
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o400)
        ids.add(load_key(tmp_path / name).id)
    assert len(ids) == 1


def test_a_key_file_open_to_others_not_the_users_or_no_key_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "gpucr.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    with pytest.raises(EncryptionKeyError) as refused:
        load_key(key)
    assert f"{key} is open to other users (mode 0644)" in refused.value.message and refused.value.hint == f"chmod 600 {key}"

    key.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(key, pwd.getpwnam("nobody").pw_uid, -1)
        with pytest.raises(EncryptionKeyError, match=f"{key} belongs to uid"):
            load_key(key)
        os.chown(key, 0, -1)

    key.write_text("not a key\n")
    with pytest.raises(EncryptionKeyError, match="does not hold a 256-bit key") as refused:
        load_key(key)
    assert "head -c 32 /dev/urandom" in refused.value.hint
    with pytest.raises(EncryptionKeyError, match=f"{tmp_path / 'missing.key'} cannot be read"):
        load_key(tmp_path / "missing.key")


def test_a_previous_key_file_is_checked_as_the_current_one(tmp_path: Path) -> None:
    """``gpucr --previous-encryption-key-file`` with a file open to others stops before anything is done."""
    current, previous = tmp_path / "current.key", tmp_path / "previous.key"
    for path, mode in ((current, 0o600), (previous, 0o644)):
        path.write_bytes(os.urandom(32))
        path.chmod(mode)
    refused = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", "s3://bucket/kernels",
                              "--encryption-key-file", str(current), "--previous-encryption-key-file", str(previous),
                              "ls"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert f"{previous} is open to other users (mode 0644)" in refused.stderr and f"chmod 600 {previous}" in refused.stderr
