"""The checkpoint core: stores, namespaces, CRIU and the CUDA driver; it imports nothing from Jupyter."""
