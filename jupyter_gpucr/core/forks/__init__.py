"""Forks: copies of a process restored from its checkpoint, and the host side of each copy's
network namespace."""
