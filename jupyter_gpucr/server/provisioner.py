"""A kernel provisioner whose kernels CRIU can suspend and restore.

Kernels are launched through :mod:`jupyter_gpucr.core.process.holder` (own PID + mount namespace, output to
log files in the store, no ``JPY_PARENT_PID``). After a restore the kernel is no longer the
process jupyter_client launched, so this provisioner tracks it by PID rather than by the old
``Popen``: poll, interrupt and kill keep working. While suspended it reports the kernel as
present (there is no process to poll, but the kernel exists on disk).

The program that runs this provisioner is recorded as the kernel's owner in the store
(:mod:`jupyter_gpucr.core.process.owners`) until it shuts the kernel down: ``gpucr checkpoint`` then
leaves the kernel running for it, and ``gpucr restore`` does not bring it back once it is gone.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner

from ..core.backend import CheckpointBackend
from ..core.checkpointer import Checkpointer
from ..core.files import private_files
from ..core.process.launcher import ExitedAtStart, Started
from ..core.process.owners import record_owner, release_owner
from ..core.process.procs import is_alive, namespace_init
from .kernel_rpc import HISTORY_FILE

# What poll() reports for a kernel that exited while processes it left still run in its namespace.
KERNEL_GONE = 1
# How long a holder may take to exit after its namespace got SIGKILL.
REAP_TIMEOUT = 5.0


class GPUCRProvisioner(LocalProvisioner):
    """Launches kernels so that they can be checkpointed; see the module docstring."""

    suspended: bool = False
    kernel_pid: int | None = None
    _standalone: Checkpointer | None = None

    @property
    def checkpointer(self) -> CheckpointBackend:
        """The server's (through the mapping kernel manager), or the default store's when a
        plain jupyter_client program uses this provisioner (``gpucr checkpoint KERNEL_ID`` then works)."""
        runtime = getattr(getattr(self.parent, "parent", None), "runtime", None)
        if runtime is not None:
            return runtime.checkpointer
        if self._standalone is None:
            self._standalone = Checkpointer()
        return self._standalone

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        env = kwargs.get("env") or os.environ.copy()
        cwd = kwargs.get("cwd") or os.getcwd()
        cmd = _with_hooks(self._private_history(cmd))
        self.cwd = cwd
        try:
            running = await asyncio.to_thread(
                self.checkpointer.run, self.kernel_id, cmd, cwd=str(cwd), env=env, detach=False)
        except ExitedAtStart as e:
            self._exited(e)
        else:
            self.adopt(running.started)
        return self.connection_info

    def _exited(self, e: ExitedAtStart) -> None:
        """A kernel that started and exited at once is, as with jupyter_client's own launcher, a
        started kernel that died: is_alive() says so and the restarter takes over. A command that
        could not start at all raises instead."""
        self.log.warning("gpucr: kernel %s: %s %s", self.kernel_id, e.message, e.hint)
        self.process = e.popen
        self.pid = e.popen.pid
        self.kernel_pid = None
        self.pgid = None
        self.suspended = False

    def _private_history(self, cmd: list[str]) -> list[str]:
        """Give an IPython kernel its own history database in its store directory.

        IPython kernels share ``~/.ipython/profile_default/history.sqlite`` and keep it open; when
        another kernel writes to it while this one is suspended, CRIU refuses the restore
        (the file changed size). A database of its own changes only when this kernel runs.
        """
        if not _is_ipykernel(cmd) or any("HistoryManager.hist_file" in p for p in cmd):
            return cmd
        directory = self.checkpointer.store.proc_dir(self.kernel_id)
        private_files(directory, HISTORY_FILE)  # SQLite takes an empty file as an empty database
        return [*cmd, f"--HistoryManager.hist_file={directory / HISTORY_FILE}"]

    def adopt(self, started: Started | None) -> None:
        """Track a (re)started kernel: the holder's Popen for reaping, the kernel's PID and process
        group for signals."""
        assert started is not None
        self.process = started.popen
        self.pid = started.holder_pid
        self.kernel_pid = started.pid
        self.pgid = _pgid_of(started.pid)
        self.suspended = False
        self._owner_record(record_owner)

    def mark_suspended(self) -> None:
        """The kernel is on disk: no process, yet one to come back (a restore adopts it)."""
        self.suspended = True
        self.kernel_pid = None
        self.pgid = None

    def expect_launch(self) -> None:
        """A fresh process is about to be launched for the kernel on disk (a snapshot restore's start,
        or a warm start ahead of it): that process is the kernel."""
        self.suspended = False

    def forget_suspended(self) -> None:
        """The kernel on disk was shut down or restarted: no process stands for it any more."""
        self.suspended = False
        self.process = None

    @property
    def has_process(self) -> bool:
        return self.suspended or self.process is not None

    async def poll(self) -> int | None:
        """None while the kernel process lives. Its own exit status stays with the holder that
        reaped it; the holder's is reported once it has exited, ``KERNEL_GONE`` until then."""
        if self.suspended:
            return None
        if self.process is None:
            return 0
        if is_alive(self.kernel_pid):
            return None
        code = self.process.poll()
        return KERNEL_GONE if code is None else code

    async def wait(self) -> int | None:
        """Wait for the kernel to exit, then end what it left in its namespace (children that
        outlived it would keep the holder, and the kernel's resources, alive)."""
        if self.suspended:
            return None
        while await self.poll() is None:
            await asyncio.sleep(0.1)
        return await self._end_namespace()

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel's process group, as LocalProvisioner does, so that its child
        processes get interrupts and terminations too."""
        if self.suspended or not self.pgid:
            return
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass  # the kernel and every process of its group are gone

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL to the init of the kernel's PID namespace: every process inside dies with it."""
        if not self.suspended and self.process is not None:
            _kill_namespace(self.process)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        await self._end_namespace()
        if not restart:  # a restart launches (and records) it again
            self._owner_record(release_owner)
        await super().cleanup(restart=restart)

    def _owner_record(self, write: Callable[[Path], None]) -> None:
        """Record this program as the kernel's owner, or that it let the kernel go. A store this
        user cannot write (the gpucr daemon's) keeps none: the CLI then treats the kernel as any process."""
        directory = self.checkpointer.store.procs_root / str(self.kernel_id)
        if not directory.is_dir():  # gone with a suspended kernel's shutdown (trashed): nothing to record
            return
        try:
            write(directory)
        except OSError as e:
            self.log.debug("gpucr: kernel %s: no owner record (%s)", self.kernel_id, e)

    async def _end_namespace(self) -> int | None:
        """End whatever is left of the kernel's namespace and reap the holder. Bounded: a
        shutdown must never hang on a process that does not go away."""
        popen, self.process = self.process, None
        if popen is None:
            return 0
        if popen.poll() is None:
            _kill_namespace(popen)
            try:
                await asyncio.to_thread(popen.wait, REAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                popen.kill()
                self.log.warning("gpucr: the namespace of kernel %s did not end within %.0f s after SIGKILL; "
                                 "its holder (PID %d) was killed too", self.kernel_id, REAP_TIMEOUT, popen.pid)
        return popen.returncode


def _with_hooks(cmd: list[str]) -> list[str]:
    """Load ``gpucr_hooks`` into an IPython kernel as an extension: it collects garbage while the
    kernel is idle, so a suspend need not (0.25-0.3 s of the time to free the GPU for W2).
    Only where this environment has the hooks: the kernel is assumed to share it, as the
    server's own kernelspec does; a kernel without them still works (IPython logs the failure)."""
    if not _is_ipykernel(cmd) or importlib.util.find_spec("gpucr_hooks") is None:
        return cmd
    return [*cmd, "--InteractiveShellApp.extra_extensions=gpucr_hooks"]


def _is_ipykernel(cmd: list[str]) -> bool:
    return any("ipykernel" in part for part in cmd)


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _kill_namespace(holder: subprocess.Popen) -> None:
    """SIGKILL the namespace's init (its PID 1 takes everything inside along); the ``unshare``
    process itself when the init is already gone."""
    if holder.poll() is not None:
        return
    if not isinstance(holder, subprocess.Popen):  # the gpucr daemon's holder (root): the daemon ends it
        holder.kill()
        return
    init = namespace_init(holder.pid)
    try:
        os.kill(init, signal.SIGKILL) if init else holder.kill()
    except ProcessLookupError:
        pass
