"""A restore, under the name's lock: the checks before anything runs, CRIU restoring the tree in
a new holder while the images are hashed, the memory brought in (lazily behind a process without
GPU state; by gpucr's page daemon, with many threads, for every other), the driver's restore with
the GPU map, and the tree continued only once its images proved intact."""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import psutil

from ..criu import hugepages, pagefill
from ..criu.commands import LAZY_SOCKET, explain_log
from ..criu.images import read_image
from ..errors import AddressInUseError, EngineError, GPUCRError, PreconditionError
from ..files import make_private_dir
from ..forks import netns
from ..forks.copies import inherit_args
from ..gpu import cuda, gpus
from ..objectstore.leases import node_id
from ..process.launcher import Started, start_holder
from ..process.procs import find_descendant_by_ns_pid, tree, wait_gone
from ..process.record import ProcRecord
from ..process.running import Running
from ..recovery import PAGES, read_pages
from ..storage import openfiles
from ..storage.store import Checkpoint, Store
from .background import in_background
from .compatibility import check_compatible
from .contract import CheckpointerParts, Progress
from .pages import pages_lost, wait_for_pages
from .restore_failures import port_hint, port_holders, restore_summary, rewind_grown_log, unix_name_still_held

# A restore reads the whole image (CRIU restored ~2 GB/s here); the wait also ends as soon as the
# holder exits, so a generous bound only matters for a hung CRIU.
RESTORE_TIMEOUT = 3600.0
# Where a fork's own copies of its source's written files are handed to CRIU (``--inherit-fd``).
FIRST_INHERITED_FD = 200


