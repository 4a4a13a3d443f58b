"""cloudpickle, adapted to a notebook's namespace.

* Arrays and tensor storages leave the stream through :class:`~gpucr_hooks.blobs.BlobWriter`.
* Functions and classes defined in the notebook keep the notebook's namespace as their
  globals: their global names are looked up at call time, as before the suspend, instead of
  being frozen into a private copy (cloudpickle's default).
* PyTorch gradients (``.grad``), which tensors do not pickle, are kept.
* Every mutable object met is recorded, so variables that share objects can be pickled
  together and still share them after load.
"""

from __future__ import annotations

import enum
import pickle
import sys
import types
from collections.abc import Mapping
from typing import Any, BinaryIO

import cloudpickle

from .blobs import BlobReader, BlobWriter

_USER_NS = ("user_ns",)
"""Persistent id of the notebook's namespace dict."""

_UNTRACKED = frozenset({
    int, float, complex, bool, str, bytes, type(None), type(Ellipsis), tuple, frozenset, range,
    types.ModuleType, types.BuiltinFunctionType, types.CodeType,
})
"""Types whose identity never matters for sharing (immutable, or restored by reference)."""


def _value_types() -> tuple[type, ...]:
    """Classes (cloudpickle keeps their identity itself) and immutable descriptors that every
    array refers to: tracking them would join all variables into one group."""
    found: list[type] = [type, enum.Enum]
    if (np := sys.modules.get("numpy")) is not None:
        found += [np.dtype, np.generic]
    if (torch := sys.modules.get("torch")) is not None:
        found += [torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size]
    return tuple(found)


class ReferencesLost(pickle.PicklingError):
    """Raised while pickling a variable that refers to another variable which cannot be kept."""


class SnapshotPickler(cloudpickle.Pickler):
    """Pickles one group of variables; see the module docstring for what it changes."""

    def __init__(self, file: BinaryIO, blobs: BlobWriter, user_ns: dict[str, Any],
                 keepalive: list[Any], lost: Mapping[int, str] | None = None) -> None:
        super().__init__(file, protocol=5)
        self.used: set[int] = set()
        """Indices of the blobs this pickle refers to."""
        self.refs: set[Any] = set()
        """Ids of the mutable objects met, and ``("blob", index)`` for arrays."""
        self._blobs = blobs
        self._user_ns = user_ns
        self._keepalive = keepalive  # keeps ids in ``refs`` unique across picklers
        self._lost = lost or {}
        self._torch = sys.modules.get("torch")
        self._value_types = _value_types()

    def persistent_id(self, obj: Any) -> Any:
        if obj is self._user_ns:
            return _USER_NS
        pid = self._blobs.persistent_id(obj)
        if pid is not None:
            self.used.add(pid[1])
            self.refs.add(("blob", pid[1]))
            return pid
        if id(obj) in self._lost:
            raise ReferencesLost(f"refers to {self._lost[id(obj)]}, which cannot be kept")
        if id(obj) not in self.refs and self._tracked(obj):
            self.refs.add(id(obj))
            self._keepalive.append(obj)
        return None

    def _tracked(self, obj: Any) -> bool:
        """Whether sharing ``obj`` between variables must survive (functions: only the notebook's)."""
        if type(obj) in _UNTRACKED or isinstance(obj, self._value_types):
            return False
        return not isinstance(obj, types.FunctionType) or obj.__globals__ is self._user_ns

    def reducer_override(self, obj: Any) -> Any:
        torch = self._torch
        if torch is not None and isinstance(obj, torch.Tensor) and obj.is_leaf and obj.grad is not None:
            return _with_grad, (_WithoutGrad(obj), obj.grad)
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        if func.__globals__ is not self._user_ns:
            return reduced
        make, (code, _globals, name, defaults, closure), (state, slotstate), *rest = reduced
        slotstate["__globals__"] = {}
        return (make, (code, self._user_ns, name, defaults, closure), (state, slotstate), *rest)


class SnapshotUnpickler(pickle.Unpickler):
    """Reads what :class:`SnapshotPickler` wrote, binding notebook functions to ``user_ns``."""

    def __init__(self, file: BinaryIO, blobs: BlobReader, user_ns: dict[str, Any]) -> None:
        super().__init__(file)
        self._blobs = blobs
        self._user_ns = user_ns

    def persistent_load(self, pid: Any) -> Any:
        return self._user_ns if pid == _USER_NS else self._blobs.load(pid)


class _WithoutGrad:
    """Pickles as the wrapped tensor itself, so its gradient can be pickled next to it."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.tensor.__reduce_ex__(protocol)


def _with_grad(tensor: Any, grad: Any) -> Any:
    tensor.grad = grad
    return tensor
