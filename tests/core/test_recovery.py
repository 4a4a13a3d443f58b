"""Nothing lost under faults: the process running a checkpoint or a restore is killed with
SIGKILL at points spread over the whole operation, then recovery runs. Every time, the agent
must either run and answer with its intact state, or be suspended in a complete checkpoint
that restores with its intact state; and no temporary directory may be left."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.criu.commands import dump_id, network_lock_tables
from tests.conftest import ask
from tests.core.test_core import gpucr, start_agent

pytestmark = pytest.mark.timeout(240)
KILLS_PER_OPERATION = 10
NAME = "victim"


def run_killed(store: Path, args: list[str], delay: float) -> int | None:
    """Run a gpucr command and SIGKILL it after ``delay`` s; its exit code if it ended first."""
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def timed(store: Path, *args: str) -> float:
    t0 = time.perf_counter()
    gpucr(store, *args)
    return time.perf_counter() - t0


def spread(duration: float) -> list[float]:
    """Kill points from 0 to 30 % past the measured end of the operation."""
    return [i * duration * 1.3 / (KILLS_PER_OPERATION - 1) for i in range(KILLS_PER_OPERATION)]


def settle(cr: Checkpointer, hello: dict, seen: list[str], dumps: set[str]) -> str:
    """Recover, check the promise, and return the outcome; the agent is left as recovery left it."""
    outcome = cr.recover_all()[NAME]
    seen.append(outcome.message)
    dumps.update(dump_id(c.images) for c in cr.store.list_checkpoints(NAME))
    assert not list(cr.store.checkpoints_root.glob(".tmp-*")), f"a temporary checkpoint was left: {outcome}"
    assert outcome.outcome in ("running", "suspended"), f"lost: {outcome.message}"
    status = cr.status(NAME)
    if outcome.outcome == "running":
        assert status["state"] == "running" and status["pid"] == outcome.pid, status
        assert ask(hello["port"])["checksum"] == hello["checksum"], "the running agent lost its state"
    else:
        assert status["state"] == "checkpointed" and status["latest"]["id"] == outcome.checkpoint_id, status
        cr.store.get(outcome.checkpoint_id).verify("images")
    assert cr.recover_all()[NAME].outcome == outcome.outcome, "recovery must be idempotent"
    return outcome.outcome


def ensure_running(cr: Checkpointer, hello: dict) -> None:
    if cr.status(NAME)["state"] != "running":
        cr.restore(NAME)
    assert ask(hello["port"])["checksum"] == hello["checksum"], "the checkpoint did not restore the intact state"


def ensure_suspended(cr: Checkpointer) -> None:
    if cr.status(NAME)["state"] == "running":
        cr.checkpoint(NAME)


@pytest.fixture
def agent(criu_path, store_dir, tmp_path):
    hello, _ = start_agent(store_dir, NAME, tmp_path, mb=120)
    yield hello
    Checkpointer(store_dir).remove(NAME, kill=True)


# Lazy: CRIU's daemon streams the memory in behind the running agent. Eager: gpucr's page daemon
# copies it in while the agent is stopped (a kill can leave it stopped, or mid-copy).
@pytest.mark.parametrize("restore_args", [[], ["--eager"]], ids=["lazy", "eager"])
def test_kill_during_checkpoint_and_restore_loses_nothing(agent, store_dir, capsys, restore_args):
    cr = Checkpointer(store_dir)
    checkpoint_s = timed(store_dir, "checkpoint", NAME)
    restore_s = timed(store_dir, "restore", NAME, *restore_args)
    counts: dict[str, collections.Counter] = {"checkpoint": collections.Counter(), "restore": collections.Counter()}
    seen: list[str] = []
    dumps: set[str] = set()
    for delay in spread(checkpoint_s):
        ensure_running(cr, agent)
        run_killed(store_dir, ["checkpoint", NAME], delay)
        counts["checkpoint"][settle(cr, agent, seen, dumps)] += 1
    for delay in spread(restore_s):
        ensure_suspended(cr)
        run_killed(store_dir, ["restore", NAME, *restore_args], delay)
        counts["restore"][settle(cr, agent, seen, dumps)] += 1
    ensure_running(cr, agent)
    left = [t for t in network_lock_tables() if any(d.startswith(t.removeprefix("CRIU-")) for d in dumps)]
    assert not left, f"network locks of this agent's dumps were left behind: {left}"
    with capsys.disabled():
        for op, seconds in (("checkpoint", checkpoint_s), ("restore", restore_s)):
            c = counts[op]
            print(f"\nkill -9 during {op} ({seconds:.2f} s, {KILLS_PER_OPERATION} kill points): "
                  f"running {c['running']}, suspended {c['suspended']}, lost {c['lost']}")
        print("what recovery did:", *(f"  {m}" for m in seen), sep="\n")
    assert sum(counts["checkpoint"].values()) == sum(counts["restore"].values()) == KILLS_PER_OPERATION
    # The kill points cover both ends of each operation: before it acts and after it is done.
    assert counts["checkpoint"]["running"] and counts["checkpoint"]["suspended"]
    assert counts["restore"]["running"] and counts["restore"]["suspended"]


def test_record_running_but_process_gone_becomes_suspended(agent, store_dir):
    """A checkpoint committed whose writer died before it updated the record."""
    cr = Checkpointer(store_dir)
    rec = cr.store.read_proc(NAME)
    ckpt = cr.checkpoint(NAME)
    cr.store.write_proc(NAME, rec)  # the record as it was before the checkpoint: running, old PID
    outcome = cr.recover(NAME)
    assert (outcome.outcome, outcome.checkpoint_id) == ("suspended", ckpt.id), outcome
    ensure_running(cr, agent)


def test_new_restore_recovers_an_interrupted_one_first(agent, store_dir):
    """A restore killed after CRIU brought the process back must not lead to a second copy."""
    cr = Checkpointer(store_dir)
    cr.checkpoint(NAME)
    rec = cr.store.read_proc(NAME)
    running = cr.restore(NAME)
    cr.store.write_proc(NAME, {**rec, "restoring": {"checkpoint": rec["checkpoint"], "ns_pid": running.ns_pid,
                                                    "gpu_map": {}, "since": time.time(), "by": 0}})
    with pytest.raises(Exception, match="already running"):
        cr.restore(NAME)
    assert cr.status(NAME)["pid"] == running.pid
    assert ask(agent["port"])["checksum"] == agent["checksum"]


@pytest.mark.parametrize("cpuinfo", [b"", b"half", None], ids=["empty", "partial", "absent"])
def test_a_dump_finished_before_the_kill_is_committed_without_a_broken_cpu_record(agent, store_dir, cpuinfo):
    """Killed after CRIU finished but while the node's CPU record was being kept: recovery commits
    the dump without a broken record, and it restores (on this boot no CPU check is needed)."""
    from jupyter_gpucr.core.criu import nodecompat
    from jupyter_gpucr.core.storage.store import MANIFEST

    cr = Checkpointer(store_dir)
    ckpt = cr.checkpoint(NAME)
    rec = cr.store.read_proc(NAME)
    tmp = ckpt.path.with_name(f".tmp-{ckpt.id}")
    ckpt.path.rename(tmp)  # as it was before the commit: images written, no manifest
    (tmp / MANIFEST).unlink()
    image = tmp / nodecompat.CPUINFO
    if cpuinfo is None:
        image.unlink()
    else:
        image.with_suffix(".partial").write_bytes(image.read_bytes())
        image.write_bytes(image.read_bytes()[: len(cpuinfo)])
    cr.store.write_proc(NAME, {**rec, "state": "running", "checkpoint": None})
    outcome = cr.recover(NAME)
    assert (outcome.outcome, outcome.checkpoint_id) == ("suspended", ckpt.id), outcome
    recovered = cr.store.get(ckpt.id)
    assert not (recovered.path / "host").exists() or list((recovered.path / "host").iterdir()) == []
    assert recovered.manifest["host"]["boot_id"] == nodecompat.boot_id()
    ensure_running(cr, agent)
