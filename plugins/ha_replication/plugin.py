"""Entry point of the ha_replication plugin: its hook implementations."""

from __future__ import annotations

from typing import Any

from tidemq import hookimpl
from tidemq.plugins import Register

from . import master_slave, none


@hookimpl
def tidemq_register_replications(register: Register) -> None:
    register.add("none", none.create, "no replication: a standalone master")
    register.add(
        "master_slave",
        master_slave.create,
        "RocketMQ HA: the commit log streamed to slaves; SYNC_MASTER acknowledges once a slave has it",
    )


@hookimpl
def tidemq_broker_started(broker: Any) -> None:
    """A master_slave slave also copies its master's metadata (SlaveSynchronize)."""
    replication = getattr(broker, "replication", None)
    if isinstance(replication, master_slave.MasterSlaveReplication) and replication.role == "SLAVE":
        from .slave_sync import SlaveSynchronize

        sync = SlaveSynchronize(broker.metadata_sink, broker.client, replication)
        replication.slave_sync = sync
        sync.start()


@hookimpl
def tidemq_broker_stopping(broker: Any) -> None:
    sync = getattr(getattr(broker, "replication", None), "slave_sync", None)
    if sync is not None:
        sync.cancel()
