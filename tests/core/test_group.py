"""Sessions of several processes with a real CRIU: three processes started one by one with
``gpucr run --group``, talking over a localhost TCP connection and two named pipes, are paused
together when idle and woken together by a request to the front one, connections and state kept."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from tests.conftest import gone, wait_for_line
from tests.core.test_activation import curl, free_port, gpucr, status, wait_for

AGENT = str(Path(__file__).with_name("session_agent.py"))


def members(store: Path, group: str) -> dict[str, dict]:
    return {m["name"]: m for m in status(store, group)["members"]}


def test_a_session_of_three_is_paused_and_woken_as_one_with_its_connections(criu_path, store_dir, tmp_path):
    requests, answers = tmp_path / "requests", tmp_path / "answers"
    os.mkfifo(requests)
    os.mkfifo(answers)
    port, middle_port = free_port(), free_port()
    logs = store_dir / "procs" / "sess" / "members"
    try:
        gpucr(store_dir, "run", "--group", "sess", "--name", "back", "--", sys.executable, AGENT, "back",
              str(requests), str(answers))
        back = wait_for_line(logs / "back.stdout.log")
        gpucr(store_dir, "run", "--group", "sess", "--name", "middle", "--", sys.executable, AGENT, "middle",
              str(middle_port), str(requests), str(answers))
        said = gpucr(store_dir, "run", "--group", "sess", "--name", "front", "--idle-timeout", "1.5", "--wake-on",
                     f"tcp:127.0.0.1:{port}", "--", sys.executable, AGENT, "front", str(port), str(middle_port)).stdout
        assert "Started 'front' in the session 'sess'" in said and "the session pauses after 1.5 s idle" in said, said
        wait_for_line(logs / "front.stdout.log")

        first, _ = curl(port)
        assert first == {"front": 1, "middle": 1, "back": 1, "checksum": back["checksum"]}, first
        before = members(store_dir, "sess")
        assert [m["state"] for m in before.values()] == ["running"] * 3, before
        listed = gpucr(store_dir, "ls").stdout
        assert all(f"member {name}" in listed for name in ("back", "middle", "front")), listed

        wait_for(lambda: status(store_dir, "sess")["state"] == "checkpointed", 60)
        assert all(gone(m["pid"]) for m in before.values())  # all three paused, their memory free
        listed = gpucr(store_dir, "ls").stdout
        assert f"checkpointed (idle, wakes on tcp:127.0.0.1:{port})" in listed, listed
        assert [m["state"] for m in members(store_dir, "sess").values()] == ["checkpointed"] * 3
        refused = gpucr(store_dir, "run", "--group", "sess", "--name", "late", "--", "true", check=False)
        assert refused.returncode == 1 and "The session 'sess' is checkpointed" in refused.stderr, refused

        woken, took = curl(port)  # crosses all three: the TCP connection and the pipes came back with them
        assert woken == {"front": 2, "middle": 2, "back": 2, "checksum": back["checksum"]}, woken
        after = members(store_dir, "sess")
        assert [m["state"] for m in after.values()] == ["running"] * 3, after
        assert {n: m["ns_pid"] for n, m in after.items()} == {n: m["ns_pid"] for n, m in before.items()}
        print(f"first byte after the session's wake: {took:.2f} s")

        os.kill(status(store_dir, "sess")["pid"], signal.SIGTERM)  # to the leader: passed on to every member
        wait_for(lambda: status(store_dir, "sess")["state"] == "exited", 30)
        assert [m["state"] for m in members(store_dir, "sess").values()] == ["exited (-15)"] * 3
    finally:
        waker = json.loads((store_dir / "procs" / "sess" / "waker.json").read_text()).get("pid") \
            if (store_dir / "procs" / "sess" / "waker.json").exists() else None
        gpucr(store_dir, "rm", "--kill", "sess", check=False)
        if waker and not gone(waker):
            os.kill(waker, signal.SIGKILL)
