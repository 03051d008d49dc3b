"""Replication contract (role ``replication``): master/slave HA and its alternatives."""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tidemq.transport import TransportClient

BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")


class ReplicaStatus(enum.StrEnum):
    """How replication answers a put (RocketMQ's PutMessageStatus for HA); a str for old plugins."""

    PUT_OK = "PUT_OK"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    #: The replication says this broker may not acknowledge now (fenced or deposed): the send path
    #: answers SERVICE_NOT_AVAILABLE so clients retry another broker.
    NOT_MASTER = "NOT_MASTER"


@runtime_checkable
class Replication(Protocol):
    """Started by the broker after the store; consulted after each successful put."""

    def start(self, store: Any, broker_config: Any) -> None: ...

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        """Resolve once the bytes up to ``end_offset`` are replicated as the broker's role requires."""

    def ha_address(self) -> str:
        """The address slaves connect to ("" when not serving)."""

    def shutdown(self) -> None: ...


@runtime_checkable
class MasterAware(Protocol):
    """A replication that learns its master from the NameServers' answer and reports its state."""

    def update_master(self, ha_address: str, broker_address: str) -> None:
        """The master's HA and broker addresses, from a REGISTER_BROKER answer."""

    def runtime_info(self) -> dict[str, str]:
        """Entries added to GET_BROKER_RUNTIME_INFO's table (role, slave lag...)."""


@runtime_checkable
class RoleAware(Protocol):
    """A replication that decides the broker's role at run time (controller mode).

    The broker's ``[broker] role`` and ``id`` are then only the starting point: ``Broker.is_master``,
    the id registered with the NameServers and the services that run on masters only follow
    :meth:`current_role`, and change when the replication calls the bound listener.
    """

    def current_role(self) -> str:
        """ "ASYNC_MASTER", "SYNC_MASTER" or "SLAVE", now."""

    def current_broker_id(self) -> int:
        """0 while master; this replica's non-zero id (its [broker] id, or 1 if that is 0) while slave."""

    def current_epoch(self) -> int:
        """The epoch this replica serves in (0: none yet)."""

    def bind_role_listener(self, listener: Callable[[], None]) -> None:
        """The broker hands a callback; the replication calls it (from any thread) after each role change."""


@runtime_checkable
class ConfirmsReads(Protocol):
    """A replication that bounds what consumers may read (RocketMQ 5's confirm offset).

    A message stored on a master but not yet held by the replicas that would elect the next one
    can be cut by a failover; a consumer that read it is then ahead of the new master, whose new
    messages take the cut tail's queue offsets.  The broker serves pulls, POP, gRPC receive and
    max-offset queries only from records that end at or below :meth:`confirm_offset`, and
    re-checks held pulls when the replication calls the bound listener.
    """

    def confirm_offset(self) -> int | None:
        """Commit-log offset up to which records are readable now; None: no bound (everything stored)."""

    def bind_confirm_listener(self, listener: Callable[[], None]) -> None:
        """The broker hands a callback; the replication calls it (from any thread) after the offset grows."""


@runtime_checkable
class MetadataFollower(Protocol):
    """A replication whose slaves copy their master's metadata (RocketMQ's SlaveSynchronize).

    Called by the broker's composition root once, after the broker's server, client and replication
    are started and before it registers with the NameServers (and before ``tidemq_broker_started``).
    The replication keeps ``sink`` and ``client``, copies while (or whenever) it is a slave, and
    stops copying in :meth:`Replication.shutdown`.  Returns nothing.
    """

    def follow_metadata(self, sink: MetadataSink, client: TransportClient) -> None:
        """``sink``: where copied metadata goes; ``client``: the broker's transport client
        (a :class:`tidemq.transport.TransportClient`), for requests to the master."""


@runtime_checkable
class MetadataSink(Protocol):
    """Where a slave writes the metadata it copies from its master (RocketMQ's SlaveSynchronize).

    Each method takes the master's answer as RocketMQ's JSON body (the admin request named) and
    applies it whole: names are checked like any other, bad entries skipped and logged, and the
    table persisted.  A replication plugin gets this instead of the broker's managers.
    """

    def topic_data_version(self) -> dict[str, Any]:
        """The slave's topic-table DataVersion (``{"timestamp", "counter"}``): unchanged tables are skipped."""

    def apply_topic_configs(self, body: dict[str, Any]) -> int:
        """GET_ALL_TOPIC_CONFIG's TopicConfigSerializeWrapper; returns how many topics it holds."""

    def apply_consumer_offsets(self, body: dict[str, Any]) -> None:
        """GET_ALL_CONSUMER_OFFSET's ``{"offsetTable": {"topic@group": {queueId: offset}}}``."""

    def apply_delay_offsets(self, body: dict[str, Any]) -> None:
        """GET_ALL_DELAY_OFFSET's ``{"offsetTable": {level: offset}}``."""

    def apply_subscription_groups(self, body: dict[str, Any]) -> None:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG's SubscriptionGroupWrapper."""

    def adopt_store_topics(self) -> list[str]:
        """Give the topics the replicated log holds but the table lacks a config; returns them."""
