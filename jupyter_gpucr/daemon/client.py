"""Client side: a checkpointer whose privileged work the gpucr daemon does.

:class:`DaemonCheckpointer` implements :class:`~jupyter_gpucr.core.backend.CheckpointBackend` as
the core ``Checkpointer`` does, so the server swaps it in where it would build a local one. The images stay in the daemon's root-only store; the user's own
store (``store``) mirrors each daemon checkpoint as a manifest without images, so that listing,
the trash and relisting after a server restart work on it unchanged. Deleting a mirrored checkpoint
(directly, by retention, or when its trash entry is purged) deletes the images in the daemon too;
moving one into the trash has the daemon hold it there (``in_trash``), out of its retention's reach.
Save points are made there too: the daemon copies a checkpoint and names an image's files for its
user (``copy``, ``files``), since the user may not read the images.
"""
from __future__ import annotations

import builtins
import os
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import psutil

from ..core.backend import CheckpointBackend
from ..core.criu.images import RegFile, RunningAgain
from ..core.errors import EngineError, GPUCRError, NotFoundError, PutBackError
from ..core.files import fsync_trees, make_private_dir
from ..core.process.launcher import Started
from ..core.process.running import Running
from ..core.recovery import RECOVER_WAIT, Recovery
from ..core.storage.store import MANIFEST, Checkpoint, Manifest, Store, read_json, read_record, write_json_atomic
from .protocol import DEFAULT_SOCKET, ProtocolError, encode, error_from, read_line

Progress = Callable[[str, int, int], None]
CONNECT_TIMEOUT = 5.0
#: Marks a mirrored manifest: its images are in the daemon's store.
MIRROR_KEY: Final = "daemon_images"


def _no_progress(phase: str, done: int, total: int) -> None:
    pass


class DaemonClient:
    """One request per connection; progress lines go to ``progress``, and the daemon's question
    during a checkpoint (``{"before_dump": true}``, see ``protocol``) to ``before_dump``, whose
    outcome is the answer."""

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET) -> None:
        self.socket_path = str(socket_path)

    def call(self, op: str, progress: Progress = _no_progress, timeout: float | None = None,
             before_dump: Callable[[], None] | None = None, **args: Any) -> Any:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect(sock, self.socket_path)
            sock.settimeout(timeout)
            try:
                sock.sendall(encode({"op": op, "args": args}))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused at once (a limit): the reason is the line below
            with sock.makefile("rb") as f:
                while True:
                    msg = read_line(f)
                    if msg is None:
                        raise EngineError(f"The gpucr daemon closed the connection during {op!r}.",
                                          "See the daemon's log (journalctl -u gpucr-daemon).")
                    if "progress" in msg:
                        progress(*msg["progress"])
                        continue
                    if "before_dump" in msg:
                        sock.sendall(encode(_outcome(before_dump)))
                        continue
                    if msg.get("ok"):
                        return msg.get("result")
                    raise error_from(msg.get("error") or {})
        finally:
            sock.close()

    def unavailable_reason(self) -> str | None:
        """None when the daemon answers and can run CRIU; else why not."""
        if not os.path.exists(self.socket_path):
            return f"no gpucr daemon socket at {self.socket_path}"
        try:
            self.call("hello")
        except GPUCRError as e:
            return e.message
        return None


def _connect(sock: socket.socket, path: str) -> None:
    """Connect, waiting up to ``CONNECT_TIMEOUT`` while the daemon's queue of connections is full.
    The socket blocks with a send timeout, which the kernel applies to a Unix connect: the client
    sleeps in the queue's line of waiters and is woken as the daemon accepts (with a timeout of its
    own, Python's socket would fail at once with EAGAIN)."""
    seconds = int(CONNECT_TIMEOUT)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, int((CONNECT_TIMEOUT - seconds) * 1e6)))
    try:
        sock.connect(path)
    except OSError as e:
        why = "its queue stayed full" if isinstance(e, BlockingIOError) else e.strerror or e
        raise EngineError(f"The gpucr daemon at {path} cannot be reached: {why}.",
                          "Start it (systemctl start gpucr-daemon) or ask the administrator.") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 0))


