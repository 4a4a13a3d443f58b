"""gpucr-daemon: a root service that launches, checkpoints and restores processes for unprivileged users.

JupyterHub runs each user's server as that user, without the privileges CRIU needs. The daemon does
the privileged part on their behalf over a Unix socket and authorizes every request by the peer's
credentials (SO_PEERCRED): see :mod:`.server` and docs/jupyterhub.md.
"""
