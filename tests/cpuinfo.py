"""The one fake the cross-node tests allow (there is no second machine here): a CRIU cpuinfo image
of a CPU with one instruction feature more than this one."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from jupyter_gpucr.core.criu import nodecompat
from jupyter_gpucr.core.criu.images import decode, packed


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def node_image(criu: str, tmp: Path) -> Path:
    """This node's cpuinfo image, as a file."""
    image = nodecompat.node_cpuinfo(criu)
    assert image, "criu cpuinfo dump works on x86"
    path = tmp / "here-cpuinfo.img"
    path.write_bytes(image)
    return path


def missing_here(criu: str, tmp: Path) -> tuple[int, int, str]:
    """An instruction feature CRIU compares that this CPU lacks: (word, bit, name)."""
    here = nodecompat.read_cpuinfo(node_image(criu, tmp))
    assert here is not None
    for word, bits in nodecompat.INSTRUCTION_FEATURES.items():
        for bit, name in bits.items():
            if name not in here.features():
                return word, bit, name
    pytest.skip("this CPU has every instruction feature CRIU compares")


def with_feature(image: bytes, word: int, bit: int) -> bytes:
    """The cpuinfo image re-encoded with one more capability bit set: what a CPU with that
    feature would have written (its magic words, its size, its one message)."""
    (size,) = struct.unpack_from("<I", image, 8)
    x86 = decode(decode(image[12:12 + size])[1][0])
    caps = packed(x86[6])
    caps[word] |= 1 << bit
    body = b"".join(_field(n, v) for n in sorted(x86) for v in (caps if n == 6 else x86[n]))
    message = _field(1, body)
    return image[:8] + struct.pack("<I", len(message)) + message
