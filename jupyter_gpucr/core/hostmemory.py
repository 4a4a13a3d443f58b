"""What the hypervisor does with the memory this machine frees.

With virtio-balloon free page reporting, memory the guest frees goes back to the host, which
drops it; the next write there faults it in again on the host. A suspend writes its image into
freed memory, a restore its process: on such a VM either can take several times as long after the
machine has sat idle (the CPU machine: a 1.7 GB dump 0.7-0.9 s with its memory backed, 2.4-12 s
without; ``bench/bench_repeat.py``). Nothing in the process or in gpucr causes it, and pre-touching
memory only moves the cost, so gpucr reports it (``gpucr doctor``) rather than working around it.
"""
from __future__ import annotations

from pathlib import Path

VIRTIO = Path("/sys/bus/virtio/devices")
BALLOON = "0x0005"  # virtio device id of the memory balloon
REPORTING = 5  # VIRTIO_BALLOON_F_REPORTING, a bit of the features the driver negotiated


def free_page_reporting(virtio: Path = VIRTIO) -> bool | None:
    """Whether a balloon device here reports freed memory to the host; None: no balloon."""
    for dev in sorted(virtio.glob("*")):
        try:
            if (dev / "device").read_text().strip() != BALLOON:
                continue
            features = (dev / "features").read_text().strip()
        except OSError:
            continue
        return len(features) > REPORTING and features[REPORTING] == "1"
    return None
