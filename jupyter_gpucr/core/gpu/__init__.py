"""The GPU: the CUDA driver's checkpoint API, NVML discovery and placement, the room report."""
