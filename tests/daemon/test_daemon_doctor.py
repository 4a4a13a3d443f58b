"""`gpucr doctor` run by an ordinary user whose engine is the gpucr daemon (a real one, as root): the
checks of the user's own CRIU and privileges do not apply there; they say so and why, nothing
fails, and the command exits 0."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests import hub as H
from tests.conftest import criu_or_skip

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(H.missing_requirement() is not None,
                                                             reason=H.missing_requirement() or "")]
USER = "crdoctor"


@pytest.fixture
def daemon() -> Iterator[H.Daemon]:
    criu_or_skip()
    with H.daemon_for([USER], "gpucr-daemon-doctor-") as d:
        yield d


def doctor_as_user(daemon: H.Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**H.user_env(USER), "GPUCR_DAEMON_SOCKET": str(daemon.socket)}
    return subprocess.run(["runuser", "-u", USER, "--", sys.executable, "-m", "jupyter_gpucr.cli.main", *args, "doctor"],
                          capture_output=True, text=True, timeout=60, env=env)


def test_doctor_under_the_daemon_fails_nothing_the_daemon_does(daemon):
    out = doctor_as_user(daemon, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    checks = {c["name"]: c for c in rep["checks"]}
    assert checks["engine"]["detail"] == f"whole process through the gpucr daemon at {daemon.socket}", checks["engine"]
    for name in ("criu", "criu check", "privileges"):
        assert checks[name]["severity"] == "ok", checks[name]
        assert checks[name]["detail"] == f"not needed: the gpucr daemon at {daemon.socket} runs CRIU for this user"
    assert rep["ok"] is True and rep["failing"] == 0, [c for c in rep["checks"] if c["severity"] == "fail"]

    text = doctor_as_user(daemon)
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert not [line for line in lines if line.startswith("NO ")], text.stdout
    assert f"OK  privileges               not needed: the gpucr daemon at {daemon.socket} runs CRIU for this user" in lines
