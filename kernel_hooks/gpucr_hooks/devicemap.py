"""Where an array saved on one device lives after load: the requested GPU, or the CPU if none."""

from __future__ import annotations

from collections.abc import Mapping


class DeviceMap:
    """Map saved device names ("cpu", "cuda:0", ...) to devices of this process.

    ``target`` is None (same device as saved), one device for every saved GPU
    (``"cuda:1"``, or ``"cpu"``), or a mapping such as ``{"cuda:0": "cuda:1"}``.
    Every fallback is recorded once in :attr:`warnings`.
    """

    def __init__(self, target: str | Mapping[str, str] | None) -> None:
        self._target = target
        self.warnings: list[str] = []

    def resolve(self, saved: str, cuda_count: int) -> str:
        """Device for an array saved on ``saved``, given how many GPUs this process sees."""
        if not saved.startswith("cuda"):
            return saved
        if isinstance(self._target, Mapping):
            wanted = self._target.get(saved, saved)
        else:
            wanted = self._target or saved
        if not wanted.startswith("cuda"):
            return wanted
        index = int(wanted.partition(":")[2] or 0)
        if cuda_count == 0:
            self.warn(f"CUDA is not available: arrays saved on {saved} were loaded on the CPU")
            return "cpu"
        if index >= cuda_count:
            self.warn(f"{wanted} does not exist ({cuda_count} GPU(s)): arrays saved on {saved} "
                       "were loaded on cuda:0")
            return "cuda:0"
        return f"cuda:{index}"

    def warn(self, message: str) -> None:
        """Record a fallback once."""
        if message not in self.warnings:
            self.warnings.append(message)
