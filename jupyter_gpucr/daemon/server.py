"""The daemon: runs as root, serves one request per connection on a Unix socket.

Authorization comes from the socket, never from the request: SO_PEERCRED gives the peer's uid, and
each uid has its own store (``STATE/users/UID``, root-owned, 0700), so a user can name only what the
daemon started or restored for that uid. Before touching a process the daemon also checks that its
whole tree still runs as that uid inside the namespace the daemon made. The store is root-only on
purpose: CRIU restores as root whatever credentials an image holds, so images a user could write
would be a way to root.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import pwd
import resource
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from .._version import __version__
from ..core.checkpointer import Checkpointer
from ..core.criu.commands import NETWORK_LOCKS_MAX, find_criu
from ..core.criu.images import read_image
from ..core.errors import EngineError, GPUCRError, InvalidNameError, NotFoundError, PreconditionError, PutBackError, StateError
from ..core.files import make_private_dir
from ..core.process.identity import ProcId
from ..core.process.launcher import HolderRecord, Started, clean_env
from ..core.process.procs import is_alive, tree, wait_gone
from ..core.process.record import ProcRecord
from ..core.process.running import Running
from ..core.storage.names import validate_name
from ..core.storage.store import Checkpoint, Store, write_json_atomic
from .caller import caller_of, cgroup_of
from .criu_as_owner import CGROUP_FLAG, OWNER_FLAG
from .guard import Owner, RestoreGuard, deleted_files, external_files
from .listener import Connection, Credentials, Limits, Listener
from .ownership import check_credentials, freeze_checked, launched
from .protocol import DEFAULT_SOCKET, DEFAULT_STATE, PROTOCOL_VERSION, VERBS, ProtocolError, error_from, printable
from .quotas import Quotas, QuotaSettings, mib, parse_size

log = logging.getLogger("gpucr-daemon")
DROPEXEC = Path(__file__).with_name("dropexec.py")
CRIU_AS_OWNER = Path(__file__).with_name("criu_as_owner.py")
#: What the root processes of a launch (unshare, the holder) see; the user's own environment is
#: applied only after the privileges are dropped (dropexec).
ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
Progress = Callable[[str, int, int], None]
#: How long a checkpoint asked with ``ask_before_dump`` waits, the GPU freed, for the client to get
#: the process ready to be frozen (a Jupyter server closes its connections to the kernel).
BEFORE_DUMP_WAIT = 60.0
#: Why the daemon's save points hold all their pages: it chains none of its images to others.
FULL_DUMPS = "the gpucr daemon dumps every save point in full"


@dataclass(frozen=True)
class Peer:
    """Who is asking, from the socket."""

    pid: int
    uid: int
    gid: int

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)


class Daemon:
    """The verbs, each for one peer; see the module docstring."""

    def __init__(self, state_dir: Path, criu_path: str | None = None, keep_last: int = 1, quotas: Quotas | None = None) -> None:
        self.state_dir = state_dir
        self.quotas = quotas or Quotas(state_dir, keep_last=keep_last)
        self.criu_path = _criu_wrapper(state_dir, criu_path)
        self.keep_last = keep_last
        self._holders: dict[tuple[int, str], subprocess.Popen] = {}
        self._lock = threading.Lock()

    def checkpointer(self, peer: Peer) -> Checkpointer:
        users = make_private_dir(make_private_dir(self.state_dir) / "users")
        store = Store(make_private_dir(users / str(peer.uid)))
        cr = Checkpointer(store, criu_path=self.criu_path, keep_last=self.keep_last,
                          restore_check=RestoreGuard(Owner.of(peer.uid), store.root))
        cr.full_dumps = FULL_DUMPS
        return cr

    def dispatch(self, peer: Peer, op: str, args: dict[str, Any], progress: Progress,
                 before_dump: Callable[[], None] | None = None) -> Any:
        if op not in VERBS:
            raise ProtocolError(f"Unknown request {op!r}.", f"The daemon knows: {', '.join(VERBS)}.")
        method = getattr(self, f"op_{op}")
        try:
            with self.quotas.around(op, peer.uid, args) as before_commit:
                if op == "checkpoint":
                    return method(peer, progress=progress, before_dump=before_dump, before_commit=before_commit, **args)
                return method(peer, progress=progress, **args) if op == "restore" else method(peer, **args)
        except TypeError as e:
            raise ProtocolError(f"Bad arguments for {op!r}: {e}") from None

    # -- verbs ---------------------------------------------------------------------------
    def op_hello(self, peer: Peer) -> dict[str, Any]:
        cr = self.checkpointer(peer)
        try:
            criu = f"CRIU {cr.criu.version_string} at {cr.criu.path}"
        except GPUCRError as e:
            raise EngineError(f"The gpucr daemon cannot run CRIU: {e.message}", e.hint) from None
        return {"protocol": PROTOCOL_VERSION, "version": __version__, "uid": peer.uid, "user": peer.user, "criu": criu}

    def op_run(self, peer: Peer, name: str, command: list[str], cwd: str, env: dict[str, str]) -> dict[str, Any]:
        """Start ``command`` for the peer, as the peer's user, in a PID and mount namespace of its own.

        What the process keeps of the calling process: its uid and the user's primary gid; its
        supplementary groups, as far as the group database gives them to the user; its no_new_privs
        flag; its cgroup (v2), where the daemon can move the process there (else it stays in the
        daemon's cgroup, and the daemon's log says so). What it does not keep: the caller's
        namespaces. The process runs in a fresh PID and mount namespace that the daemon (root)
        makes, but in the host's user, network, IPC, UTS, time and cgroup namespaces and on the
        host's root filesystem, since CRIU restores a tree only into namespaces it can make again:
        a caller confined by user, PID or mount namespaces of its own (a container, a sandbox) gets a
        process outside them. Nor does it keep the caller's seccomp filters, LSM profile or rlimits
        (it gets the daemon's), or any environment but the one sent, applied once the privileges
        are dropped (``dropexec``)."""
        _name(name)
        if not (command and all(isinstance(a, str) for a in command)):
            raise ProtocolError("The command must be a non-empty list of strings.")
        if not (isinstance(cwd, str) and cwd.startswith("/")) or not _str_dict(env):
            raise ProtocolError("cwd must be an absolute path and env a mapping of strings.")
        cr = self.checkpointer(peer)
        caller = caller_of(peer.pid, Owner.of(peer.uid))
        env_file = cr.store.proc_dir(name) / f".env-{secrets.token_hex(8)}"
        write_json_atomic(env_file, clean_env(env))
        wrapped = [sys.executable, "-I", "-S", str(DROPEXEC), f"--uid={peer.uid}", f"--env-file={env_file}", f"--cwd={cwd}",
                   *caller.dropexec_args(), "--", *command]
        try:
            running = cr.run(name, wrapped, cwd="/", env=ROOT_ENV, detach=True)
        except BaseException:
            env_file.unlink(missing_ok=True)  # on success dropexec deletes it once read
            raise
        running.record.update({"command": command, "cwd": cwd, "uid": peer.uid, "user": peer.user, "via": "daemon",
                               "groups": list(caller.groups), "cgroup": caller.cgroup})
        cr.store.write_proc(name, running.record)
        _await_dropped(running.pid, peer.uid)
        return self._adopt(peer, running)

    def op_checkpoint(self, peer: Peer, name: str, progress: Progress, before_dump: Callable[[], None] | None,
                      before_commit: Callable[[], None] | None, leave_running: bool = False, reason: str = "manual", extra: dict[str, Any] | None = None,
                      ask_before_dump: bool = False, incremental: bool = False) -> dict[str, Any]:
        """With ``ask_before_dump``, once the GPU is free the daemon asks the client (``before_dump``)
        and waits for its answer before CRIU freezes the process, as a local checkpoint calls its
        ``before_dump``; a refusal or no answer leaves the process running. ``incremental`` (a save
        point's dump) only has the manifest say why the dump is full (``FULL_DUMPS``)."""
        cr = self.checkpointer(peer)
        rec = cr.store.read_proc(_name(name))
        if rec.get("state") == "running" and is_alive(rec.get("pid")):
            try:
                holder = _check_owner(cr.store.procs_root / name, rec, peer)
            except GPUCRError as e:
                e.message = e.message.rstrip(". ") + ". The process was left running."
                raise
            _refuse_deleted_files(name, cast(int, rec["pid"]))
            # checked again once frozen: in between, a task could have run a set-user-ID program
            cr.criu.before_seize = functools.partial(_frozen_for_dump, holder, Owner.of(peer.uid), name)
            cr.criu.enter_namespaces_of = holder.holder  # never the namespaces the user's processes made
            cr.criu.owner_args = [*_owner_args(peer, rec), *(f"--external={f}" for f in
                                                              external_files(cast(int, rec["pid"]), cr.store.proc_dir(name)))]
        extra = {**_client_extra(extra), "owner": {"uid": peer.uid, "user": peer.user}}
        try:
            ckpt = cr.checkpoint(name, bool(leave_running), str(reason), extra, progress,
                                 before_dump if ask_before_dump is True else None, incremental=incremental is True,
                                 before_commit=before_commit)
        except PutBackError as e:  # the process runs again under a new holder: tracked here, adopted by the client
            started = cast(Started, e.started)
            e.started = self._adopt(peer, Running(name, started.pid, started.ns_pid, started, cr.store.read_proc(name)))
            raise
        return {"id": ckpt.id, "manifest": ckpt.manifest, "kept": cr.store.checkpoint_ids(name), "record": cr.store.read_proc(name)}

    def op_restore(self, peer: Peer, name: str, progress: Progress, checkpoint_id: str | None = None,
                   gpu: str | int | None = "auto", gpu_bytes_beside: dict[str, int] | None = None) -> dict[str, Any]:
        cr = self.checkpointer(peer)
        _name(name)
        ckpt = cr.store.get(checkpoint_id) if checkpoint_id else cr.store.latest(name)
        if ckpt is None or ckpt.name != name:
            raise NotFoundError(f"{name!r} has no checkpoint {checkpoint_id or ''}".strip() + ".", "List them with 'gpucr ls'.")
        _check_made_for(ckpt, peer)
        beside = gpu_bytes_beside or {}
        if not (isinstance(beside, dict) and all(isinstance(k, str) and isinstance(v, int) and v >= 0
                                                 for k, v in beside.items())):
            raise ProtocolError("gpu_bytes_beside must map GPU UUIDs to byte counts.")
        rec = cr.store.read_proc(name)
        cr.criu.owner_args = [*_owner_args(peer, rec), *([f"{CGROUP_FLAG}{rec['cgroup']}"] if rec.get("cgroup") else [])]
        running = cr.restore(name, gpu, ckpt.id, progress, True, beside)
        try:
            _check_owner(cr.store.procs_root / name, running.record, peer)
        except GPUCRError:
            _kill_tree(running.pid)
            raise
        return {**self._adopt(peer, running), "timings": running.timings}

    def op_recover(self, peer: Peer, name: str) -> dict[str, Any]:
        cr = self.checkpointer(peer)
        return {"recovered": {name: cr.recover(_name(name)).to_dict()}, **_state(cr)}

    def op_recover_all(self, peer: Peer) -> dict[str, Any]:
        cr = self.checkpointer(peer)
        return {"recovered": {n: r.to_dict() for n, r in cr.recover_all().items()}, **_state(cr)}

    def op_list(self, peer: Peer) -> dict[str, Any]:
        cr = self.checkpointer(peer)
        return {"status": cr.list(), **_state(cr)}

    def op_remove(self, peer: Peer, target: str, kill: bool = False) -> dict[str, Any]:
        cr = self.checkpointer(peer)
        _name(target)
        if (cr.store.checkpoints_root / target).is_dir() and not (cr.store.procs_root / target).is_dir():
            name = cr.store.get(target).name
            cr.store.delete(target)
            rec = cr.store.read_proc(name) if cr.store.has_proc(name) else None
            if rec is not None and not cr.store.checkpoint_ids(name) and not is_alive(rec.get("pid")):
                cr.store.remove_proc(name)
            return {"removed": [target]}
        rec = cr.store.read_proc(target)
        if kill and rec.get("state") == "running" and is_alive(rec.get("pid")):
            launched(cr.store.procs_root / target, rec)  # what it started, whatever that runs now
        return {"removed": cr.remove(target, kill=bool(kill))}

    def op_kill(self, peer: Peer, name: str) -> dict[str, Any]:
        """End the whole namespace of a process the daemon started or restored for this user (its
        recorded holder, whatever the process runs now: the user may end their own set-ID programs)."""
        cr = self.checkpointer(peer)
        rec = cr.store.read_proc(_name(name))
        pid = rec.get("pid") if rec.get("state") == "running" and is_alive(rec.get("pid")) else None
        if pid is None:
            return {"killed": False}
        _kill_holder(launched(cr.store.procs_root / name, rec).holder)
        wait_gone(pid, 10)
        return {"killed": True}

    def op_await_pages(self, peer: Peer, name: str) -> dict[str, Any]:
        """Answer once a lazy restore of ``name`` has all its memory back; an error if it never will."""
        cr = self.checkpointer(peer)
        cr.await_pages(_name(name))
        return {}

    def op_copy(self, peer: Peer, checkpoint_id: str, reason: str, extra: dict[str, Any] | None = None,
                drop: list[str] | None = None) -> dict[str, Any]:
        """A copy of one of the peer's checkpoints in the peer's store, of hard links (a save point
        of a suspended process, the copy of a save point a process goes back to); see
        ``Store.copy_checkpoint``. Only what a client may record (``CLIENT_EXTRA``) is added or dropped."""
        if not (isinstance(reason, str) and reason.isidentifier() and len(reason) <= 40):
            raise ProtocolError("The reason must be a short identifier.")
        cr = self.checkpointer(peer)
        _check_made_for(cr.store.get(checkpoint_id), peer)
        dropped = tuple(k for k in drop or () if k in CLIENT_EXTRA)
        ckpt = cr.store.copy_checkpoint(checkpoint_id, reason, _client_extra(extra), dropped)
        return {"id": ckpt.id, "manifest": ckpt.manifest}

    def op_files(self, peer: Peer, checkpoint_id: str) -> dict[str, Any]:
        """The files the image of one of the peer's checkpoints has open or mapped (``RegFile``),
        which the peer may not read there: a server checks their sizes before it goes back."""
        cr = self.checkpointer(peer)
        ckpt = cr.store.get(checkpoint_id)
        _check_made_for(ckpt, peer)
        return {"files": [asdict(f) for f in read_image(ckpt.images).files]}

    def op_in_trash(self, peer: Peer, checkpoint_id: str, held: bool) -> dict[str, Any]:
        """Mark one of the peer's checkpoints as held in the peer's trash (``held``), or no longer.
        The client's trash holds only its manifest: a held checkpoint is kept out of the way as that
        trash would keep it (never the latest, never deleted by retention) until it is put back or
        removed (``remove``, when the trash entry is deleted); the store quota counts it."""
        if not isinstance(held, bool):
            raise ProtocolError("held must be true or false.")
        cr = self.checkpointer(peer)
        _check_made_for(cr.store.get(checkpoint_id), peer)
        cr.store.set_in_trash(checkpoint_id, held)
        return {}

    def op_poll(self, peer: Peer, name: str) -> dict[str, Any]:
        holder = self._holders.get((peer.uid, _name(name)))
        return {"returncode": holder.poll() if holder else None}

    def _adopt(self, peer: Peer, running: Running) -> dict[str, Any]:
        """Remember the holder of a process just started or restored (for exit codes) and reap it
        when it exits."""
        assert running.started is not None
        _say_where(peer, running)
        popen = running.started.popen
        with self._lock:
            self._holders[(peer.uid, running.name)] = popen
        threading.Thread(target=popen.wait, daemon=True, name=f"reap-{popen.pid}").start()
        return {"name": running.name, "pid": running.pid, "ns_pid": running.ns_pid, "holder_pid": running.started.holder_pid,
                "record": running.record}


def _criu_wrapper(state_dir: Path, criu_path: str | None) -> str | None:
    """The daemon's criu: the real one behind criu_as_owner.py (see there); None when none is found."""
    real = find_criu(criu_path)
    if real is None:
        return criu_path
    wrapper = make_private_dir(state_dir) / "criu"
    tmp = wrapper.with_name(".criu.tmp")
    tmp.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(CRIU_AS_OWNER))} "
                   f"{shlex.quote(os.path.abspath(real))} \"$@\"\n")
    os.chmod(tmp, 0o700)
    os.replace(tmp, wrapper)
    return str(wrapper)