def restore_locked(cr: CheckpointerParts, name: str, rec: ProcRecord, ckpt: Checkpoint, gpu: str | int | None,
                   progress: Progress, detach: bool, beside: Mapping[str, int],
                   run_while_filled: bool = True, files: Mapping[str, str] | None = None) -> Running:
    """Restore ``name`` from ``ckpt`` (the name's lock held; see
    :meth:`~jupyter_gpucr.core.checkpointer.Checkpointer.restore`). Raises :class:`ChangedWhileFilled`
    when the tree must be restored again, stopped until its memory is in."""
    t0 = time.perf_counter()
    check_compatible(ckpt, cr.criu.path)
    if cr.open_files is not None:  # made on another node: its scratch files back, the others checked
        openfiles.prepare(ckpt, node_id(cr.store))  # (one that keeps none, the daemon's, puts none back)
    gpu_info = ckpt.manifest.get("gpu", {})
    used = gpu_info.get("used", [])
    needs = [{**u, "memory_used": u["memory_used"] + beside.get(u["uuid"], 0)} for u in used]
    gpu_map = gpus.plan_placement(needs, gpu_info.get("all", []), gpu, gpus.list_gpus()) if used else {}
    if used:
        need = sum(u["memory_used"] for u in used)
        if psutil.virtual_memory().available < need:
            raise PreconditionError(f"Not enough host memory to stage {need >> 20} MiB of GPU memory.",
                                    "Free host memory and try again. The checkpoint is kept.")
    if cr.verify:
        progress("verifying", 0, ckpt.size)
        ckpt.verify("images", contents=False)  # a missing or cut-short file is refused before anything starts
    # What recovery needs if this process dies before the restored one is recorded as running;
    # written (and fsynced) before the images are read, which would make it wait behind them.
    cr.store.write_proc(name, {**rec, "restoring": {"checkpoint": ckpt.id, "ns_pid": ckpt.manifest.get("ns_pid"),
                                                    "gpu_map": gpu_map, "since": time.time(), "by": os.getpid()}})
    progress("restoring", 0, ckpt.size)
    verifying = in_background(verify_images, ckpt, progress) if cr.verify else None  # while CRIU reads them
    timings = {"checks": time.perf_counter() - t0}
    # How the memory comes back. A process without GPU state runs at once, CRIU's lazy-pages
    # daemon streaming its memory in behind (``lazy_restore``). Every other restore is handed
    # back with all of it in place: gpucr's daemon (``pagefill``) copies it in with many
    # threads, where CRIU reads it with one. An eager restore leaves the tree stopped until
    # then. A GPU process runs meanwhile, for the driver's restore, whose faults the daemon
    # serves a 4 MiB span at a time (through CRIU's daemon, page by page, that restore took
    # 11.4-11.9 s instead of 0.29 s, W2 on the H200); the restore returns once all is in.
    paged = cr.criu.lazy_pages_supported
    # A fork's images are its source's, which the source's next checkpoint may delete: all of
    # its memory comes in before the restore is handed back, and CRIU works in its own folder.
    own = ckpt.name == name
    workdir = ckpt.path if own else make_private_dir(cr.store.proc_dir(name) / "restore")
    lazy = not used and cr.lazy_restore and paged and own
    fill = paged and not lazy
    running_while_filled = fill and run_while_filled and runs_while_filled(used)
    t1 = time.perf_counter()
    started: Started | None = None
    try:
        try:
            started = spawn_restore(cr, name, ckpt.images, workdir, detach=detach,
                                    leave_stopped=verifying is not None or fill, lazy=lazy, fill=fill,
                                    files=files or {})
        except GPUCRError:
            if verifying is not None:
                verifying.result()  # CRIU failed on a damaged image: say that, not what CRIU tripped over
            raise
        timings["criu_restore"] = time.perf_counter() - t1
        if fill and not running_while_filled:
            await_fill(cr.store, name, timings, "page_fill")
        t_checked = time.perf_counter()
        if verifying is not None:
            continue_if_intact(started, verifying)
            timings["verify_wait"] = time.perf_counter() - t_checked
        elif fill:
            continue_tree(started)
        if used:
            progress("gpu-restore", 0, ckpt.size)
            t2 = time.perf_counter()
            restore_gpu(started, gpu_info.get("cuda_ns_pids", []), gpu_map)
            timings["gpu_restore"] = time.perf_counter() - t2
        if running_while_filled:
            await_fill(cr.store, name, timings, "page_fill_behind")
    except BaseException as e:
        cr.store.write_proc(name, rec)  # nothing runs: the record is what it was
        report = read_pages(cr.store, name)
        if running_while_filled and report.get("exit") == pagefill.LAYOUT_CHANGED and started is not None:
            wait_gone(started.holder_pid, 10)  # its namespace is gone with it
            raise ChangedWhileFilled() from e
        lost = pages_lost(name, report)
        if lost is not None:  # the process died of that, whatever tripped over its death
            raise lost from e
        raise
    timings["total"] = time.perf_counter() - t0
    rec = {**rec, "state": "running", "pid": started.pid, "ns_pid": started.ns_pid, "restored_at": time.time(),
           "restored_from": ckpt.id, "gpu_map": gpu_map}
    cr.store.write_proc(name, rec)
    if not used:  # not yet run against a restored CUDA process (its pinned memory) on a GPU machine
        hugepages.start(tree(started.pid), after=lambda: wait_for_pages(cr.store, name) is None)
    progress("done", ckpt.size, ckpt.size)
    return Running(name, started.pid, started.ns_pid, started, rec, timings)


