"""What the server tells JupyterLab's page about its configuration: the UI's sentences about the
trash say the operator's c.GPUCR.trash_hours, not a default."""
from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyterlab": True, "jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store"), "trash_hours": 2.5},
    }


async def test_lab_page_says_the_configured_trash_hours(jp_fetch):
    page = (await jp_fetch("lab")).body.decode()
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    assert found, "the lab page has no page config"
    assert json.loads(found.group(1))["gpucrTrashHours"] == "2.5"