def _name(name: Any) -> str:
    """A process name of this user's store; digits alone would be read as a host PID by the core."""
    validate_name(name)
    if name.isdigit():
        raise InvalidNameError(f"Invalid name {name!r}: the daemon takes names, not PIDs.")
    return name


def _str_dict(d: Any) -> bool:
    return isinstance(d, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in d.items())


def _check_owner(proc_dir: Path, rec: ProcRecord, peer: Peer) -> HolderRecord:
    """The recorded process is one the daemon started or restored for the peer (``ownership.launched``)
    and every thread of its tree has only the peer's own credentials; its holder's record."""
    holder = launched(proc_dir, rec)
    check_credentials(cast(int, rec["pid"]), Owner.of(peer.uid), str(rec.get("name")))
    return holder


def _check_made_for(ckpt: Checkpoint, peer: Peer) -> None:
    """The checkpoint (of the peer's store) was made for the peer."""
    if (ckpt.manifest.get("owner") or {}).get("uid") != peer.uid:
        raise StateError(f"Checkpoint {ckpt.id} was not made for uid {peer.uid}.")


def _frozen_for_dump(holder: HolderRecord, owner: Owner, name: str, pid: int) -> Callable[[], None]:
    """CRIU's ``before_seize`` for a dump of ``name``: the tree is still the checked one, frozen,
    with the owner's credentials only; what continues it."""
    if holder.workload is None or pid != holder.workload.pid:
        raise StateError(f"{name!r} changed while it was being checkpointed (PID {pid}).", "Try again.")
    return freeze_checked(holder.workload, owner, name, holder.holder)


