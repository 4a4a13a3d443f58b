"""Whether a whole-process checkpoint can run on this node, and what differs from the node that made it.

A CRIU image holds machine code the process already chose for the CPU it ran on (glibc and
NumPy pick AVX-512 paths once, at start), GPU state only the same driver and GPU model take
back, and kernel objects of the kernel it ran under. Restored on another node, a missing
instruction set kills the process later with SIGILL instead of failing the restore, so it is
checked before anything starts.

The CPU is CRIU's own business: each checkpoint keeps CRIU's ``cpuinfo`` image of the node that
made it (``criu cpuinfo dump``), and a restore elsewhere asks ``criu cpuinfo check``, CRIU's
verdict with CRIU's rules (by default the instruction-set features only). CRIU answers yes or
no; which features differ is read from the two images here, with CRIU's own list of the
instruction features that count, under the names ``/proc/cpuinfo`` gives them.
"""
from __future__ import annotations

import os
import platform
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..gpu import gpus
from .images import decode, entries, packed

#: Where a checkpoint keeps the cpuinfo image, relative to its folder (beside ``images/``, whose
#: digests CRIU's own files alone make up).
CPUINFO = Path("host") / "cpuinfo.img"

# The instruction features CRIU's check compares (criu/arch/x86/cpu.c, x86_ins_capability_mask),
# by capability word (compel's cpuid_leafs) and bit, named as the kernel names them in /proc/cpuinfo.
INSTRUCTION_FEATURES: dict[int, dict[int, str]] = {
    0: {0: "fpu", 4: "tsc", 8: "cx8", 11: "sep", 15: "cmov", 19: "clflush", 23: "mmx", 24: "fxsr", 25: "sse",
        26: "sse2"},
    1: {11: "syscall", 22: "mmxext", 27: "rdtscp", 30: "3dnowext", 31: "3dnow"},
    3: {16: "rep_good", 20: "nopl"},
    4: {0: "pni", 1: "pclmulqdq", 3: "monitor", 9: "ssse3", 13: "cx16", 19: "sse4_1", 20: "sse4_2", 22: "movbe",
        23: "popcnt", 25: "aes", 26: "xsave", 27: "osxsave", 28: "avx", 29: "f16c", 30: "rdrand"},
    6: {5: "abm", 6: "sse4a", 7: "misalignsse", 8: "3dnowprefetch", 11: "xop", 16: "fma4", 21: "tbm"},
    9: {0: "fsgsbase", 3: "bmi1", 4: "hle", 5: "avx2", 8: "bmi2", 9: "erms", 11: "rtm", 14: "mpx", 16: "avx512f",
        17: "avx512dq", 18: "rdseed", 19: "adx", 23: "clflushopt", 26: "avx512pf", 27: "avx512er", 28: "avx512cd",
        29: "sha_ni", 30: "avx512bw", 31: "avx512vl"},
    10: {0: "xsaveopt", 1: "xsavec", 2: "xgetbv1", 3: "xsaves"},
}


@dataclass(frozen=True)
class CpuInfo:
    """What a cpuinfo image says of a CPU."""

    model: str
    capability: tuple[int, ...]

    def features(self) -> set[str]:
        """The instruction features CRIU compares that this CPU has."""
        return {name for word, bits in INSTRUCTION_FEATURES.items() if word < len(self.capability)
                for bit, name in bits.items() if self.capability[word] >> bit & 1}


def read_cpuinfo(path: Path) -> CpuInfo | None:
    """The x86 entry of a cpuinfo image; None for another architecture's image."""
    for entry in entries(path):
        for raw in entry.get(1, []):  # cpuinfo_entry.x86_entry
            x86 = decode(raw)
            model = x86.get(7, [b""])[0]
            return CpuInfo(model.decode(errors="replace") if isinstance(model, bytes) else "", tuple(packed(x86.get(6, []))))
    return None


_here: dict[str, bytes] = {}
_here_lock = threading.Lock()


def node_cpuinfo(criu_path: str) -> bytes | None:
    """This node's cpuinfo image, made by CRIU once per process (the CPU does not change under
    it); None where CRIU cannot make one (another architecture)."""
    with _here_lock:
        if criu_path not in _here:
            with tempfile.TemporaryDirectory(prefix="gpucr-cpuinfo-") as d:
                run = subprocess.run([criu_path, "cpuinfo", "dump", "-D", d, "-o", "cpuinfo.log"],
                                     capture_output=True, timeout=60)
                image = Path(d) / "cpuinfo.img"
                _here[criu_path] = image.read_bytes() if run.returncode == 0 and image.is_file() else b""
        return _here[criu_path] or None


