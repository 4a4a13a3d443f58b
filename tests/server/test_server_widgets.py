"""A suspended kernel's ipywidgets, through a real server, a real kernel and real CRIU: what a
page's widget manager asks on every load (JupyterLab's @jupyter-widgets/jupyterlab-manager) is
answered from the state saved at suspend time, so a reload draws the widgets and leaves the kernel
on disk; moving a widget restores the kernel, which sees the new value and answers as it would."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import gone
from tests.kernel_ws import decode, execute, message, send
from tests.server.test_server import fetch_json, jp_server_config, kernel_pid, new_session, open_ws  # noqa: F401

pytestmark = pytest.mark.timeout(240)

WIDGETS = """import ipywidgets as w
slider = w.IntSlider(value=7, description="n")
label = w.Label("seven")
slider.observe(lambda change: setattr(label, "value", f"moved to {change.new}"), "value")
image = w.Image(value=b"\\x89PNG gpucr", format="png")  # its value goes as a binary buffer
display(slider, label, image)
print(slider.model_id, label.model_id, image.model_id)"""


class Page:
    """One websocket as a page's kernel connection: every message read is kept, to check that
    each has a parent and that each request has one busy and one idle, in order."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.heard: list[dict[str, Any]] = []

    async def ask(self, msg_type: str, content: dict[str, Any], timeout: float = 10) -> list[dict[str, Any]]:
        """Send a shell message; what came back for it, up to its idle."""
        msg = message(msg_type, content)
        await send(self.ws, msg)
        answers: list[dict[str, Any]] = []
        async def until_idle() -> None:
            while not answers or answers[-1]["header"]["msg_type"] != "status" or \
                    answers[-1]["content"]["execution_state"] != "idle":
                raw = await self.ws.read_message()
                assert raw is not None, "websocket closed"
                heard = decode(raw)
                self.heard.append(heard)
                if heard["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    answers.append(heard)
        await asyncio.wait_for(until_idle(), timeout)
        statuses = [a["content"]["execution_state"] for a in answers if a["header"]["msg_type"] == "status"]
        assert statuses == ["busy", "idle"] and answers[0]["header"]["msg_type"] == "status", answers
        return answers[1:-1]


def comm_messages(answers: list[dict[str, Any]], comm_id: str) -> list[dict[str, Any]]:
    return [a for a in answers if a["header"]["msg_type"] == "comm_msg" and a["content"]["comm_id"] == comm_id]


def comm_data(answers: list[dict[str, Any]], comm_id: str) -> list[dict[str, Any]]:
    return [m["content"]["data"] for m in comm_messages(answers, comm_id)]


async def test_a_reload_draws_the_widgets_and_a_moved_slider_restores(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "widgets.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    reply, out, _ = await execute(ws, WIDGETS)
    assert reply["content"]["status"] == "ok", out
    slider, label, image = out.split()
    ws.close()
    pid = kernel_pid(jp_serverapp, kid)
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert gone(pid)

    # the page reloads: its widget manager asks for every widget's state through a control comm
    page = Page(await open_ws(jp_ws_fetch, kid, "reloaded"))
    assert await page.ask("comm_open", {"comm_id": "control", "target_name": "jupyter.widget.control",
                                        "data": {}}) == []
    [reply] = comm_messages(await page.ask("comm_msg", {"comm_id": "control", "data": {"method": "request_states"}}),
                            "control")
    states = reply["content"]["data"]
    assert states["method"] == "update_states"
    assert states["buffer_paths"] == [[image, "state", "value"]] and reply["buffers"] == [b"\x89PNG gpucr"]
    assert states["states"][slider]["model_name"] == "IntSliderModel"
    assert states["states"][slider]["state"]["value"] == 7
    assert states["states"][label]["state"]["value"] == "seven"
    assert await page.ask("comm_close", {"comm_id": "control", "data": {}}) == []
    # then which widget comms the kernel has, and (older managers) one widget's state on its own comm
    [info] = await page.ask("comm_info_request", {"target_name": "jupyter.widget"})
    assert {slider, label} <= set(info["content"]["comms"])
    [state] = comm_data(await page.ask("comm_msg", {"comm_id": slider, "data": {"method": "request_state"}}), slider)
    assert state["method"] == "update" and state["state"]["value"] == 7
    [own] = comm_messages(await page.ask("comm_msg", {"comm_id": image, "data": {"method": "request_state"}}), image)
    assert own["content"]["data"]["buffer_paths"] == [["value"]] and own["buffers"] == [b"\x89PNG gpucr"]
    await asyncio.sleep(2)  # the issue saw the restore about 2 s after the reload
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"

    # the user moves the slider: the kernel comes back, takes the value, and its label follows
    moved = await page.ask("comm_msg", {"comm_id": slider, "data": {"method": "update", "state": {"value": 9},
                                                                   "buffer_paths": []}}, timeout=120)
    assert {"value": "moved to 9"} in [d.get("state") for d in comm_data(moved, label)], moved
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"
    _, out, _ = await execute(page.ws, "print(slider.value, label.value)")
    assert out == "9 moved to 9\n"
    assert all(m["parent_header"].get("msg_id") for m in page.heard), [m for m in page.heard
                                                                      if not m["parent_header"].get("msg_id")]
    page.ws.close()
