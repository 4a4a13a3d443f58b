"""A server of an ordinary user without the gpucr daemon (JupyterHub without it): kernels start the
stock way, never a 500, and suspend with the snapshot engine, which says why."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests import hub as H

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(H.missing_requirement() is not None,
                                                             reason=H.missing_requirement() or "")]
USER = "bob"


def test_kernels_start_without_privileges_or_daemon(tmp_path: Path) -> None:
    pw = H.ensure_user(USER)
    opened = H.open_path_for_users([Path(sys.executable).resolve(), H.REPO])
    port, token = H.free_port(), secrets.token_hex(16)
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        ["runuser", "-u", USER, "--", str(H.VENV_BIN / "jupyter-server"), f"--port={port}", "--ip=127.0.0.1", "--no-browser",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={pw.pw_dir}", "--GPUCR.daemon_socket=/nonexistent/gpucr.sock",
         f"--GPUCR.store={pw.pw_dir}/.local/share/gpucr-unprivileged-test"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={"PATH": H.CLEAN_PATH, "HOME": pw.pw_dir, "LANG": "C.UTF-8"})
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"token {token}"}

    try:
        H.wait_answering("the server", proc, log,
                         lambda: requests.get(f"{url}/api/status", headers=headers, timeout=5).status_code == 200)
        r = requests.post(f"{url}/api/kernels", headers=headers, json={"name": "python3"}, timeout=60)
        assert r.status_code == 201, r.text
        kernel_id = r.json()["id"]
        time.sleep(3)  # the kernel is up (201); give it a moment to finish importing
        r = requests.post(f"{url}/api/gpucr/kernels/{kernel_id}/suspend", headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        state = r.json()
        assert state["state"] == "suspended" and state["engine"] == "snapshot"
        # why: no privileges and no daemon (not the configuration, which asks for checkpointable kernels)
        reason = "no checkpoint privileges (not root, no checkpoint capabilities) and no gpucr daemon socket at " \
                 "/nonexistent/gpucr.sock"
        assert state["engine_reason"] == f"whole-process engine unavailable: {reason}", state["engine_reason"]
        warnings = [line for line in log.read_text().splitlines() if line.startswith("[W ")]  # said at start, as a warning
        assert [line for line in warnings if "kernels start the stock way" in line and reason in line], warnings
    finally:
        proc.terminate()
        proc.wait(60)
        for path, mode in opened.items():
            os.chmod(path, mode)
