"""The daemon path on a GPU: an unprivileged user's PyTorch process, launched, checkpointed (GPU
memory freed) and restored (same uid, same tensor checksum) through gpucr-daemon. Runs on the GPU
machine (marked gpu; scripts/gpu-run.sh), as root, which starts the daemon and creates the user."""
from __future__ import annotations

import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpucr.core.gpu import cuda, gpus
from jupyter_gpucr.core.storage.store import read_record
from tests import hub as H
from tests.conftest import agent_command, ask, criu_or_skip, wait_for_line

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
USER = "gpucr-gpu"
NAME = "torch-worker"


@pytest.fixture(scope="module")
def daemon() -> Iterator[H.Daemon]:
    if not gpus.list_gpus() or cuda.unavailable_reason():
        pytest.skip(f"needs an NVIDIA GPU with the CUDA checkpoint API: {cuda.unavailable_reason() or 'no GPU'}")
    criu_or_skip()
    with H.daemon_for([USER], 'gpucr-gpu-daemon-') as d:
        yield d


def as_user(daemon: H.Daemon, body: str) -> dict:
    """``body`` runs as the user with ``cr``, a DaemonCheckpointer, and sets ``out``."""
    return H.as_user(USER, f"""
import json
from jupyter_gpucr.daemon.client import DaemonCheckpointer
cr = DaemonCheckpointer("~/.local/share/gpucr-gpu-test".replace("~", __import__("os").path.expanduser("~")), {str(daemon.socket)!r})
out = {{}}
{body}
print(json.dumps(out, default=str))
""", timeout=600)


def test_unprivileged_gpu_process_through_daemon(daemon: H.Daemon) -> None:
    uid = pwd.getpwnam(USER).pw_uid
    command = agent_command("gpu_agent.py", "2")
    as_user(daemon, f"r = cr.run({NAME!r}, {command!r}, env={{**__import__('os').environ, 'CUDA_VISIBLE_DEVICES': '0'}}); "
                    "out['pid'] = r.pid")
    hello = wait_for_line(daemon.user_store(uid) / "procs" / NAME / "stdout.log", timeout=180)
    before = ask(hello["port"])
    pid = read_record(daemon.user_store(uid) / "procs" / NAME)["pid"]
    assert f"Uid:\t{uid}\t" in Path(f"/proc/{pid}/status").read_text()
    assert any(pid in g.processes for g in gpus.list_gpus()), "the worker holds GPU memory"

    ckpt = as_user(daemon, f"c = cr.checkpoint({NAME!r}, reason='gpu-test'); out.update(c.manifest)")
    assert ckpt["engine"] == "criu" and ckpt["owner"]["uid"] == uid
    assert ckpt["gpu"]["used"], "the manifest records the GPU memory it saved"
    assert not any(pid in g.processes for g in gpus.list_gpus()), "after the checkpoint the GPU holds nothing of it"

    restored = as_user(daemon, f"r = cr.restore({NAME!r}); out.update(pid=r.pid, timings=r.timings)")
    assert f"Uid:\t{uid}\t" in Path(f"/proc/{restored['pid']}/status").read_text(), "the restored process keeps its uid"
    after = ask(hello["port"])
    assert after["checksum"] == before["checksum"] and after["counter"] >= before["counter"]
    assert any(restored["pid"] in g.processes for g in gpus.list_gpus())

    as_user(daemon, f"out['removed'] = cr.remove({NAME!r}, kill=True)")