def _outcome(step: Callable[[], None] | None) -> dict[str, Any]:
    """Run ``step``; the reply that says how it went."""
    if step is None:
        return {"ok": False, "error": EngineError("This client has nothing to run before the dump.").to_dict()}
    try:
        step()
    except GPUCRError as e:
        return {"ok": False, "error": e.to_dict()}
    except Exception as e:  # noqa: BLE001 - the daemon must hear of it to put the process back
        return {"ok": False, "error": EngineError(f"Getting ready for the dump failed: {e}").to_dict()}
    return {"ok": True}


class RemoteHolder:
    """What the provisioner needs of a ``Popen`` for a namespace holder the daemon started (and reaps)."""

    def __init__(self, client: DaemonClient, name: str, pid: int) -> None:
        self.client, self.name, self.pid = client, name, pid
        self.returncode: int | None = None
        try:
            self._created: float | None = psutil.Process(pid).create_time()
        except psutil.Error:
            self._created = None

    def _running(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self._created and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def poll(self) -> int | None:
        if self.returncode is None and not self._running():
            try:
                code = self.client.call("poll", name=self.name)["returncode"]
            except GPUCRError:
                code = None
            self.returncode = code if code is not None else 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"holder {self.pid}", timeout or 0)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        """Ends the kernel's whole namespace (the daemon's holder runs as root)."""
        if self.poll() is None:
            self.client.call("kill", name=self.name)


class DaemonStore(Store):
    """The user's own store, whose criu checkpoints are manifests mirroring the daemon's store."""

    def __init__(self, root: Path | str | None, client: DaemonClient) -> None:
        super().__init__(root)
        self.client = client
        make_private_dir(self.root)  # mkdir(parents=True) leaves the store's own directory world-readable

    def mirror(self, cid: str, manifest: Manifest) -> Checkpoint:
        """Write (or rewrite) the manifest of a daemon checkpoint, without images."""
        path = make_private_dir(self.checkpoints_root / cid)
        mirrored: Manifest = {**manifest, MIRROR_KEY: self.client.socket_path}
        write_json_atomic(path / MANIFEST, mirrored)
        return Checkpoint(cid, path, mirrored)

    def forget(self, cid: str) -> None:
        """Drop a mirrored checkpoint here only (the daemon no longer has it)."""
        super().delete(cid)

    def delete(self, cid: str) -> None:
        if _mirrored(self.checkpoints_root / cid):
            _remove_in_daemon(self.client, cid)
        super().delete(cid)

    def delete_trash(self, tid: str) -> None:
        for cid in self._mirrors_in_trash(tid):
            _remove_in_daemon(self.client, cid)
        super().delete_trash(tid)

    def trash(self, name: str, reason: str, details: dict[str, Any] | None = None) -> str:
        with self._held_in_daemon(_mirrors(self._checkpoint_dirs(name)), True):
            return super().trash(name, reason, details)

    def trash_checkpoint(self, name: str, cid: str, reason: str, details: dict[str, Any] | None = None,
                         move: tuple[str, ...] = ()) -> str:
        with self._held_in_daemon(_mirrors([self.checkpoints_root / cid]), True):
            return super().trash_checkpoint(name, cid, reason, details, move)

    def put_back_trashed_checkpoint(self, tid: str, move: tuple[str, ...] = ()) -> None:
        with self._held_in_daemon(self._mirrors_in_trash(tid), False):
            super().put_back_trashed_checkpoint(tid, move)

    def untrash(self, tid: str) -> str:
        with self._held_in_daemon(self._mirrors_in_trash(tid), False):
            return super().untrash(tid)

    def _mirrors_in_trash(self, tid: str) -> builtins.list[str]:
        return _mirrors((self._trash_entry(tid) / "checkpoints").glob("*"))

    @contextmanager
    def _held_in_daemon(self, cids: builtins.list[str], held: bool) -> Iterator[None]:
        """Around moving mirrors into this store's trash (``held``) or out of it: the daemon marks
        their checkpoints first, so that its retention spares what this trash holds; nothing moves
        when it cannot, and a move that fails has its marks undone."""
        done: builtins.list[str] = []
        try:
            for cid in cids:
                _mark_in_trash(self.client, cid, held)
                done.append(cid)
            yield
        except BaseException:
            for cid in done:
                with suppress(GPUCRError):
                    _mark_in_trash(self.client, cid, not held)
            raise


