"""The REST reference (docs/rest-api.yaml, OpenAPI 3.1) against a real server: every route gpucr
serves is in the document, and each of its answers, errors included, is valid against it.

openapi-core validates requests and responses against the document (paths, parameters, status
codes, bodies; JSON Schema 2020-12 as OpenAPI 3.1 uses it): the library JupyterLab's own server
(jupyterlab_server) tests its REST API with, maintained by the python-openapi project.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from openapi_core import OpenAPI
from openapi_core.exceptions import OpenAPIError
from openapi_core.testing import MockRequest, MockResponse

from jupyter_gpucr.server.routes import routes
from tests.conftest import criu_or_skip

pytestmark = pytest.mark.timeout(240)

SPEC = Path(__file__).resolve().parents[2] / "docs" / "rest-api.yaml"
METHODS = ("get", "put", "post", "delete")
FORK = "/api/gpucr/kernels/{kernel_id}/fork"


def documented() -> dict[str, set[str]]:
    """Path template -> the methods the document describes for it."""
    paths = OpenAPI.from_file_path(str(SPEC)).spec / "paths"
    return {str(p): {m for m in METHODS if m in paths / p} for p in paths.keys()}


def served() -> dict[str, set[str]]:
    """Path template -> the methods gpucr's handlers implement (as the extension and the gateway mount them)."""
    out = {}
    for pattern, cls in routes():
        template = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)
        out[template] = {m for m in METHODS if m in vars(cls)}
    return out


def test_every_served_route_is_documented():
    docs = documented()
    missing = {path: sorted(methods - docs.get(path, set())) for path, methods in served().items()}
    assert {p: m for p, m in missing.items() if m} == {}


class Api:
    """Calls the server and checks each request and answer against the document."""

    def __init__(self, jp_fetch: Any) -> None:
        self.fetch = jp_fetch
        self.openapi = OpenAPI.from_file_path(str(SPEC))
        self.seen: set[tuple[str, str, int]] = set()

    async def __call__(self, method: str, path: str, body: dict[str, Any] | None = None, status: int = 200,
                       params: dict[str, str] | None = None, invalid: bool = False) -> Any:
        """``invalid``: a request the document says is invalid (the server must refuse it too)."""
        data = json.dumps(body).encode() if body is not None else None
        allow_body = method in ("POST", "PUT")
        resp = await self.fetch(*path.strip("/").split("/"), method=method, params=params, raise_error=False,
                                body=(data or b"{}") if allow_body else None)
        request = MockRequest("http://localhost", method.lower(), path, args=params or {}, data=data or b"",
                              headers={"Authorization": "token the-test-token"})
        if invalid:
            with pytest.raises(OpenAPIError):
                self.openapi.validate_request(request)
        else:
            self.openapi.validate_request(request)
        assert resp.code == status, (method, path, resp.code, resp.body)
        answer = MockResponse(resp.body, status_code=resp.code,
                              content_type=resp.headers.get("Content-Type", "").split(";")[0] if resp.body else "")
        self.openapi.validate_response(request, answer)
        self.seen.add((self._template(path), method.lower(), resp.code))
        return json.loads(resp.body) if resp.body else None

    def _template(self, path: str) -> str:
        for template in documented():
            if re.fullmatch(re.sub(r"\{\w+\}", r"[^/]+", template), path):
                return template
        raise AssertionError(f"{path} is not in the document")


@pytest.fixture
def jp_server_config(tmp_path):
    criu_or_skip()
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store")},
    }


