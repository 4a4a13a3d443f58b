"""Pausing processes when idle and waking them on the next connection: socket activation, the
waker, and sessions of several processes."""