def _kill_holder(holder: ProcId) -> None:
    """SIGKILL a recorded holder through a pidfd (never a later process under its PID); its
    namespace ends with it (``unshare --kill-child``)."""
    try:
        fd = os.pidfd_open(holder.pid)
    except ProcessLookupError:
        return
    try:
        if holder.alive():
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def _await_dropped(pid: int, uid: int, timeout: float = 10.0) -> None:
    """Return once ``dropexec`` (``pid``) has become the user, or ended: until then the process
    runs as root, and a checkpoint asked for right after ``run`` would be refused for that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                uids = next(line.split()[1:] for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            return
        if uids == [str(uid)] * 4:
            return
        time.sleep(0.002)


def _say_where(peer: Peer, running: Running) -> None:
    """Log a process that is not in the cgroup recorded when it was started (``dropexec`` joins it
    for ``run``, the restore's CRIU before it creates anything): one the daemon could not put there."""
    folder, now = running.record.get("cgroup"), cgroup_of(running.pid)
    if folder is None:
        log.info("uid %d: %r: no cgroup v2 was recorded for it; PID %d runs in %s", peer.uid, running.name, running.pid, now)
    elif now != folder:
        log.warning("uid %d: %r: PID %d runs in %s, not in its cgroup %s", peer.uid, running.name, running.pid, now, folder)


def _owner_args(peer: Peer, rec: ProcRecord) -> list[str]:
    """Whose credentials CRIU runs with (``criu_as_owner``): the peer's uid and gid, and the groups
    the process was started with (the image's: CRIU then needs no right to set groups)."""
    owner = Owner.of(peer.uid)
    groups = rec.get("groups") if isinstance(rec.get("groups"), list) else sorted(owner.groups)
    return [f"{OWNER_FLAG}{owner.uid}:{owner.gid}:{','.join(str(int(g)) for g in groups)}"]


#: What of a client's ``extra`` a checkpoint's manifest keeps: what the Jupyter server records of its
#: kernel, for its own listing. Nothing a step of the daemon reads (open files, owner, sizes) can come
#: from a client.
CLIENT_EXTRA = ("kernel", "engine_reason", "offload", "portable", "savepoint", "from_savepoint")


def _client_extra(extra: Any) -> dict[str, Any]:
    return {k: extra[k] for k in CLIENT_EXTRA if k in extra} if isinstance(extra, dict) else {}


def _refuse_deleted_files(name: str, pid: int) -> None:
    """A restore would have to recreate them as root (see guard): refused now, while it runs."""
    deleted = deleted_files(pid)
    if deleted:
        raise PreconditionError(f"{name!r} holds files that have been deleted: {', '.join(deleted[:5])}. The gpucr daemon "
                                "does not checkpoint deleted files, which a restore would recreate as root. The process "
                                "was left running.", "Close them in the process (or keep them undeleted), then suspend again.")


def _kill_tree(pid: int) -> None:
    for p in reversed(tree(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _state(cr: Checkpointer) -> dict[str, Any]:
    """Every record and complete checkpoint of one user's store, for the client's mirror."""
    procs = {n: cr.store.read_proc(n) for n in cr.store.proc_names()}
    return {"procs": procs, "checkpoints": [{"id": c.id, "manifest": c.manifest} for c in cr.store.list_checkpoints()]}


def answer(daemon: Daemon, creds: Credentials, msg: dict[str, Any], conn: Connection) -> None:
    """One request: dispatch it, log it, send its progress and its result. What the request names
    goes into the log escaped (``printable``): it comes from the user."""
    pid, uid, gid = creds
    peer = Peer(pid, uid, gid)
    send = conn.send

    def progress(phase: str, done: int, total: int) -> None:
        send({"progress": [phase, done, total]})  # a client gone away: the operation still finishes

    def before_dump() -> None:
        reply = conn.ask({"before_dump": True}, BEFORE_DUMP_WAIT)
        if reply is None:
            raise StateError(f"The client did not get the process ready to be frozen within {BEFORE_DUMP_WAIT:.0f} s.",
                             "Try again.")
        if reply.get("ok") is not True:
            raise error_from(reply.get("error") or {})

    op: Any = msg.get("op")
    args: Any = msg.get("args") or {}
    what = printable(args.get("name") or args.get("target") or "") if isinstance(args, dict) else ""
    try:
        if not isinstance(args, dict):
            raise ProtocolError("args must be a JSON object.")
        result = daemon.dispatch(peer, str(op), args, progress, before_dump)
        log.info("uid %d (pid %d): %s %s: ok", uid, pid, printable(op), what)
        send({"ok": True, "result": result})
    except GPUCRError as e:
        log.info("uid %d (pid %d): %s %s refused or failed: %s", uid, pid, printable(op), what, printable(e, 2000))
        send({"ok": False, "error": e.to_dict()})
    except Exception as e:  # noqa: BLE001 - the client gets an answer, the daemon keeps serving
        log.error("uid %d (pid %d): %s %s crashed: %s\n%s", uid, pid, printable(op), what, printable(repr(e), 2000),
                  "".join(traceback.format_tb(e.__traceback__)))
        send({"ok": False, "error": EngineError(f"The gpucr daemon failed: {e}").to_dict()})


def _raise_open_files_limit() -> None:
    """Every connection holds a descriptor while it is served: take all the hard limit allows
    (processes the daemon starts inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpucr-daemon", description="Checkpoint and restore processes for unprivileged users.")
    parser.add_argument("--socket", default=os.environ.get("GPUCR_DAEMON_SOCKET", DEFAULT_SOCKET))
    parser.add_argument("--state-dir", default=DEFAULT_STATE, help="root-only directory of the per-user stores")
    parser.add_argument("--criu", default=None, help="criu binary (default: search)")
    parser.add_argument("--keep-last", type=int, default=1, help="checkpoints kept per process")
    limits = parser.add_argument_group("limits", "what one user may take of the daemon and the host")
    limits.add_argument("--max-requests-per-user", type=int, default=Limits.per_user, metavar="N",
                        help="open requests of one uid at a time; a checkpoint or restore holds one while it runs "
                        "(default: %(default)s)")
    limits.add_argument("--max-requests", type=int, default=Limits.total, metavar="N",
                        help="open requests of all users together (default: %(default)s)")
    limits.add_argument("--request-timeout", type=float, default=Limits.request_timeout, metavar="SECONDS",
                        help="how long a client may take to send its request (default: %(default)s)")
    limits.add_argument("--store-quota", default="50%", metavar="SIZE",
                        help="bytes of checkpoints and logs per user; a checkpoint that would pass it is refused "
                        "up front, the process left running: 200G, or a share of the state directory's file "
                        "system such as 25%%; 0 for none (default: %(default)s)")
    limits.add_argument("--log-quota", default="64M", metavar="SIZE",
                        help="bytes of each of a running process's stdout.log and stderr.log; past it the oldest "
                        "half is cut (default: %(default)s; 0 for none)")
    limits.add_argument("--network-locks-per-user", type=int, default=QuotaSettings.locks_per_user, metavar="N",
                        help=f"CRIU network locks (one per suspended process, the host has {NETWORK_LOCKS_MAX}) a "
                        "user's checkpoints hold; a suspend past it releases the locks of that user's oldest "
                        "checkpoints (default: %(default)s; 0 for none)")
    args = parser.parse_args(argv)
    state = Path(args.state_dir)
    try:
        store_quota, log_quota = parse_size(args.store_quota, state), parse_size(args.log_quota)
    except ValueError as e:
        parser.error(f"{e} (sizes look like 64M, 20G, 25%, or 0 for none)")
    if min(args.max_requests_per_user, args.max_requests) < 1 or args.request_timeout <= 0:
        parser.error("the request limits and the timeout must be positive")
    if log_quota is not None and log_quota < (16 << 10):
        parser.error("--log-quota must be at least 16K (or 0 for none)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpucr-daemon %(levelname)s %(message)s")
    if os.geteuid() != 0:
        log.error("gpucr-daemon must run as root (it runs CRIU for other users).")
        return 2
    _raise_open_files_limit()
    quotas = Quotas(state, QuotaSettings(store_quota, log_quota, args.network_locks_per_user or None),
                    args.keep_last)
    daemon = Daemon(state, args.criu, args.keep_last, quotas)
    try:
        listener = Listener(Path(args.socket), functools.partial(answer, daemon),
                            Limits(args.max_requests_per_user, args.max_requests, args.request_timeout))
    except GPUCRError as e:
        log.error("%s", e)
        return 1
    quotas.start()
    signal.signal(signal.SIGTERM, lambda *_: listener.shutdown())
    log.info("listening on %s, stores in %s/users (version %s); per user: %d requests at a time, %s of store, "
             "%s per log, %s network locks", args.socket, state, __version__, args.max_requests_per_user,
             mib(store_quota) if store_quota else "no limit", mib(log_quota) if log_quota else "no limit",
             args.network_locks_per_user or "no limit on")
    try:
        listener.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        quotas.stop()
        listener.close()
        Path(args.socket).unlink(missing_ok=True)
    log.info("stopped; the processes it started keep running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
