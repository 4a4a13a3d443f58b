"""The per-process lock says "busy" for an operation that runs, never for one that has ended but
whose lock a child, forked at that moment by another thread, still shares (as a server's
recovery and the suspend that follows it met under load: "busy: recovery is in progress")."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from jupyter_gpucr.core.errors import BusyError
from jupyter_gpucr.core.storage.locks import exclusive


def _fork_holding_for(seconds: float) -> int:
    """A child that shares every open file of this process, the lock's included, for ``seconds``."""
    pid = os.fork()
    if pid == 0:
        time.sleep(seconds)
        os._exit(0)
    return pid


def test_a_lock_an_ended_operation_left_to_a_forked_child_is_waited_for(tmp_path):
    with exclusive(tmp_path, "k", "recovery"):
        child = _fork_holding_for(0.5)
    started = time.monotonic()
    with exclusive(tmp_path, "k", "checkpoint"):
        waited = time.monotonic() - started
        assert (tmp_path / ".lock").read_text().startswith("checkpoint (pid ")
    os.waitpid(child, 0)
    assert 0.2 < waited < 5, waited
    assert (tmp_path / ".lock").read_text() == ""  # let go: nothing is in progress


@pytest.mark.parametrize("wait_s", [0.0, 0.5])
def test_an_operation_in_progress_is_busy_and_named(tmp_path, wait_s):
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with exclusive(tmp_path, "k", "restore"):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        started = time.monotonic()
        with pytest.raises(BusyError, match=r"'k' is busy: restore \(pid \d+\) is in progress"):
            with exclusive(tmp_path, "k", "checkpoint", wait_s=wait_s):
                pass
        assert wait_s <= time.monotonic() - started < wait_s + 2
    finally:
        done.set()
        holder.join()


def test_a_lock_a_killed_holder_left_to_the_child_it_was_starting_is_waited_for(tmp_path):
    """``kill -9`` of a gpucr command while it starts a child: the file still names the command,
    the child holds the lock until it execs; what runs next waits for it instead of saying busy."""
    ready_r, ready_w = os.pipe()
    holder = os.fork()
    if holder == 0:
        os.close(ready_r)
        with exclusive(tmp_path, "k", "checkpoint"):
            _fork_holding_for(0.5)
            os.write(ready_w, b"x")
            time.sleep(60)
        os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
    assert (tmp_path / ".lock").read_text() == f"checkpoint (pid {holder})"  # as the killed command left it
    started = time.monotonic()
    with exclusive(tmp_path, "k", "recovery"):
        waited = time.monotonic() - started
    assert 0.2 < waited < 5, waited
