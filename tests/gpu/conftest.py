"""What the GPU tests share: they skip where no NVIDIA GPU with the driver's checkpoint API is."""
from __future__ import annotations

import pytest

from jupyter_gpucr.core.gpu import cuda, gpus


@pytest.fixture
def need_gpu() -> None:
    if not gpus.list_gpus() or cuda.unavailable_reason():
        pytest.skip(f"needs an NVIDIA GPU with the CUDA checkpoint API: {cuda.unavailable_reason() or 'no GPU'}")