def warm(criu_path: str) -> None:
    """Make this node's cpuinfo image in the background (a checkpoint needs it after the dump)."""
    threading.Thread(target=node_cpuinfo, args=(criu_path,), name="gpucr-cpuinfo", daemon=True).start()


def boot_id() -> str | None:
    """This boot of this machine: a checkpoint made in the same boot needs no CPU check."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def record(criu_path: str, folder: Path) -> dict[str, Any]:
    """Keep this node's cpuinfo image in the checkpoint ``folder``; what the manifest's ``host``
    adds (the CPU's model, the boot)."""
    image = node_cpuinfo(criu_path)
    out: dict[str, Any] = {"boot_id": boot_id()}
    if image is not None:
        (folder / CPUINFO).parent.mkdir(mode=0o700, exist_ok=True)
        # Whole or absent, never empty: a server killed here leaves a checkpoint that recovery
        # completes, and an empty image would make it look damaged at its restore.
        partial = (folder / CPUINFO).with_suffix(".partial")
        partial.write_bytes(image)
        os.replace(partial, folder / CPUINFO)
        here = read_cpuinfo(folder / CPUINFO)
        out["cpu"] = here.model if here else None
    return out


def drop_unfinished_record(folder: Path) -> None:
    """A server killed while it kept the cpuinfo image leaves it partial (or, before it wrote
    through a rename, empty): recovery drops it, and the checkpoint restores like one made before
    checkpoints kept it (its boot is in the intent: on this boot no CPU check is needed)."""
    image = folder / CPUINFO
    image.with_suffix(".partial").unlink(missing_ok=True)
    try:
        whole = image.stat().st_size > 0 and bool(list(entries(image)))
    except FileNotFoundError:
        return
    except Exception:  # noqa: BLE001 - any decoding failure means the same: not a whole image
        whole = False
    if not whole:
        image.unlink(missing_ok=True)


def cpu_problem(criu_path: str, folder: Path) -> str | None:
    """Why this node's CPU cannot run the checkpoint in ``folder`` (CRIU's verdict, the features
    named); None when it can or the checkpoint keeps no cpuinfo image (made before it did)."""
    image = folder / CPUINFO
    if not image.is_file():
        return None
    run = subprocess.run([criu_path, "cpuinfo", "check", "-D", str(image.parent), "-o", "/dev/null"],
                         capture_output=True, text=True, timeout=60)
    if run.returncode == 0:
        return None
    theirs = read_cpuinfo(image)
    mine_image = node_cpuinfo(criu_path)
    if theirs is None or mine_image is None:
        return "CRIU's CPU check refused this node's CPU for the checkpoint"
    with tempfile.TemporaryDirectory(prefix="gpucr-cpuinfo-") as d:
        (Path(d) / "cpuinfo.img").write_bytes(mine_image)
        mine = read_cpuinfo(Path(d) / "cpuinfo.img")
    missing = sorted(theirs.features() - (mine.features() if mine else set()))
    made_on = f" ({theirs.model})" if theirs.model else ""
    if not missing:
        return f"CRIU's CPU check refused this node's CPU ({mine.model if mine else 'unknown'}) for a checkpoint made on " \
               f"another CPU{made_on}"
    return (f"this node's CPU{f' ({mine.model})' if mine and mine.model else ''} lacks {', '.join(missing)}, which the "
            f"checkpoint's node{made_on} had")


def problems(ckpt_path: Path, manifest: dict[str, Any], criu_path: str) -> list[str]:
    """Everything that keeps the whole-process checkpoint from running here; empty when it can."""
    host = manifest.get("host") or {}
    found = []
    same_boot = host.get("boot_id") is not None and host.get("boot_id") == boot_id()
    if not same_boot:
        cpu = cpu_problem(criu_path, ckpt_path)
        if cpu:
            found.append(cpu)
    gpu = manifest.get("gpu") or {}
    driver = gpu.get("driver_version")
    if driver and driver != gpus.driver_version():
        found.append(f"its GPU state is from NVIDIA driver {driver}; this node has "
                     f"{gpus.driver_version() or 'no NVIDIA driver'}")
    models = sorted({u["name"] for u in gpu.get("used", []) if u.get("name")})
    if models:
        here = sorted({g.name for g in gpus.list_gpus()})
        absent = [m for m in models if m not in here]
        if absent:
            found.append(f"it used {', '.join(absent)}; this node has {', '.join(here) or 'no NVIDIA GPU'}")
    return found


def differences(manifest: dict[str, Any]) -> list[str]:
    """What differs from the node that made the checkpoint without keeping it from running (the
    kernel release), said beside a refusal or a failed restore."""
    host = manifest.get("host") or {}
    if host.get("kernel") and host["kernel"] != platform.release():
        return [f"the checkpoint's node ran Linux {host['kernel']}, this node runs {platform.release()}"]
    return []