def spawn_restore(cr: CheckpointerParts, name: str, images: Path, workdir: Path, detach: bool = True,
                  leave_stopped: bool = False, lazy: bool = False, fill: bool = False,
                  files: Mapping[str, str] | None = None) -> Started:
    """Restore under a new holder. ``lazy``: the tree starts before its memory is back, CRIU's
    lazy-pages daemon (run by the holder) brings it in behind (see :meth:`~jupyter_gpucr.core.checkpointer.Checkpointer.await_pages`);
    ``fill``: gpucr's daemon copies it all in while the tree is left stopped. A fork (its record
    names host ports for its relay) is restored into a network namespace of its own; ``files``:
    see :meth:`~jupyter_gpucr.core.checkpointer.Checkpointer.restore`."""
    d = cr.store.proc_dir(name)
    pidfile = d / ".restore.pid"
    argv = cr.criu.page_fill_argv(images, workdir) if fill else cr.criu.lazy_pages_argv(images, workdir)
    daemon = ([f"--lazy-pages={json.dumps(argv)}", f"--lazy-socket={workdir / LAZY_SOCKET}",
               f"--pages={d / PAGES}"] if lazy or fill else [])
    check = cr.restore_check
    checked = check.approve(images, workdir) if check is not None else []
    handed = {**(check.handed(images, d) if check is not None else {}), **(files or {})}
    inherit, keep = inherit_args(images, handed, FIRST_INHERITED_FD)
    routes = netns.routes_of(cast(dict[str, Any], cr.store.read_proc(name)))
    addresses = netns.connected_addresses(read_image(images)) if routes is not None else []
    (d / PAGES).unlink(missing_ok=True)
    for attempt in range(2):
        pidfile.unlink(missing_ok=True)
        argv = [*cr.criu.restore_argv(images, workdir, pidfile, leave_stopped, lazy or fill), *checked, *inherit]
        _, relay = netns.bind(routes) if routes is not None else ([], [])
        try:  # the holder keeps the relay's sockets; ours close either way
            started = start_holder(["restore", f"--pidfile={pidfile}", *daemon, *keep,
                                    *(netns.holder_args(routes, relay, addresses) if routes is not None else []), "--", *argv],
                                   d / ".status", detach=detach, log_path=d / "holder.log", timeout=RESTORE_TIMEOUT,
                                   pass_fds=tuple(s.fileno() for s in relay), net=routes is not None)
        finally:
            for s in relay:
                s.close()
        if started is not None:
            return started
        refused = check.refused(workdir) if check is not None else None
        if refused is not None:
            raise refused
        failure = explain_log(workdir / "restore.log")
        if attempt == 0 and (rewind_grown_log(failure.raw, d) or unix_name_still_held(failure.raw)):
            continue
        holders = port_holders(images, failure.raw)
        # an address taken is a conflict a retry resolves once its holder let it go
        error = AddressInUseError if "Address already in use" in failure.raw else EngineError
        raise error(f"CRIU could not restore {name!r}: {failure.line}"
                    + "".join(f" Port {port} ({ip}), which the process had bound, is now held by {who}." if who
                              else f" A recent connection on port {port} is still closing (TIME_WAIT); retry in a minute."
                              for port, ip, who, _pid in holders),
                    port_hint(holders) or f"{failure.hint} The checkpoint is kept; you can retry.",
                    summary=restore_summary(failure.summary, holders))
    raise AssertionError("unreachable")


def runs_while_filled(used: list[gpus.GpuUse]) -> bool:
    """Whether the restored tree is continued before its memory is all in: a GPU process
    is, for the driver's restore (see :func:`restore_locked`)."""
    return bool(used)


def await_fill(store: Store, name: str, timings: dict[str, float], key: str) -> None:
    """Wait until the page daemon has copied every page in (``timings[key]``: how long)."""
    t0 = time.perf_counter()
    lost = wait_for_pages(store, name, RESTORE_TIMEOUT)
    if lost is not None:
        raise lost
    timings[key] = time.perf_counter() - t0


def continue_if_intact(started: Started, verifying: Future[None]) -> None:
    """CRIU left the restored tree stopped while its images were hashed: continue it when they
    were intact; otherwise stop it for good (the whole namespace) and report the damage."""
    try:
        verifying.result()
    except BaseException:
        os.kill(started.holder_pid, signal.SIGKILL)  # unshare --kill-child takes the namespace with it
        wait_gone(started.pid, 10)
        raise
    continue_tree(started)


def restore_gpu(started: Started, cuda_ns_pids: list[int], gpu_map: dict[str, str]) -> None:
    host_pids = [find_descendant_by_ns_pid(started.holder_pid, p) for p in cuda_ns_pids]
    try:
        for p in host_pids:
            if p is None:
                raise EngineError("A restored CUDA process is missing.")
            cuda.restore(p, gpu_map or None)
        for p in host_pids:
            cuda.unlock(p)  # type: ignore[arg-type]  # None was refused in the loop above
    except GPUCRError as e:
        os.kill(started.pid, signal.SIGKILL)
        e.message += " The restored process was stopped; the checkpoint is kept."
        raise


def continue_tree(started: Started) -> None:
    """Let a tree that its restore left stopped run."""
    for p in tree(started.pid):
        os.kill(p, signal.SIGCONT)


def verify_images(ckpt: Checkpoint, progress: Progress) -> None:
    """Hash the images against the manifest; once they match, the whole image has been read (what
    else the restore reads, from a cold disk, can start: see ``CriuEngine.resume``)."""
    ckpt.verify("images")
    progress("restoring", ckpt.size, ckpt.size)


class ChangedWhileFilled(Exception):
    """A restored tree forked or moved memory while it ran and its memory was filled (which the
    page daemon does not follow): the restore is done again, the tree stopped until filled."""
