"""A kernel provisioner whose kernels CRIU can suspend and restore.

Kernels are launched through :mod:`jupyter_gpucr.holder` (own PID + mount namespace, output to
log files in the store, no ``JPY_PARENT_PID``). After a restore the kernel is no longer the
process jupyter_client launched, so this provisioner tracks it by PID rather than by the old
``Popen``: poll, interrupt and kill keep working. While suspended it reports the kernel as
present (there is no process to poll, but the kernel exists on disk).
"""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner

from ..core.checkpointer import Checkpointer
from ..core.launcher import Started
from ..core.procs import is_alive


class GPUCRProvisioner(LocalProvisioner):  # type: ignore[misc]
    """Launches kernels so that they can be checkpointed; see the module docstring."""

    suspended: bool = False
    kernel_pid: int | None = None
    _standalone: Checkpointer | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        """The server's (through the mapping kernel manager), or the default store's when a
        plain jupyter_client program uses this provisioner (``gpucr checkpoint KERNEL_ID`` then works)."""
        service = getattr(getattr(self.parent, "parent", None), "suspender", None)
        if service is not None:
            return service.checkpointer
        if self._standalone is None:
            self._standalone = Checkpointer()
        return self._standalone

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        env = kwargs.get("env") or os.environ.copy()
        cwd = kwargs.get("cwd") or os.getcwd()
        cmd = self._private_history(cmd)
        running = await asyncio.to_thread(
            self.checkpointer.run, self.kernel_id, cmd, cwd=str(cwd), env=env, detach=False)
        self.adopt(running.started)
        self.cwd = cwd
        return self.connection_info

    def _private_history(self, cmd: list[str]) -> list[str]:
        """Give an IPython kernel its own history database in its store directory.

        IPython kernels share ``~/.ipython/profile_default/history.sqlite`` and keep it open; when
        another kernel writes to it while this one is suspended, CRIU refuses the restore
        (the file changed size). A database of its own changes only when this kernel runs.
        """
        if not any("ipykernel" in part for part in cmd) or any("HistoryManager.hist_file" in p for p in cmd):
            return cmd
        history = self.checkpointer.store.proc_dir(self.kernel_id) / "history.sqlite"
        return [*cmd, f"--HistoryManager.hist_file={history}"]

    def adopt(self, started: Started | None) -> None:
        """Track a (re)started kernel: the holder's Popen for reaping, the kernel's PID for signals."""
        assert started is not None
        self.process = started.popen
        self.pid = started.holder_pid
        self.pgid = None
        self.kernel_pid = started.pid
        self.suspended = False

    def mark_suspended(self) -> None:
        self.suspended = True
        self.kernel_pid = None

    @property
    def has_process(self) -> bool:
        return self.suspended or self.process is not None

    async def poll(self) -> int | None:
        if self.suspended:
            return None
        if self.process is not None and self.process.poll() is None and is_alive(self.kernel_pid):
            return None
        return self.process.poll() if self.process is not None else 0

    async def wait(self) -> int | None:
        if self.suspended:
            return None
        while await self.poll() is None:
            await asyncio.sleep(0.1)
        code = self.process.wait() if self.process is not None else 0
        self.process = None
        return code

    async def send_signal(self, signum: int) -> None:
        if self.suspended or not self.kernel_pid:
            return
        try:
            os.kill(self.kernel_pid, signum)
        except ProcessLookupError:
            pass

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            await asyncio.to_thread(self.process.wait, 10)
        await super().cleanup(restart=restart)
