"""CRIU's network locks of suspended processes, released once their TCP peers have given up.

A suspended process keeps CRIU's network lock (an nftables table): its TCP peers' packets are
dropped, not answered with a reset, so a peer retransmits until the restore. Linux gives up
retransmitting after about 15 min (tcp_retries2), and a host holds at most 1024 locks
(``criu.commands.NETWORK_LOCKS_MAX``)."""
from __future__ import annotations

import time

from ..criu.commands import drop_network_locks
from ..storage.store import Store

#: How long a suspended process keeps its network lock (see the module docstring).
NETWORK_LOCK_HOLD = 900.0


def release_old_network_locks(store: Store, hold: float | None) -> list[str]:
    """Release the network locks of ``store``'s checkpoints older than ``hold`` seconds (none when
    None); the names of the tables deleted. A dump that stopped its process leaves its lock until
    the restore (``criu.commands.drop_network_locks``)."""
    if hold is None:
        return []
    old = time.time() - hold
    return drop_network_locks([c.images for c in store.list_checkpoints() if c.created < old])
