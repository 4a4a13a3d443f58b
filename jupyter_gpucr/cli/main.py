"""``gpucr`` / ``jupyter gpucr``: the checkpointer for any process, from a shell or a program.

Human output by default, ``--json`` for programs; exit code 0 on success, 1 on a gpucr
error (message and hint on stderr), 2 on bad usage.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import urllib.parse
from typing import Any

from ..core.checkpointer import Checkpointer
from ..core.errors import GPUCRError, StateError
from ..core.gpu.roomreport import kernel_lines
from ..core.objectstore import leases, transfer
from ..core.objectstore.bucket import ObjectStore, is_url
from ..core.objectstore.retention import apply_retention
from ..core.objectstore.sealing import key_file_from_environment, load_key, previous_key_files_from_environment
from ..core.pausing.activation import WakeOn
from ..core.pausing.group import join as join_group
from ..core.pausing.group import member_log, members
from ..core.pausing.waker import read_status, restart_wakers, start_waker
from ..core.process.owners import owner_of
from ..core.process.procs import is_alive
from ..core.process.record import ProcRecord
from ..core.storage.openfiles import OpenFiles
from ..core.storage.store import name_of_id
from .doctor import doctor
from .install_criu import install
from .server_client import call, find_server


def _size(size: int | None) -> str:
    if not size:
        return "-"
    n = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpucr", description="Checkpoint and restore whole (GPU) processes.")
    p.add_argument("--store", help="checkpoint store directory (default $GPUCR_STORE or ~/.local/share/jupyter-gpucr), "
                   "or object storage (s3://bucket/prefix: checkpoint uploads, restore downloads, the default directory caches)")
    p.add_argument("--encryption-key-file", metavar="FILE",
                   help="with object storage: encrypt what goes into the store with the 256-bit key in FILE (AES-256-GCM; "
                   "the user's own file, mode 0600; default $GPUCR_ENCRYPTION_KEY_FILE); restores need the same key")
    p.add_argument("--previous-encryption-key-file", metavar="FILE", action="append", default=[],
                   help="with object storage, after a key rotation: a key --encryption-key-file held before, which "
                   "opens the checkpoints it encrypted (checked as that file is; repeatable; default "
                   "$GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES, separated by os.pathsep); new checkpoints use the current key")
    p.add_argument("--criu", help="path to the criu binary")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # --json works before or after the subcommand (gpucr --json ls, gpucr ls --json)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    s = add("doctor", help="what works on this machine, and how to fix what does not")
    s = add("run", help="start a process so that it can be checkpointed later")
    s.add_argument("--name", required=True)
    s.add_argument("--cwd")
    s.add_argument("--idle-timeout", type=float, metavar="S",
                   help="checkpoint the process after S seconds without connections and CPU use (needs --wake-on)")
    s.add_argument("--wake-on", action="append", default=[], metavar="ADDR",
                   help="tcp:HOST:PORT or unix:PATH the process listens on: a connection there restores it (repeatable)")
    s.add_argument("--group", metavar="SESSION", help="start the process as member NAME of SESSION (started with "
                   "its first member): its members are checkpointed, paused and restored together")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s = add("checkpoint", help="checkpoint a process (by default it is gone afterwards, its GPU free)")
    s.add_argument("target", help="NAME or PID")
    s.add_argument("--leave-running", action="store_true")
    s = add("restore", help="restore a process from its latest checkpoint")
    s.add_argument("name")
    s.add_argument("--gpu", default="auto", help="auto, a GPU index or a UUID")
    s.add_argument("--checkpoint", help="a specific checkpoint id")
    s.add_argument("--eager", action="store_true",
                   help="bring all memory back before the process runs (default: it runs at once, CRIU's "
                   "lazy-pages daemon brings the rest in behind it)")
    s = add("fork", help="copies of a process (running or checkpointed), each in its own namespaces")
    s.add_argument("name")
    s.add_argument("--as", dest="new", help="the fork's name (with --count N: NEW-1 ... NEW-N); default NAME-fork-I")
    s.add_argument("--count", type=int, default=1)
    s.add_argument("--gpu", default="auto", help="auto, a GPU index or a UUID")
    add("ls", help="list processes and checkpoints")
    s = add("kernel", help="suspend, resume or list the kernels of a running Jupyter server; room: the memory "
            "each GPU (and the host memory budget) holds, by kernel, and what idle kernels could make room of")
    s.add_argument("action", choices=["ls", "suspend", "resume", "room", "savepoint", "savepoints", "goback"],
                   help="savepoint: keep the kernel's whole state now (it is left as it was); savepoints: list "
                   "them; goback: return the kernel to one, under its id (the state it leaves goes to the trash)")
    s.add_argument("kernel_id", nargs="?")
    s.add_argument("savepoint_id", nargs="?", help="goback: the save point (default: the newest)")
    s.add_argument("--name", help="savepoint: a name for it")
    s.add_argument("--engine", choices=["auto", "criu", "snapshot"], help="suspend with this engine")
    s.add_argument("--gpu", help="resume onto auto, a GPU index or a UUID")
    s.add_argument("--label", help="ls: only the kernels with this label (an agent's run or thread id)")
    s.add_argument("--server", help="server URL (default: $GPUCR_SERVER_URL, else of the servers 'jupyter server list' "
                   "shows, the one with this kernel, or whose root folder holds the current folder, or the only one)")
    s.add_argument("--token", help="API token (default: $GPUCR_SERVER_TOKEN, $JUPYTER_TOKEN, or the found server's)")
    s = add("rm", help="remove a checkpoint id, or a name with all its checkpoints")
    s.add_argument("target")
    s.add_argument("--kill", action="store_true", help="also stop the process if it is running")
    s = add("recover", help="after a crash: finish or undo interrupted checkpoints and restores")
    s.add_argument("name", nargs="?", help="one name (default: every name in the store)")
    s = add("install-criu", help="install CRIU 4.2+ (a self-contained bundle) beside this Python, or into ~/.local")
    s.add_argument("--prefix", help="install as PREFIX/bin/criu")
    s.add_argument("--force", action="store_true", help="reinstall even when a working CRIU is there")
    s = add("trash", help="list, restore or delete what was put in the trash")
    s.add_argument("action", choices=["ls", "restore", "rm"])
    s.add_argument("trash_id", nargs="?")
    return p


def _ls_text(items: list[dict[str, Any]]) -> str:
    if not items:
        return "Nothing here yet. Start a process with: gpucr run --name NAME -- CMD"
    lines = [f"{'NAME':24} {'STATE':13} {'PID':>8} {'CHECKPOINT':40} {'SIZE':>10} CREATED"]
    for it in items:
        latest = it.get("latest") or {}
        lines.append(f"{it['name']:24} {it['state']:13} {it.get('pid') or '-':>8} {latest.get('id', '-'):40} "
                     f"{_size(latest.get('size')):>10} {_when(latest.get('created'))}")
        if it.get("waker"):
            lines.append(f"  {_waker_line(it['state'], it['waker'])}")
        if it.get("owner"):
            lines.append(f"  {_owner_line(it['owner'])}")
        lines.extend(f"  member {m['name']:17} {m['state']:13} {m.get('pid') or '-':>8} {shlex.join(m['command'])}"
                     for m in it.get("members", []))
        lines.extend(f"  damaged: {problem}" for problem in it.get("damaged", []))
    return "\n".join(lines)


def _waker_line(state: str, waker: dict[str, Any]) -> str:
    """What the waker of a process does, as ``gpucr ls`` says it under the process."""
    where = ", ".join(waker.get("wake_on", []))
    if not waker.get("alive") and waker.get("state") != "ended":
        return f"waker: not running (it holds {where}); run 'gpucr recover' to start it again"
    if state == "checkpointed":
        line = f"checkpointed (idle, wakes on {where})"
    else:
        line = f"waker: {waker.get('state')}, pauses after {waker.get('idle_timeout'):g} s idle, wakes on {where}"
    return line + (f"\n  last error: {waker['error']}" if waker.get("error") and waker.get("state") != "ended" else "")


def _trash_lines(items: list[dict[str, Any]]) -> str:
    if not items:
        return "The trash is empty."
    lines = [f"{'ID':44} {'TRASHED':19} {'SIZE':>10} {'ENGINE':8} WHAT"]
    for it in items:
        what = it.get("notebook_path") or (f"kernel {it['kernel_id']}" if it.get("kernel_id") else it["name"])
        lines.append(f"{it['id']:44} {_when(it['trashed_at']):19} {_size(it['size']):>10} {it.get('engine') or '-':8} "
                     f"{what} ({it['reason']})")
    return "\n".join(lines)


def _execute(args: argparse.Namespace) -> tuple[Any, str]:
    if args.cmd == "doctor":
        return doctor(args.store, args.criu)
    if args.cmd == "kernel":
        return _kernel_command(args)
    if args.cmd == "install-criu":
        return install(args.prefix, args.force)
    url = args.store or os.environ.get("GPUCR_STORE")
    remote = _object_store(url, args) if url and is_url(url) else None  # then this node's default store is the cache
    # uploaded checkpoints keep the scratch files the process holds open (the home is taken for shared)
    cr = Checkpointer(None if remote else args.store, criu_path=args.criu, open_files=OpenFiles() if remote else None)
    if args.cmd == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        wake_on = [WakeOn.parse(w) for w in args.wake_on]
        if bool(wake_on) != (args.idle_timeout is not None):
            raise StateError("--idle-timeout and --wake-on go together.",
                             "Example: gpucr run --name api --idle-timeout 300 --wake-on tcp:127.0.0.1:8000 -- CMD")
        if args.group:
            m = join_group(cr, args.group, args.name, command, args.cwd, wake_on=wake_on, idle_timeout=args.idle_timeout)
            said = f"Started {m.name!r} in the session {args.group!r} as PID {m.pid}; its output in {member_log(cr, args.group, m.name)}"
            if wake_on:
                said += f"; the session pauses after {args.idle_timeout:g} s idle, woken on {', '.join(map(str, wake_on))}"
            return m.record, said
        r = cr.run(args.name, command, cwd=args.cwd)
        said = f"Started {r.name!r} as PID {r.pid}; logs in {cr.store.proc_dir(r.name)}"
        if wake_on:
            start_waker(cr.store, r.name, wake_on, args.idle_timeout, args.criu)
            said += f"; paused after {args.idle_timeout:g} s idle, woken on {', '.join(map(str, wake_on))}"
        return r.record, said
    if args.cmd == "checkpoint":
        name, _ = cr.resolve(args.target)
        owner = owner_of(cr.store.procs_root / name)
        owned = owner is not None and owner.alive  # its owner's run must go on: never stopped under it
        leave_running = args.leave_running or owned
        c = cr.checkpoint(name, leave_running=leave_running)
        t = c.manifest["timings"]
        gpu = f", GPU free after {t['gpu_free']:.2f} s" if "gpu_free" in t else ""
        state = "left running" if leave_running else "stopped"
        if owned and not args.leave_running:
            assert owner is not None
            state += (f" (without --leave-running too): it is a kernel of {owner.describe()}, which goes on using "
                      "it; shut the kernel down there to free its memory")
        sent = ""
        if remote is not None:
            sent = f" Uploaded to {remote!r} in {transfer.upload(remote, cr.store, c)['seconds']:.2f} s."
            apply_retention(remote, c.name, cr.keep_last)  # its older checkpoints there go, as on this disk
            if not args.leave_running:  # durable in the store: any node may restore it now
                leases.release_lease(remote, c.name, leases.node_id(cr.store))
        return c.summary() | {"timings": t, "left_running": leave_running,
                              "owner": owner.to_dict() if owner else None}, (f"Checkpoint {c.id}: {_size(c.size)} in {t['total']:.2f} s{gpu}; "
                                             f"process {state}.{sent}")
    if args.cmd == "restore":
        _refuse_a_server_kernel(cr, args.name, args.checkpoint)
        _refuse_an_owned_kernel(cr, args.name)
        cr.lazy_restore = not args.eager
        if remote is not None and not args.checkpoint:  # claimed for this node; its newest checkpoint brought here
            transfer.missing_here(remote, cr.store, args.name)  # a key that does not open it: refused, no lease taken
            leases.take_lease(remote, args.name, leases.node_id(cr.store))
            newest = transfer.missing_here(remote, cr.store, args.name)  # what the lease's last holder uploaded
            if newest is not None:
                transfer.download(remote, cr.store, newest)
        r = cr.restore(args.name, gpu=args.gpu, checkpoint_id=args.checkpoint)
        where = f" onto GPU map {r.record['gpu_map']}" if r.record.get("gpu_map") else ""
        return r.record | {"timings": r.timings}, f"Restored {r.name!r} as PID {r.pid}{where} in {r.timings['total']:.2f} s."
    if args.cmd == "fork":
        names = ([args.new] if args.count == 1 else [f"{args.new}-{i}" for i in range(1, args.count + 1)]) \
            if args.new else None
        forks = cr.fork(args.name, count=args.count, names=names, gpu=args.gpu)
        return [f.record for f in forks], "\n".join(_fork_line(f.record) for f in forks)
    if args.cmd == "ls":
        items = [it | {"waker": w} if (w := read_status(cr.store, it["name"])) else it for it in cr.list()]
        items = [it | {"members": members(cr, it["name"], it)} if "members" in it else it for it in items]
        items = [it | {"owner": o.to_dict()} if (o := owner_of(cr.store.procs_root / it["name"])) else it for it in items]
        return items, _ls_text(items)
    if args.cmd == "rm":
        removed = cr.remove(args.target, kill=args.kill)
        if remote is not None and name_of_id(args.target) is None:  # a name, not one checkpoint: gone from the store too
            leases.forget(remote, args.target, leases.node_id(cr.store))
        return {"removed": removed}, f"Removed {args.target!r} ({len(removed)} checkpoint(s))."
    if args.cmd == "recover":
        results = {args.name: cr.recover(args.name)} if args.name else cr.recover_all()
        wakers = [n for n in restart_wakers(cr.store) if not args.name or n == args.name]
        return ({n: r.to_dict() for n, r in results.items()} | {"wakers_restarted": wakers},
                "\n".join([*(f"{r.outcome:10} {r.message}" for r in results.values()),
                           *(f"{'waker':10} started again for {n!r}: it holds its ports and wakes it on a connection"
                             for n in wakers)]) or "Nothing to recover.")
    if args.cmd == "trash":
        return _trash_command(cr, args)
    raise AssertionError(args.cmd)


def _object_store(url: str, args: argparse.Namespace) -> ObjectStore:
    """The store at ``url`` with the keys the options (else the environment) name."""
    key_file = args.encryption_key_file or key_file_from_environment()
    previous = args.previous_encryption_key_file or previous_key_files_from_environment()
    return ObjectStore(url, key=load_key(key_file) if key_file else None, previous_keys=[load_key(p) for p in previous])


def _fork_line(rec: ProcRecord) -> str:
    ports = ", ".join(f"{r['addr']}:{r['port']} -> {r['inner']}" for r in rec.get("netns", {}).get("relay", []))
    return f"Forked {rec['name']!r} as PID {rec['pid']}" + (f"; its ports from the host: {ports}" if ports else "") + "."


def _refuse_a_server_kernel(cr: Checkpointer, name: str, checkpoint_id: str | None) -> None:
    """A Jupyter kernel's checkpoint is the server's to restore: restored here, the kernel would
    run with no server connected (which still lists it as suspended), without the GPU tensors
    the server gives back after the restore."""
    ckpt = cr.store.get(checkpoint_id) if checkpoint_id else cr.store.latest(name)
    if ckpt is not None and ckpt.manifest.get("kernel"):
        raise StateError(f"{name!r} is a Jupyter kernel suspended by a Jupyter server; only that server restores it.",
                         f"Open its notebook, or run 'gpucr kernel resume {ckpt.name}' against the server.")


def _refuse_an_owned_kernel(cr: Checkpointer, name: str) -> None:
    """A kernel launched by the gpucr provisioner belongs to the program that launched it, which
    polls it and alone ends it. Restored here, it would be a process that program does not know:
    beside it while it runs, with nothing to connect to it or ever shut it down once it has ended."""
    owner = owner_of(cr.store.procs_root / name)
    if owner is None:
        return
    rec = cr.store.read_proc(name)
    if rec.get("state") == "running" and is_alive(rec.get("pid")):
        return  # the restore says it is already running
    if owner.state == "running":
        raise StateError(f"{name!r} is a kernel of {owner.describe()}, which still runs and no longer has it; "
                         "restored here, the kernel would run with nothing connected to it or ever ending it.",
                         f"Start a new kernel in that program; 'gpucr rm {name}' deletes the checkpoints.")
    why = "has ended" if owner.state == "ended" else "shut it down"
    raise StateError(f"{name!r} is a kernel of {owner.describe()}, which {why}: restored, it would run with no "
                     "client, and nothing would ever shut it down.",
                     f"Its checkpoints are kept; 'gpucr rm {name}' deletes them.")


def _owner_line(owner: dict[str, Any]) -> str:
    """Who owns a kernel, as ``gpucr ls`` says it under the process."""
    if owner["state"] == "running":
        return f"owner: running, {owner['description']}"
    return (f"owner: {'ended' if owner['state'] == 'ended' else 'shut the kernel down'}, {owner['description']}; "
            "'gpucr restore' refuses it")


def _trash_command(cr: Checkpointer, args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "ls":
        items = cr.store.list_trash()
        return items, _trash_lines(items)
    if not args.trash_id:
        raise GPUCRError(f"'gpucr trash {args.action}' needs a trash id.", "List them with 'gpucr trash ls'.")
    if args.action == "restore":
        name = cr.store.untrash(args.trash_id)
        return {"id": args.trash_id, "name": name}, f"Restored {name!r} from the trash; 'gpucr ls' lists it again."
    cr.store.delete_trash(args.trash_id)
    return {"id": args.trash_id, "deleted": True}, f"Deleted {args.trash_id} for good."


def _kernel_command(args: argparse.Namespace) -> tuple[Any, str]:
    url, token = find_server(args.server, args.token, args.kernel_id)
    if args.action == "ls":
        query = f"?label={urllib.parse.quote(args.label)}" if args.label else ""
        states = call(url, token, f"api/gpucr/kernels{query}")
        lines = [f"{s['kernel_id']}  {s['state']:10} {s.get('engine') or '-':8} "
                 f"{_size((s.get('checkpoint') or {}).get('size'))}" + (f"  {s['label']}" if s.get("label") else "")
                 for s in states]
        return states, "\n".join(lines) or "No kernels."
    if args.action == "room":
        report = call(url, token, "api/gpucr/room")
        return report, "\n".join(kernel_lines(report))
    if not args.kernel_id:
        raise GPUCRError(f"'gpucr kernel {args.action}' needs a kernel id.", "List them with 'gpucr kernel ls'.")
    if args.action in ("savepoint", "savepoints", "goback"):
        return _savepoint_command(url, token, args)
    body = {"engine": args.engine} if args.action == "suspend" and args.engine else (
        {"gpu": args.gpu} if args.action == "resume" and args.gpu else {})
    st = call(url, token, f"api/gpucr/kernels/{args.kernel_id}/{args.action}", "POST", body)
    lost = ", ".join(x["name"] for x in st.get("lost", []))
    return st, (f"Kernel {st['kernel_id']} is {st['state']} (engine {st.get('engine')}: {st.get('engine_reason')})"
                + (f"; not kept: {lost}" if lost else "") + ".")


def _savepoint_line(sp: dict[str, Any]) -> str:
    cell = sp.get("cell") or {}
    code = (cell.get("code") or "").strip().splitlines()
    ran = f"  after [{cell.get('execution_count')}] {code[0][:50]}" if code else ""
    return f"{sp['id']}  {_when(sp.get('created'))}  {_size(sp.get('size')):>9}  {sp.get('name') or '-'}{ran}"


def _savepoint_command(url: str, token: str, args: argparse.Namespace) -> tuple[Any, str]:
    """``gpucr kernel savepoint|savepoints|goback KERNEL [SAVEPOINT]``: see server/savepoints.py."""
    path = f"api/gpucr/kernels/{urllib.parse.quote(args.kernel_id)}/savepoints"
    if args.action == "savepoint":
        sp = call(url, token, path, "POST", {"name": args.name} if args.name else {})
        paused = f", the kernel paused {sp['paused_s']:.2f} s" if sp.get("paused_s") is not None else ""
        return sp, f"Save point {sp['id']} ({_size(sp.get('size'))}{paused})."
    listed = call(url, token, path)
    if args.action == "savepoints":
        return listed, "\n".join(_savepoint_line(sp) for sp in listed) or "No save points."
    target = args.savepoint_id or (listed[-1]["id"] if listed else None)
    if target is None:
        raise GPUCRError(f"Kernel {args.kernel_id} has no save point.",
                         f"Take one with 'gpucr kernel savepoint {args.kernel_id}'.")
    st = call(url, token, f"{path}/{urllib.parse.quote(target)}/restore", "POST", {})
    return st, (f"Kernel {st['kernel_id']} is back at save point {target} ({st['state']}); the state it left is in "
                f"the trash as {st.get('trash_id')} ('gpucr trash restore' brings it back).")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        data, human = _execute(args)
    except GPUCRError as e:
        if args.json:
            print(json.dumps(e.to_dict()))
        else:
            print(f"gpucr: {e.message}", file=sys.stderr)
            if e.hint:
                print(f"  {e.hint}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(human)
    if args.cmd == "doctor":
        return 0 if data["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
