"""Replication contract (role ``replication``): master/slave HA and its alternatives."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")


@runtime_checkable
class Replication(Protocol):
    """Started by the broker after the store; consulted after each successful put."""

    def start(self, store: Any, broker_config: Any) -> None: ...

    def wait_for_replicas(self, end_offset: int) -> Future[str]:
        """Resolve with ``"PUT_OK"``, ``"FLUSH_SLAVE_TIMEOUT"`` or ``"SLAVE_NOT_AVAILABLE"``."""

    def ha_address(self) -> str:
        """The address slaves connect to ("" when not serving)."""

    def shutdown(self) -> None: ...
