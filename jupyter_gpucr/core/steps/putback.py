"""Putting a dumped process back when its checkpoint could not be committed: restored from the
temporary images onto the same GPUs, so that the user keeps the running process."""
from __future__ import annotations

from pathlib import Path

from ..errors import EngineError, GPUCRError, PutBackError
from ..process.procs import stop_for_good
from ..process.record import ProcRecord
from .contract import CheckpointerParts
from .restore import continue_tree, restore_gpu, spawn_restore


def put_back_from(cr: CheckpointerParts, tmp: Path, name: str, rec: ProcRecord, cuda_ns_pids: list[int],
                  cause: BaseException, stopped: int) -> GPUCRError:
    """The dump finished but the checkpoint could not be committed: restore from the
    temporary images (GPU state onto the same GPUs) so the process is not lost; keep the images
    if even that fails. The process CRIU left ``stopped`` cannot simply continue (its TCP
    connections stay in CRIU's repair mode), so it goes first. The error carries ``started``:
    whoever tracked the process (the server's provisioner) must adopt the restored one."""
    stop_for_good(stopped)
    try:
        started = spawn_restore(cr, name, tmp / "images", tmp)
        continue_tree(started)  # a tree frozen for its dump (the daemon's) comes back stopped; the driver needs it running
        restore_gpu(started, cuda_ns_pids, {})
    except GPUCRError as e:
        return EngineError(f"Finishing the checkpoint failed ({cause}) and putting the process back failed "
                           f"too ({e.message}).", f"The complete CRIU images are kept in {tmp}.")
    cr.store.write_proc(name, {**rec, "state": "running", "pid": started.pid, "ns_pid": started.ns_pid})
    cr.store.discard(tmp)
    return PutBackError(f"Finishing the checkpoint failed: {cause}. The process was put back and runs again.",
                        "Free disk space in the checkpoint store, then suspend again.", started)
