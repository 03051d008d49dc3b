"""The ``none`` replication: a standalone master that acknowledges without replicas."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from tidemq.futures import StoreFuture
from tidemq.plugins import PluginContext
from tidemq.replication import ReplicaStatus

#: One resolved future for every put: it never changes, so sharing it is safe (and free).
_PUT_OK: Future[ReplicaStatus] = StoreFuture.completed(ReplicaStatus.PUT_OK)


class NoReplication:
    """Every put is acknowledged once the store accepts it; there is no HA port."""

    def start(self, store: Any, broker_config: Any) -> None:
        return None

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        return _PUT_OK

    def ha_address(self) -> str:
        return ""

    def shutdown(self) -> None:
        return None


def create(ctx: PluginContext) -> NoReplication:
    if ctx.options:
        from tidemq.errors import ConfigError

        raise ConfigError(f"[replication.none] takes no options, got: {', '.join(sorted(ctx.options))}")
    return NoReplication()