async def test_the_server_answers_as_documented(jp_fetch):
    api = Api(jp_fetch)

    async def start_kernel() -> str:
        r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
        return json.loads(r.body)["id"]

    kid = await start_kernel()
    assert [k["kernel_id"] for k in await api("GET", "/api/gpucr/kernels")] == [kid]
    assert (await api("GET", f"/api/gpucr/kernels/{kid}"))["state"] == "running"
    missing = await api("GET", "/api/gpucr/kernels/no-such-kernel", status=404)
    assert missing["error"] == "NotFoundError" and missing["hint"], missing

    assert (await api("PUT", f"/api/gpucr/kernels/{kid}/label", {"label": "run-1"}))["label"] == "run-1"
    assert [k["kernel_id"] for k in await api("GET", "/api/gpucr/kernels", params={"label": "run-1"})] == [kid]
    await api("PUT", f"/api/gpucr/kernels/{kid}/label", {"label": ""}, status=400, invalid=True)

    bad = await api("POST", f"/api/gpucr/kernels/{kid}/suspend", {"when": "later"}, status=400, invalid=True)
    assert "idle" in bad["message"], bad
    assert (await api("DELETE", f"/api/gpucr/kernels/{kid}/suspend"))["state"] == "running"
    suspended = await api("POST", f"/api/gpucr/kernels/{kid}/suspend", {})
    assert suspended["state"] == "suspended" and suspended["checkpoint"], suspended
    again = await api("POST", f"/api/gpucr/kernels/{kid}/suspend", {}, status=409)
    assert again["message"] and again["hint"] and again["reason"] == again["hint"], again

    checkpoints = await api("GET", "/api/gpucr/checkpoints")
    assert [c["kernel_id"] for c in checkpoints] == [kid]
    ckpt_id = checkpoints[0]["id"]
    assert (await api("GET", f"/api/gpucr/checkpoints/{ckpt_id}"))["size"] > 0
    await api("GET", "/api/gpucr/checkpoints/no-such-checkpoint", status=404)

    assert (await api("POST", f"/api/gpucr/kernels/{kid}/resume", {"gpu": "auto"}))["state"] == "running"

    # save points: taken while the kernel runs, listed, read and deleted; unknown ones answer 404
    made = await api("POST", f"/api/gpucr/kernels/{kid}/savepoints", {"name": "before"}, status=201)
    assert [p["id"] for p in await api("GET", f"/api/gpucr/kernels/{kid}/savepoints")] == [made["id"]]
    assert (await api("GET", f"/api/gpucr/kernels/{kid}/savepoints/{made['id']}"))["name"] == "before"
    await api("POST", f"/api/gpucr/kernels/{kid}/savepoints/no-such-point/restore", {}, status=404)
    await api("POST", f"/api/gpucr/kernels/{kid}/savepoints/no-such-point/fork", {}, status=404)
    await api("DELETE", f"/api/gpucr/kernels/{kid}/savepoints/{made['id']}", status=204)
    assert isinstance(await api("GET", "/api/gpucr/room"), list)

    # a suspended kernel shut down goes to the trash, and comes back from it
    await api("POST", f"/api/gpucr/kernels/{kid}/suspend", {})
    await jp_fetch("api", "kernels", kid, method="DELETE")
    trash = await api("GET", "/api/gpucr/trash")
    assert [t["kernel_id"] for t in trash] == [kid]
    back = await api("POST", f"/api/gpucr/trash/{trash[0]['id']}/restore", {"sessions": False})
    assert back["kernel_id"] == kid and back["state"] == "suspended", back
    await api("POST", "/api/gpucr/trash/no-such-entry/restore", {}, status=404)

    # deleting the checkpoint of a suspended kernel shuts it down; its trash entry is deleted for good
    latest = [c["id"] for c in await api("GET", "/api/gpucr/checkpoints") if c["kernel_id"] == kid]
    await api("DELETE", f"/api/gpucr/checkpoints/{latest[-1]}", status=204)
    other = await start_kernel()
    await api("POST", f"/api/gpucr/kernels/{other}/suspend", {})
    await jp_fetch("api", "kernels", other, method="DELETE")
    entry = [t["id"] for t in await api("GET", "/api/gpucr/trash") if t["kernel_id"] == other]
    await api("DELETE", f"/api/gpucr/trash/{entry[0]}", status=204)
    await api("DELETE", f"/api/gpucr/trash/{entry[0]}", status=404)

    if FORK in served():  # the copies are jupyter_server kernel models
        forks = (await api("POST", f"/api/gpucr/kernels/{other}/fork", {"count": 1}, status=404))
        assert forks["hint"], forks

    assert isinstance(await api("GET", "/api/gpucr/gpus"), list)
    report = await api("GET", "/api/gpucr/doctor")
    assert any(c["name"] == "criu" and c["ok"] for c in report["checks"]), report

    answered = {(path, method) for path, method, _ in api.seen}
    unanswered = {(p, m) for p, methods in served().items() for m in methods} - answered
    assert unanswered == set(), "served routes this test did not call"
