"""What in an IPython namespace belongs to the user, and the shell's input/output history."""

from __future__ import annotations

import re
import sys
import types
from typing import Any

_IPYTHON_NAMES = re.compile(r"_+|_i+|_i\d+|_\d+|_ih|_oh|_dh|__\w+__")
"""Names IPython creates itself: _, __, ___, _i, _ii, _iii, _iN, _N, _ih, _oh, _dh, dunders."""


def user_variables(shell: Any) -> dict[str, Any]:
    """The user's variables, without IPython's own names (``In``, ``exit``, ``_i3``, ``_5``...).

    A name IPython put in the namespace at start-up counts as the user's once they rebind it.
    """
    hidden = shell.user_ns_hidden
    return {
        name: value
        for name, value in shell.user_ns.items()
        if not _IPYTHON_NAMES.fullmatch(name) and not (name in hidden and hidden[name] is value)
    }


def importable_module(value: Any) -> str | None:
    """The name to re-import ``value`` by, if it is a module that ``import`` would give back."""
    if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is value:
        return value.__name__ if value.__name__ != "__main__" else None
    return None


def type_name(value: Any) -> str:
    """``generator``, ``MyClass``, ``torch.nn.modules.linear.Linear``: builtins and notebook types bare."""
    cls = type(value)
    module = getattr(cls, "__module__", None)
    return cls.__qualname__ if module in (None, "builtins", "__main__") else f"{module}.{cls.__qualname__}"


def history(shell: Any) -> dict[str, Any]:
    """The inputs (``In``, as run and as typed) and the execution count, JSON-ready."""
    manager = shell.history_manager
    return {
        "In": list(manager.input_hist_parsed),
        "In_raw": list(manager.input_hist_raw),
        "execution_count": shell.execution_count,
    }


def outputs(shell: Any) -> dict[int, Any]:
    """``Out``: the values cells returned, by execution number."""
    return dict(shell.history_manager.output_hist)


def restore_history(shell: Any, saved: dict[str, Any], saved_outputs: dict[int, Any]) -> None:
    """Put ``In``, ``Out``, ``_iN``, ``_N``, ``_``/``_i`` and friends and the counter back."""
    manager, ns = shell.history_manager, shell.user_ns
    manager.input_hist_parsed[:] = saved["In"]
    manager.input_hist_raw[:] = saved["In_raw"]
    manager.output_hist.clear()
    manager.output_hist.update(saved_outputs)
    shell.execution_count = saved["execution_count"]
    ns.update({f"_i{n}": source for n, source in enumerate(saved["In_raw"]) if n})
    ns.update({f"_{n}": value for n, value in saved_outputs.items()})
    # after cell N IPython holds _i00 = In[N], _i = In[N-1], _ii = In[N-2], _iii = In[N-3]
    manager._iii, manager._ii, manager._i, manager._i00 = ([""] * 4 + saved["In_raw"][1:])[-4:]
    ns.update(_i=manager._i, _ii=manager._ii, _iii=manager._iii)
    hook = shell.displayhook
    last_outputs = ([""] * 3 + [saved_outputs[n] for n in sorted(saved_outputs)])[-3:]
    hook.___, hook.__, hook._ = last_outputs
    ns.update({"_": hook._, "__": hook.__, "___": hook.___})
