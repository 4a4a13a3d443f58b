"""gpucr's REST API in one table: what the Jupyter server mounts and what the Kernel Gateway
mounts are the same routes (docs/rest-api.md), so a gateway has fork, save points and room too."""
from __future__ import annotations

from . import handlers as h

_KERNEL = r"kernels/(?P<kernel_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
_CHECKPOINT = r"checkpoints/(?P<checkpoint_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
_TRASH = r"trash/(?P<trash_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
_SAVE_POINT = rf"{_KERNEL}/savepoints/(?P<savepoint_id>[A-Za-z0-9][A-Za-z0-9._-]*)"


def routes(base: str = "/api/gpucr") -> list[tuple[str, type]]:
    """Every gpucr route under ``base``, with its handler class."""
    return [(f"{base}/{path}", handler) for path, handler in [
        ("kernels", h.KernelsHandler),
        (_KERNEL, h.KernelHandler),
        (f"{_KERNEL}/suspend", h.SuspendHandler),
        (f"{_KERNEL}/resume", h.ResumeHandler),
        (f"{_KERNEL}/label", h.LabelHandler),
        (f"{_KERNEL}/fork", h.ForkHandler),
        (f"{_KERNEL}/savepoints", h.SavePointsHandler),
        (_SAVE_POINT, h.SavePointHandler),
        (f"{_SAVE_POINT}/restore", h.GoBackHandler),
        (f"{_SAVE_POINT}/fork", h.SavePointForkHandler),
        ("trash", h.TrashHandler),
        (_TRASH, h.TrashItemHandler),
        (f"{_TRASH}/restore", h.TrashRestoreHandler),
        ("checkpoints", h.CheckpointsHandler),
        (_CHECKPOINT, h.CheckpointHandler),
        ("gpus", h.GpusHandler),
        ("room", h.RoomHandler),
        ("doctor", h.DoctorHandler),
    ]]