def _mirrored(path: Path) -> bool:
    return MIRROR_KEY in (read_json(path / MANIFEST) or {})


def _mirrors(paths: Iterable[Path]) -> list[str]:
    """The ids of the checkpoint folders in ``paths`` that mirror the daemon's."""
    return [p.name for p in paths if _mirrored(p)]


def _mark_in_trash(client: DaemonClient, cid: str, held: bool) -> None:
    """See ``Daemon.op_in_trash``. One the daemon no longer has needs no mark. An older daemon has
    no such verb: there, as before it, a checkpoint in the trash is kept until its kernel's next
    suspend (the daemon's retention)."""
    try:
        client.call("in_trash", checkpoint_id=cid, held=held)
    except NotFoundError:
        pass
    except ProtocolError as e:
        if not e.message.startswith("Unknown request"):
            raise


def _remove_in_daemon(client: DaemonClient, cid: str) -> None:
    try:
        client.call("remove", target=cid)
    except NotFoundError:
        pass


class DaemonCheckpointer(CheckpointBackend):
    """A ``CheckpointBackend`` whose privileged work the gpucr daemon does. It checks an image
    against this node at the restore, on its side, and streams no dump (the images are the
    daemon's). It keeps save points, dumped in full and sharing no pages; it makes no forks."""

    def cannot_fork(self) -> str | None:
        return "it checkpoints through the gpucr daemon, which does not fork processes"

    def cannot_save_points(self) -> str | None:
        return None

    def copy_checkpoint(self, cid: str, reason: str, extra: dict[str, Any] | None = None,
                        drop: tuple[str, ...] = ()) -> Checkpoint:
        """The daemon copies it in its store (only what a client may record is added or dropped)."""
        result = self.client.call("copy", checkpoint_id=cid, reason=reason, extra=extra or {}, drop=list(drop))
        return self.store.mirror(result["id"], result["manifest"])

    def image_files(self, ckpt: Checkpoint) -> builtins.list[RegFile]:
        return [RegFile(**f) for f in self.client.call("files", checkpoint_id=ckpt.id)["files"]]

    def share_pages(self, cid: str, base_id: str) -> int | None:
        return None

    def __init__(self, store: Store | str | Path | None, socket_path: str | Path = DEFAULT_SOCKET, keep_last: int = 1,
                 max_bytes: int | None = None) -> None:
        self.client = DaemonClient(socket_path)
        root = store.root if isinstance(store, Store) else store
        self.store = DaemonStore(root, self.client)
        self.keep_last = keep_last
        self.max_bytes = max_bytes

    def unavailable_reason(self) -> str | None:
        return self.client.unavailable_reason()

    def run(self, name: str, command: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
            detach: bool = True) -> Running:
        """Start ``command`` as this user, in its own namespaces, through the daemon."""
        env = dict(os.environ if env is None else env)
        result = self.client.call("run", name=name, command=command, cwd=str(cwd or os.getcwd()), env=env)
        return self._running(result)

    def checkpoint(self, target: str, leave_running: bool = False, reason: str = "manual",
                   extra: dict[str, Any] | None = None, progress: Progress = _no_progress,
                   before_dump: Callable[[], None] | None = None, also_durable: Sequence[Path] = (),
                   incremental: bool = False, running_again: RunningAgain | None = None) -> Checkpoint:
        """See ``Checkpointer.checkpoint``: the daemon asks for ``before_dump`` once the GPU is free,
        before CRIU freezes the process. What ``before_dump`` raises is raised here (the daemon
        left the process running). Its dumps are full: with ``incremental`` the manifest's
        ``memory`` says so. ``running_again`` is never called: the daemon answers once the
        checkpoint is complete."""
        fsync_trees(also_durable)  # on disk before the daemon's dump ends the process
        failed: list[BaseException] = []

        def ready() -> None:
            try:
                if before_dump is not None:  # never asked for then
                    before_dump()
            except BaseException as e:
                failed.append(e)
                raise

        try:
            result = self.client.call("checkpoint", progress, before_dump=ready, name=target, leave_running=leave_running,
                                      reason=reason, extra=extra or {}, ask_before_dump=before_dump is not None,
                                      **({"incremental": True} if incremental else {}))  # only a save point asks: older daemons take the rest
        except PutBackError as e:  # the daemon restored it from the images it wrote: adopted as a restore's
            if isinstance(e.started, dict):
                e.started = self._running(e.started).started
            raise
        except GPUCRError as e:
            if failed and not isinstance(failed[0], GPUCRError):
                raise failed[0] from e
            raise
        ckpt = self.store.mirror(result["id"], result["manifest"])
        self.store.write_proc(target, result["record"])
        for cid in set(self.store.checkpoint_ids(target)) - set(result["kept"]):
            if _mirrored(self.store.checkpoints_root / cid):
                self.store.forget(cid)  # the daemon's retention deleted it
        return ckpt

    def restore(self, name: str, gpu: str | int | None = "auto", checkpoint_id: str | None = None,
                progress: Progress = _no_progress, detach: bool = True,
                gpu_bytes_beside: Mapping[str, int] | None = None) -> Running:
        """See ``Checkpointer.restore``. The files of the kernel's folder copied since its checkpoint
        (a trash entry's) are named in this store's record, not in the daemon's, which replaces it."""
        copied = read_record(self.store.procs_root / name).get("copied_files") or []
        result = self.client.call("restore", progress, name=name, gpu=gpu, checkpoint_id=checkpoint_id,
                                  gpu_bytes_beside=dict(gpu_bytes_beside or {}))
        running = self._running(result, result.get("timings", {}))
        running.relocated = {p: p for p in copied}
        return running

    def await_pages(self, name: str) -> None:
        """See ``Checkpointer.await_pages``; the daemon waits."""
        self.client.call("await_pages", name=name)

    def recover_all(self, wait_s: float = RECOVER_WAIT) -> dict[str, Recovery]:
        """Recovery runs in the daemon; then this store mirrors what the daemon has (a server killed
        after a suspend but before writing its mirror loses nothing)."""
        result = self.client.call("recover_all")
        self._sync(result)
        return {name: Recovery(**r) for name, r in result["recovered"].items()}

    def list(self) -> list[dict[str, Any]]:
        result = self.client.call("list")
        self._sync(result)
        return result["status"]

    def remove(self, target: str, kill: bool = False) -> builtins.list[str]:
        try:
            removed = self.client.call("remove", target=target, kill=kill)["removed"]
        except NotFoundError:
            removed = []
        for cid in self.store.checkpoint_ids(target) if (self.store.procs_root / target).is_dir() else [target]:
            if (self.store.checkpoints_root / cid).is_dir():
                self.store.forget(cid)
        if (self.store.procs_root / target).is_dir():
            self.store.remove_proc(target)
        return removed

    def _running(self, result: dict[str, Any], timings: dict[str, float] | None = None) -> Running:
        name = result["name"]
        self.store.write_proc(name, result["record"])
        holder = RemoteHolder(self.client, name, result["holder_pid"])
        started = Started(holder, result["holder_pid"], result["pid"], result["ns_pid"])  # type: ignore[arg-type]
        return Running(name, result["pid"], result["ns_pid"], started, result["record"], timings or {})

    def _sync(self, state: dict[str, Any]) -> None:
        """Mirror the daemon's records and checkpoints; drop mirrors of what it no longer has.
        Checkpoints in this store's trash stay there."""
        trashed = {p.name for p in self.store.trash_root.glob("*/checkpoints/*")}
        theirs = {c["id"]: c["manifest"] for c in state["checkpoints"]}
        for cid, manifest in theirs.items():
            if cid not in trashed and not (self.store.checkpoints_root / cid / MANIFEST).exists():
                self.store.mirror(cid, manifest)
        for cid in self.store.checkpoint_ids():
            if cid not in theirs and _mirrored(self.store.checkpoints_root / cid):
                self.store.forget(cid)
        trashed_names = {(read_json(p / "trash.json") or {}).get("name") for p in self.store.trash_root.glob("*")}
        for name, rec in state["procs"].items():
            local = read_record(self.store.procs_root / name)
            if local.get("engine") == "snapshot":
                continue  # suspended by the snapshot engine: this store's record is the true one
            if name not in trashed_names or local:
                self.store.write_proc(name, rec)
