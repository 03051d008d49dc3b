"""``[replication.controller]`` options: etcd, lease timing, the lag bound, and master_slave's HA options.

Kept apart from :mod:`.replication` so the configuration reference can import it without httpx.
"""

from __future__ import annotations

import attrs

from tidemq.errors import ConfigError
from tidemq_ha_replication.api import MasterSlaveOptions


def _endpoints(_inst: object, attribute: attrs.Attribute, value: list[str]) -> None:
    if not value:
        raise ValueError("etcd: give at least one URL such as http://127.0.0.1:2379")
    for url in value:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"etcd endpoint {url!r}: expected http://host:port")


def _non_negative(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 <= value < float("inf"):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value}")


def _positive(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 < value < float("inf"):
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value}")


@attrs.define
class ControllerOptions(MasterSlaveOptions):
    #: etcd client URLs (its HTTP/JSON gateway); tried in turn.
    etcd: list[str] = attrs.field(factory=lambda: ["http://127.0.0.1:2379"], validator=_endpoints)
    #: lease TTL (s): how long a dead master keeps the leader key (etcd's minimum is 2).
    ttl_s: int = 6
    #: how often the lease is renewed (s).
    keepalive_s: float = 1.0
    #: a master that could not renew stops acknowledging this long before its lease can expire (s).
    fence_margin_s: float = 2.0
    #: a candidate further than this behind the confirmed offset may not win (ASYNC groups, and
    #: a SYNC group before its first in-sync set); -1: 0 under SYNC_MASTER, 16 MiB under ASYNC.
    max_lag_bytes: int = attrs.field(default=-1, validator=attrs.validators.ge(-1))
    #: timeout of one etcd request (s).
    request_timeout_s: float = 1.0
    #: whether a SYNC master that cannot reach etcd keeps acknowledging: "in_sync" (while every
    #: member of its in-sync set holds each send; safe, since the set cannot change without etcd)
    #: or "never" (it stops at the fencing deadline and resumes on the same epoch when etcd is
    #: back).  ASYNC masters always stop.
    keep_serving_without_etcd: str = attrs.field(
        default="in_sync", metadata={"choices": ("in_sync", "never")}
    )
    #: SYNC: acknowledge only while the in-sync set has at least this many members, master
    #: included (2: every acknowledged message is on two replicas); the set never shrinks below it.
    min_in_sync_replicas: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    #: SYNC: a member that has not caught up (or not connected since the set formed) this long
    #: leaves the in-sync set (RocketMQ 5's haMaxTimeSlaveNotCatchup); sends wait for it until
    #: then.  One whose HA connection closes leaves at once (RocketMQ 5's removeConnection).
    sync_set_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    #: SYNC: let consumers read a message as soon as it is stored (RocketMQ 5's readUnCommitted).
    #: false (the default): pulls, POP, gRPC receive and max-offset queries serve only what every
    #: member of the in-sync set holds (the confirm offset), so no consumer reads a message a
    #: failover can cut; a pull at that bound is held until the set acknowledges.  The broker's own
    #: readers (delay levels, timers, transaction checks) stop there too.  Slaves serve up to the
    #: confirm offset their master sends on the HA stream.  ASYNC: no bound.
    read_uncommitted: bool = False
    #: how often each replica reports its offset to etcd (s), for lag and status (an ASYNC
    #: master's report is also the group's confirmed offset).
    report_s: float = attrs.field(default=1.0, validator=_non_negative)
    #: how often a slave copies its master's consumer offsets, topics and delay offsets (s).  1 s
    #: here (master_slave: 10 s): after a failover, consumers that restart or rebalance re-read at
    #: most what was consumed in about this long (plus their own commit interval).
    metadata_sync_s: float = attrs.field(default=1.0, validator=_positive)


def check_broker_settings(role: str, broker_id: int) -> None:
    """Controller mode's constraints on ``[broker]``: a master role to take when elected, an own id."""
    if role not in ("SYNC_MASTER", "ASYNC_MASTER"):
        raise ConfigError(
            f'[replication.controller]: [broker] role = "{role}": give the role a replica takes when '
            'elected, "SYNC_MASTER" or "ASYNC_MASTER" (etcd decides who is master)'
        )
    if broker_id < 1:
        raise ConfigError(
            "[replication.controller]: each replica needs its own non-zero [broker] id "
            "(etcd elects the master, which then registers as brokerId 0)"
        )
