"""The state of the kernel's ipywidgets, as its widget control comm would send it.

A page that loads (a reload, a second browser) asks the kernel for every widget's state before it
draws them. Saved at suspend time, that answer lets the server draw a suspended kernel's widgets
without restoring it (``jupyter_gpucr.server.dormant``). Nothing is imported that the notebook
did not import: a kernel without ipywidgets has no widgets to save.
"""
from __future__ import annotations

import base64
import sys
from typing import Any

CONTROL_TARGET = "jupyter.widget.control"


def widget_states() -> dict[str, Any] | None:
    """The ``update_states`` data the control comm replies to ``request_states``, with its binary
    buffers in base64 (the reply goes into JSON); None: the kernel would not answer that request
    (ipywidgets not imported, or too old to have a control comm)."""
    module = sys.modules.get("ipywidgets.widgets.widget")
    if module is None or not _control_target_registered():
        return None
    instances = getattr(module, "_instances", None)
    if instances is None:  # ipywidgets 7
        instances = module.Widget.widgets
    states = {widget.model_id: {"model_name": widget._model_name, "model_module": widget._model_module,
                                "model_module_version": widget._model_module_version,
                                "state": widget.get_state(drop_defaults=False)}
              for widget in list(instances.values())}
    states, buffer_paths, buffers = module._remove_buffers(states)
    return {"method": "update_states", "states": states, "buffer_paths": buffer_paths,
            "buffers": [base64.b64encode(memoryview(b).cast("B")).decode("ascii") for b in buffers]}


def _control_target_registered() -> bool:
    from ipywidgets import comm

    manager = comm.get_comm_manager()
    return manager is not None and CONTROL_TARGET in getattr(manager, "targets", {})
