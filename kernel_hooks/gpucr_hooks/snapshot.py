"""The snapshot engine's kernel side: save the notebook's namespace to a directory, load it back.

Portable (no root, no CRIU) and device independent. Layout of a snapshot directory::

    manifest.json      what is where: kept and lost names, groups, array table, versions, devices
    history.json       In (as run and as typed) and the execution count
    objects/NNNN.pkl   one pickle per group of variables that share objects (cloudpickle)
    data.bin           raw bytes of every array and tensor storage, back to back

Each variable is first pickled on its own (arrays are only registered, not copied), which
finds exactly which ones cannot be kept and why. Variables that share objects (a model and its
optimizer) are then pickled together so that they still share them after load.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import namespace, readahead
from .blobs import BlobReader, BlobWriter
from .devicemap import DeviceMap
from .files import atomic_directory, private_file, write_private
from .pickling import ReferencesLost, SnapshotPickler, SnapshotUnpickler

FORMAT = "gpucr-snapshot"
VERSION = 1
_PACKAGES = ("numpy", "torch", "cupy", "jax", "pandas", "cloudpickle")
"""Packages whose versions are always recorded when loaded; others are added per kept variable."""


@dataclass
class _Probe:
    data: bytes = b""
    used: set[int] = field(default_factory=set)
    refs: set[Any] = field(default_factory=set)
    error: str | None = None


def snapshot_save(path: str) -> dict[str, Any]:
    """Save the user namespace of the running IPython shell into the new directory ``path``.

    Returns ``{"kept": [names], "lost": [{"name", "type", "reason"}], "bytes": int, "path": str,
    "devices": {device: array bytes}}``.
    ``path`` appears only once the snapshot is complete; on any error nothing is left behind.
    """
    shell = _shell()
    target = Path(path).expanduser().absolute()
    variables = namespace.user_variables(shell)
    modules = {n: m for n, v in variables.items() if (m := namespace.importable_module(v))}
    values = {n: v for n, v in variables.items() if n not in modules}
    values.update({f"Out[{n}]": v for n, v in namespace.outputs(shell).items()})

    with atomic_directory(target) as staging:  # fails early on a bad path, before any pickling
        pickling = _Pickling(shell.user_ns)
        probes = {name: pickling.probe({name: value}) for name, value in values.items()}
        lost = _lost(values, probes, pickling)
        kept = [n for n in values if n not in lost]
        (staging / "objects").mkdir(mode=0o700)
        groups, used = [], set()
        for number, names in enumerate(_groups(kept, probes)):
            pickled = probes[names[0]] if len(names) == 1 else pickling.pickle({n: values[n] for n in names})
            file = f"objects/{number:04d}.pkl"
            write_private(staging / file, pickled.data)
            groups.append({"file": file, "names": names, "bytes": len(pickled.data)})
            used |= pickled.used
        with private_file(staging / "data.bin") as data:
            table = pickling.blobs.write(data, used)
        write_private(staging / "history.json", json.dumps(namespace.history(shell)).encode())
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created": time.time(),
            "python": platform.python_version(),
            "byteorder": sys.byteorder,
            "packages": _versions([*_PACKAGES, *(_top_package(values[n]) for n in kept)]),
            "cwd": os.getcwd(),
            "kept": [n for n in variables if n in modules or n in values and n not in lost],
            "lost": list(lost.values()),
            "modules": modules,
            "groups": groups,
            "blobs": table,
            "devices": pickling.blobs.device_bytes(used),
            "variables": {n: _describe(values[n], probes[n], pickling.blobs) for n in values},
            "bytes": _size(staging),  # without the manifest itself
        }
        write_private(staging / "manifest.json", json.dumps(manifest, indent=1).encode())
        total = _size(staging)
    return {"kept": manifest["kept"], "lost": manifest["lost"], "bytes": total, "path": str(target),
            "devices": manifest["devices"]}


def snapshot_load(path: str, device: str | Mapping[str, str] | None = None) -> dict[str, Any]:
    """Restore a snapshot into the user namespace of this (fresh) IPython shell.

    Arrays go back to the device they were saved on, or where ``device`` says: one device
    for all GPUs (``"cuda:1"``, ``"cpu"``) or a map (``{"cuda:0": "cuda:1"}``); without CUDA
    they land on the CPU with a warning. Returns ``{"restored": [names], "lost": [...],
    "warnings": [...], "timings": {...}}``; ``lost`` holds what the save lost plus anything that
    failed to load; ``timings`` says where the load's time went (seconds, and the tensor bytes).
    """
    t0 = time.perf_counter()
    shell = _shell()
    root = Path(path).expanduser().absolute()
    manifest = _manifest(root)
    devices = DeviceMap(device)
    if manifest["python"].rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
        devices.warn(f"saved with Python {manifest['python']}, loading into {platform.python_version()}: "
                     "functions and classes defined in the notebook may not load")
    lost = list(manifest["lost"])
    restored: dict[str, Any] = {}
    for name, module in manifest["modules"].items():
        try:
            restored[name] = importlib.import_module(module)
        except Exception as exc:  # any import error: the name is lost, the rest still loads
            lost.append({"name": name, "type": "module", "reason": f"import {module} failed: {exc}"})
    builtins = shell.user_ns.get("__builtins__")  # cloudpickle sets its own when it binds functions
    t_modules = time.perf_counter()
    with BlobReader(root / "data.bin", manifest["blobs"], devices) as reader:
        for group in manifest["groups"]:
            try:
                with open(root / group["file"], "rb") as f:
                    restored.update(SnapshotUnpickler(f, reader, shell.user_ns).load())
            except Exception as exc:  # a group that cannot load is lost; the others still load
                lost.extend({"name": n, "type": manifest["variables"][n]["type"],
                             "reason": f"could not be loaded: {type(exc).__name__}: {exc}"}
                            for n in group["names"])
        timings = {"modules_s": t_modules - t0, "unpickle_s": time.perf_counter() - t_modules, **reader.timings()}
    if builtins is not None:
        shell.user_ns["__builtins__"] = builtins
    outputs = {int(n[4:-1]): restored.pop(n) for n in list(restored) if n.startswith("Out[")}
    shell.user_ns.update(restored)
    namespace.restore_history(shell, json.loads((root / "history.json").read_text()), outputs)
    timings["total_s"] = time.perf_counter() - t0
    return {"restored": list(restored), "lost": lost,
            "warnings": devices.warnings + _version_changes(manifest["packages"]), "timings": timings}


def snapshot_prepare(path: str, device: str | Mapping[str, str] | None = None, gpu: bool = False) -> dict[str, Any]:
    """Import, in a fresh kernel that is about to load the snapshot at ``path``, what its load is
    expected to import: the packages the snapshot recorded (NumPy, PyTorch, pandas... where the
    saving kernel had them loaded, and the package of each kept variable), the modules bound to
    names, and the module of each saved value's type. The server calls this in a kernel it started
    ahead of a restore, so that the restore only loads.

    With ``gpu``, also create the CUDA context of each GPU the load will put PyTorch tensors on
    (``device`` as for :func:`snapshot_load`) and the pinned buffers the load copies through; the
    server asks for it only where those GPUs have room for a context. No GPU memory is held beyond
    the contexts. Binds no name in the user namespace. Returns ``{"imported": [names], "failed":
    [{"name", "reason"}], "gpus": [devices], "seconds": float}``; what fails here fails again, and
    is reported, at load.
    """
    t0 = time.perf_counter()
    manifest = _manifest(Path(path).expanduser().absolute())
    imported: list[str] = []
    failed: list[dict[str, str]] = []
    for candidates in _imports(manifest):
        try:
            imported.append(_import_first(candidates))
        except Exception as exc:  # any import error: reported, the others are still imported
            failed.append({"name": candidates[0], "reason": f"{type(exc).__name__}: {exc}"})
    gpus: list[str] = []
    if gpu and "torch" in sys.modules:
        try:
            gpus = readahead.prepare(manifest["blobs"], DeviceMap(device))["devices"]
        except Exception as exc:  # no context now: the load creates it
            failed.append({"name": "CUDA", "reason": f"{type(exc).__name__}: {exc}"})
    return {"imported": imported, "failed": failed, "gpus": gpus, "seconds": time.perf_counter() - t0}


def _manifest(root: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((root / "manifest.json").read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{root} is not a {FORMAT} version {VERSION} directory")
    return manifest


def _imports(manifest: dict[str, Any]) -> list[list[str]]:
    """What a load of ``manifest`` imports, each as the names to try in turn: a type's name
    (``torch.nn.modules.linear.Linear``, ``pkg.Outer.Inner``) does not say where its module ends."""
    lost = {item["name"] for item in manifest["lost"]}
    wanted = [[name] for name in [*manifest["packages"], *manifest["modules"].values()]]
    for name, variable in manifest["variables"].items():
        parts = variable["type"].split(".")[:-1]  # none: a builtin type, or a class of the notebook
        if name not in lost and parts:
            wanted.append([".".join(parts[:i]) for i in range(len(parts), 0, -1)])
    return list({candidates[0]: candidates for candidates in wanted}.values())


def _import_first(candidates: list[str]) -> str:
    """Import the first of ``candidates`` that is a module; the last one's error if none is."""
    for name in candidates[:-1]:
        try:
            importlib.import_module(name)
            return name
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists; something it imports does not
                raise
    importlib.import_module(candidates[-1])
    return candidates[-1]


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("gpucr_hooks snapshots need a running IPython shell (a Jupyter kernel)")
    return shell


