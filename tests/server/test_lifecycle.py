"""The kernel state machine on its own: allowed and refused transitions, and every
change reaching jupyter_server's event bus as a valid event. The real-server tests drive the
same machine through suspends and restores."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from jupyter_events import EventLogger

from jupyter_gpucr.core.errors import StateError
from jupyter_gpucr.server.lifecycle import (
    EVENT_SCHEMA_ID,
    PENDING,
    RESTORING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    UPLOADING,
    WAITING,
    KernelLifecycle,
    KernelState,
    state_schema,
)


@pytest.fixture
def recorded():
    events: list[dict] = []
    logger = EventLogger()

    async def listener(logger, schema_id, data):
        events.append(dict(data))

    lifecycle = KernelLifecycle(event_logger=logger)
    logger.add_listener(schema_id=EVENT_SCHEMA_ID, listener=listener)
    return lifecycle, events


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_full_round_trip_emits_each_state(recorded):
    lifecycle, events = recorded
    assert lifecycle.get("k").state == RUNNING
    lifecycle.transition("k", PENDING, "pending", pending_since=1.0)
    lifecycle.transition("k", SUSPENDING, "trimming")
    assert lifecycle.get("k").pending_since is None
    lifecycle.transition("k", SUSPENDED, "done", suspended_at=2.0)
    assert lifecycle.is_on_disk("k")
    lifecycle.transition("k", RESTORING, "restoring")
    assert lifecycle.is_on_disk("k")
    st = lifecycle.transition("k", RUNNING, "done", restored_at=5.0, suspended_for=3.0)
    assert st.suspended_at is None and st.restored_at == 5.0
    await settle()
    assert [(e["state"], e["phase"]) for e in events] == [
        (PENDING, "pending"), (SUSPENDING, "trimming"), (SUSPENDED, "done"), (RESTORING, "restoring"), (RUNNING, "done")]
    assert events[-1]["suspended_for"] == 3.0


@pytest.mark.parametrize(("start", "to"), [(RUNNING, SUSPENDED), (RUNNING, RESTORING), (SUSPENDED, SUSPENDING),
                                           (SUSPENDED, RUNNING), (SUSPENDING, RESTORING), (PENDING, SUSPENDED)])
async def test_refused_transitions_leave_the_state(recorded, start, to):
    lifecycle, _events = recorded
    path = {RUNNING: [], PENDING: [PENDING], SUSPENDING: [SUSPENDING], SUSPENDED: [SUSPENDING, SUSPENDED]}[start]
    for step in path:
        lifecycle.transition("k", step, "done")
    with pytest.raises(StateError) as err:
        lifecycle.transition("k", to, "done")
    assert f"it cannot become {to} now" in err.value.message
    assert lifecycle.state_of("k") == start


async def test_failure_edges_keep_the_kernel_or_the_checkpoint(recorded):
    lifecycle, events = recorded
    lifecycle.transition("k", SUSPENDING, "trimming")
    st = lifecycle.transition("k", RUNNING, "failed", error="disk full", hint="free disk")
    assert (st.state, st.error, st.hint) == (RUNNING, "disk full", "free disk")
    lifecycle.transition("k", SUSPENDING, "trimming", error=None, hint=None)
    lifecycle.transition("k", SUSPENDED, "done")
    lifecycle.transition("k", RESTORING, "restoring")
    assert lifecycle.transition("k", SUSPENDED, "failed", error="damaged").state == SUSPENDED
    await settle()
    assert [e["error"] for e in events if e["phase"] == "failed"] == ["disk full", "damaged"]


async def test_a_restore_that_waits_for_room_says_where_and_its_victim_says_for_whom(recorded):
    lifecycle, events = recorded
    for kid in ("k", "old"):
        lifecycle.transition(kid, SUSPENDING, "trimming")
        lifecycle.transition(kid, SUSPENDED, "done")
    lifecycle.transition("old", RESTORING, "restoring")
    lifecycle.transition("old", RUNNING, "done")
    lifecycle.transition("k", RESTORING, "restoring")
    room = {"where": "on GPU 0", "need": 1, "suspending": ["old"], "message": "waiting for room on GPU 0: suspending 1 idle kernel"}
    assert lifecycle.transition("k", WAITING, "waiting-for-room", room=room).room == room
    assert lifecycle.is_on_disk("k")
    lifecycle.transition("old", SUSPENDING, "trimming")
    lifecycle.transition("old", SUSPENDED, "done", made_room_for="k")
    lifecycle.transition("k", RESTORING, "restoring", room=None)
    lifecycle.transition("k", RUNNING, "done")
    await settle()
    assert [e["room"] for e in events if e["kernel_id"] == "k" and e["state"] == WAITING] == [room]
    assert [e["made_room_for"] for e in events if e["kernel_id"] == "old"][-1] == "k"
    lifecycle.transition("old", RESTORING, "restoring")
    assert lifecycle.transition("old", RUNNING, "done").made_room_for is None
    lifecycle.transition("k", SUSPENDING, "trimming")
    lifecycle.transition("k", SUSPENDED, "done")
    lifecycle.transition("k", RESTORING, "restoring")
    lifecycle.transition("k", WAITING, "waiting-for-room", room=room)
    assert lifecycle.transition("k", SUSPENDED, "failed", error="no room", room=None).state == SUSPENDED


async def test_an_event_carries_the_whole_state_as_it_was_then(recorded):
    lifecycle, events = recorded
    summary = {"id": "k-1", "size": 1 << 20, "created": 2.0, "engine": "criu", "gpu_model": None, "gpus": []}
    lifecycle.transition("k", SUSPENDING, "trimming", engine="criu", engine_reason="provisioner")
    lifecycle.progress("k", "dumping", 512, 1024)
    st = lifecycle.transition("k", SUSPENDED, "done", suspended_at=2.0, checkpoint=summary, kind="cpu",
                              timings={"total": 0.8})
    then = st.to_dict()
    st.checkpoint["size"] = 0  # a later change of the state is not in the event already emitted
    await settle()
    every = set(state_schema()["properties"]) | {"phase", "bytes_done", "bytes_total"}
    assert all(set(e) == every for e in events)
    assert (events[1]["phase"], events[1]["bytes_done"], events[1]["bytes_total"]) == ("dumping", 512, 1024)
    assert events[1]["progress"] == {"phase": "dumping", "bytes_done": 512, "bytes_total": 1024}
    last = events[-1]
    assert {name: last[name] for name in then} == then
    assert (last["engine"], last["checkpoint"]["size"], last["timings"]) == ("criu", 1 << 20, {"total": 0.8})


async def test_the_event_of_a_large_state_stays_small(recorded):
    """Progress events go out every half second while a suspend writes: the whole state in each
    stays under 8 KiB even for a GPU kernel on eight GPUs that lost variables and failed."""
    lifecycle, events = recorded
    gpus = [{"index": i, "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "name": "NVIDIA H200",
             "memory_used": 80 << 30} for i in range(8)]
    summary = {"id": "k-20250101-000000-abcdef", "name": "k", "size": 80 << 30, "created": 2.0, "engine": "snapshot",
               "reason": "manual", "gpu_model": "NVIDIA H200", "gpus": gpus, "kernel_id": "k",
               "notebook_path": "projects/some/deep/folder/training-run-with-a-long-name.ipynb",
               "path": "/home/user/.local/share/gpucr/checkpoints/k-20250101-000000-abcdef"}
    lost = [{"name": f"variable_{i}", "type": "generator", "reason": "cannot pickle 'generator' object"}
            for i in range(20)]
    timings = {f"step_{i}": 1.234567 for i in range(30)}
    lifecycle.transition("k", SUSPENDING, "trimming", engine="snapshot", engine_reason="x" * 200,
                         gpu=gpus[0], kind="gpu", trim={"live": 1 << 30, "reserved": 2 << 30})
    lifecycle.transition("k", SUSPENDED, "done", checkpoint=summary, suspended_at=2.0, timings=timings,
                         lost=lost, warnings=["w" * 200] * 3)
    lifecycle.transition("k", RESTORING, "restoring")
    lifecycle.transition("k", SUSPENDED, "failed", error="e" * 500, hint="h" * 300, summary="s" * 100,
                         retryable=True)
    await settle()
    assert max(len(json.dumps(e)) for e in events) < 8 * 1024  # 6.1 KB when written


def test_unknown_fields_are_a_programming_error(recorded):
    lifecycle, _ = recorded
    with pytest.raises(TypeError):
        lifecycle.transition("k", PENDING, "pending", pendingsince=1.0)


def test_the_state_matches_its_schema():
    assert set(KernelState("k").to_dict()) == set(state_schema()["properties"])
    assert state_schema()["properties"]["state"]["enum"] == [RUNNING, PENDING, SUSPENDING, SUSPENDED, RESTORING, WAITING, UPLOADING]


def test_the_rest_docs_describe_every_property():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "rest-api.md").read_text()
    missing = [name for name in state_schema()["properties"] if f"`{name}`" not in doc]
    assert missing == []
