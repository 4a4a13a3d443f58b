"""jupyter-gpucr on Binder: no root, no GPU, no CRIU.

Kernels are suspended with the snapshot engine (each kernel saves its own variables; no
privileges needed) and are started as ordinary kernels, not through the CRIU provisioner.
binder/start puts this directory on JUPYTER_CONFIG_PATH so that the server reads this file.
"""

c = get_config()  # noqa: F821 (defined by traitlets when Jupyter loads this file)

c.GPUCR.engine = "snapshot"
c.GPUCR.checkpointable_kernels = False

# Uncomment to also suspend kernels left idle for 5 minutes (Binder stops idle sessions itself):
# c.GPUCR.idle_timeout = 300