class _Pickling:
    """What all pickles of one save share: the array registry, and objects kept alive so
    that the ids recorded for grouping stay unique until the save ends."""

    def __init__(self, user_ns: dict[str, Any]) -> None:
        self.blobs = BlobWriter()
        self._user_ns = user_ns
        self._keepalive: list[Any] = []

    def pickle(self, obj: dict[str, Any], lost: Mapping[int, str] | None = None) -> _Probe:
        buffer = io.BytesIO()
        pickler = SnapshotPickler(buffer, self.blobs, self._user_ns, self._keepalive, lost)
        pickler.dump(obj)
        return _Probe(buffer.getvalue(), pickler.used, pickler.refs)

    def probe(self, obj: dict[str, Any], lost: Mapping[int, str] | None = None) -> _Probe:
        """:meth:`pickle`, with a failure recorded as the reason instead of raised."""
        try:
            return self.pickle(obj, lost)
        except Exception as exc:  # whatever pickling raises is the reason to report
            reason = str(exc) if isinstance(exc, ReferencesLost) else f"{type(exc).__name__}: {exc}"
            return _Probe(error=reason)


def _lost(values: dict[str, Any], probes: dict[str, _Probe], pickling: _Pickling) -> dict[str, dict[str, str]]:
    """Name -> {"name", "type", "reason"} for every value that cannot be kept.

    A value that fails because it holds another lost variable (a dict holding a generator) is
    probed again, so that its reason names that variable.
    """
    failed = [n for n, p in probes.items() if p.error is not None]
    # reversed: where a variable and an Out[n] entry are one object, the reason names the variable
    lost_ids = {id(values[n]): f"{n!r} ({namespace.type_name(values[n])})" for n in reversed(failed)}
    reasons = {}
    for name in failed:
        others = {i: text for i, text in lost_ids.items() if i != id(values[name])}
        retry = pickling.probe({name: values[name]}, others).error or ""
        reason = retry if retry.startswith("refers to") else probes[name].error or ""
        reasons[name] = {"name": name, "type": namespace.type_name(values[name]), "reason": reason}
    return reasons


