"""The UUID the CUDA driver gives a device of this process now.

PyTorch caches a device's properties at its first use: after a restore onto another GPU its
``get_device_properties(i).uuid`` still names the old GPU, while the driver (and NVML, which the
server asks) name the one the process runs on. Whatever the server matches against NVML's view
must come from the driver.
"""
from __future__ import annotations

import ctypes


def device_uuid(index: int) -> str | None:
    """NVML's spelling ("GPU-xxxxxxxx-xxxx-...") of the UUID of CUDA device ``index`` (in this
    process's numbering), or None if the driver cannot say."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    # the first version names the whole GPU also under MIG, as NVML's device list does
    get_uuid = getattr(cuda, "cuDeviceGetUuid", None) or getattr(cuda, "cuDeviceGetUuid_v2", None)
    device, raw = ctypes.c_int(), ctypes.create_string_buffer(16)
    if get_uuid is None or cuda.cuDeviceGet(ctypes.byref(device), index) != 0 or get_uuid(raw, device) != 0:
        return None
    h = raw.raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
