"""Entry point of the ha_replication plugin: its hook implementations.

A slave's metadata copy needs no hook: the broker hands its sink and client to the replication
(:meth:`~tidemq.replication.MetadataFollower.follow_metadata`), and the replication's ``shutdown``
stops the copy.
"""

from __future__ import annotations

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