def _groups(names: list[str], probes: dict[str, _Probe]) -> list[list[str]]:
    """Partition ``names`` so that variables sharing any object end up in one group."""
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    owner: dict[Any, str] = {}
    for name in names:
        for ref in probes[name].refs:
            other = owner.setdefault(ref, name)
            if other != name:
                parent[find(other)] = find(name)
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(find(name), []).append(name)
    return list(groups.values())


def _describe(value: Any, probe: _Probe, blobs: BlobWriter) -> dict[str, Any]:
    devices = blobs.device_bytes(probe.used)
    return {"type": namespace.type_name(value), "devices": sorted(devices),
            "array_bytes": sum(devices.values())}


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _top_package(value: Any) -> str:
    return (getattr(type(value), "__module__", None) or "builtins").partition(".")[0]


def _versions(packages: list[str]) -> dict[str, str]:
    """``__version__`` of each listed package that is imported (never imports anything)."""
    found = {}
    for name in dict.fromkeys(packages):
        version = getattr(sys.modules.get(name), "__version__", None)
        if isinstance(version, str):
            found[name] = version
    return found


def _version_changes(saved: dict[str, str]) -> list[str]:
    now = _versions(list(saved))
    return [f"{name} was {saved[name]} when saved and is {now[name]} now"
            for name in saved if name in now and now[name] != saved[name]]
