"""Placement and compatibility decisions, before anything is touched: which GPU a checkpoint
goes to, and the refusals a user sees (GPU model missing, GPU busy, another driver)."""
from __future__ import annotations

import json

import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.errors import IncompatibleCheckpointError, PreconditionError
from jupyter_gpucr.core.gpu.gpus import Gpu, plan_placement
from tests.core.test_core import start_agent

GIB = 1 << 30
H200 = "NVIDIA H200"


def machine(*free_gib: float, name: str = H200) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", name, 141 * GIB, int((141 - f) * GIB), int(f * GIB))
            for i, f in enumerate(free_gib)]


def used(index: int, gib: float, name: str = H200) -> dict:
    return {"index": index, "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000", "name": name,
            "memory_used": int(gib * GIB)}


def test_auto_prefers_the_original_gpu_and_maps_every_gpu():
    gpus = machine(100, 120)
    old = [g.uuid for g in gpus]
    mapping = plan_placement([used(0, 10)], old, "auto", gpus)
    assert mapping == {old[0]: old[0], old[1]: old[1]}


def test_auto_moves_to_a_gpu_with_room_and_swaps_the_rest():
    gpus = machine(5, 120)
    old = [g.uuid for g in gpus]
    mapping = plan_placement([used(0, 10)], old, "auto", gpus)
    assert mapping == {old[0]: old[1], old[1]: old[0]}, "the driver needs a map covering every GPU"


def test_named_gpu_by_index_or_uuid_prefix():
    gpus = machine(100, 100)
    old = [g.uuid for g in gpus]
    assert plan_placement([used(0, 10)], old, "1", gpus)[old[0]] == old[1]
    assert plan_placement([used(0, 10)], old, old[1][:12], gpus)[old[0]] == old[1]


def test_busy_gpu_is_refused_with_what_is_free():
    with pytest.raises(PreconditionError) as err:
        plan_placement([used(0, 50)], [g.uuid for g in machine(20, 30)], "auto", machine(20, 30))
    assert "No NVIDIA H200 has the" in err.value.message and "MiB free" in err.value.message


def test_other_gpu_model_is_incompatible_and_offers_the_snapshot_engine():
    gpus = machine(100, name="NVIDIA A100-SXM4-80GB")
    with pytest.raises(IncompatibleCheckpointError) as err:
        plan_placement([used(0, 10)], [g.uuid for g in gpus], "auto", gpus)
    assert "made on NVIDIA H200" in err.value.message and "snapshot engine" in err.value.hint


def test_no_gpu_here_and_unknown_gpu_are_clear_errors():
    with pytest.raises(PreconditionError) as err:
        plan_placement([used(0, 10)], [], "auto", [])
    assert "no usable NVIDIA GPU" in err.value.message
    with pytest.raises(PreconditionError) as err:
        plan_placement([used(0, 10)], [], "7", machine(100))
    assert "No GPU matches '7'" in err.value.message


def test_checkpoint_from_another_driver_is_refused_and_kept(criu_path, store_dir, tmp_path):
    start_agent(store_dir, "otherdriver", tmp_path, mb=10)
    cr = Checkpointer(store_dir)
    ckpt = cr.checkpoint("otherdriver")
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    manifest["gpu"]["driver_version"] = "999.99"  # as if written on a machine with another driver
    (ckpt.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IncompatibleCheckpointError) as err:
        cr.restore("otherdriver")
    assert "NVIDIA driver 999.99" in err.value.message and "The checkpoint is kept" in err.value.hint
    assert ckpt.path.is_dir() and cr.status("otherdriver")["state"] == "checkpointed"
    cr.remove("otherdriver")


def test_offloaded_tensors_count_on_their_gpu_as_reported_or_by_their_folder(tmp_path):
    """What a suspended kernel takes back itself after the driver's restore must fit beside it:
    the offload's own report per GPU, or (a checkpoint from before that report) the folder's size
    on the one GPU the kernel used."""
    from jupyter_gpucr.core.storage.store import Checkpoint
    from jupyter_gpucr.server.engines import _offloaded_by_gpu

    tensors = tmp_path / "gpu-tensors"
    tensors.mkdir()
    for i, n in enumerate((3 << 20, 5 << 20)):
        (tensors / f"{i}.bin").write_bytes(b"\0" * n)
    gpu = {"used": [used(0, 1)], "all": []}
    reported = Checkpoint("k-1", tmp_path, {"gpu": gpu, "offload": {"bytes_by_gpu": {used(0, 1)["uuid"]: 6 * GIB}}})
    assert _offloaded_by_gpu(reported, tensors) == {used(0, 1)["uuid"]: 6 * GIB}
    older = Checkpoint("k-2", tmp_path, {"gpu": gpu, "offload": {"bytes": 8 << 20}})
    assert _offloaded_by_gpu(older, tensors) == {used(0, 1)["uuid"]: 8 << 20}
    two_gpus = Checkpoint("k-3", tmp_path, {"gpu": {"used": [used(0, 1), used(1, 1)], "all": []}, "offload": None})
    assert _offloaded_by_gpu(two_gpus, tensors) == {}  # which GPU held what is unknown: nothing is guessed
