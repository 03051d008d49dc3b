"""The broker's composition root: every part of a broker built from its config, in one place.

:func:`tidemq.config.compose` builds the plugin roles (transport, flush, index, store,
replication, acl, metrics).  :func:`build_parts` builds the rest over them: the metadata
tables and client registries (RocketMQ's managers), the statistics, the filter types (their
dispatchers attached to the store here, before it loads) and the services that work through the
broker (registration, delayed, timer and transactional messages, filter servers, POP
consumption, the metadata sink a replication writes to).  ``Broker(compose(config))`` does
both.  What a plugin gets is handed to it as the broker starts (:class:`tidemq.broker.Broker`
keeps only the start and stop order):

* the store: ``load``/``start``; replication: ``start(store, settings)``, then a
  :class:`~tidemq.replication.MetadataFollower` gets ``follow_metadata(sink, client)``;
* the metrics exporter: ``start(figures)``, a :class:`BrokerFigures` (read-only);
* request handlers: ``tidemq_register_processors`` with a
  :class:`~tidemq.context.ProcessorRegister` over the broker (:class:`~tidemq.context.BrokerContext`).

Nothing here touches the disk: the tables are read by ``load`` in :meth:`Broker.start`, after
the data directory is locked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from tidemq.broker.clients import ConsumerManager, ProducerManager, RebalanceLockManager
from tidemq.broker.dedup import DuplicateWindow
from tidemq.broker.metadata_sink import BrokerMetadataSink
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.pop import PopService
from tidemq.broker.processors.filter_server import FilterServerManager
from tidemq.broker.registration import NamesrvRegistrar
from tidemq.broker.schedule import ScheduleMessageService
from tidemq.broker.services.readable import apply_memory_window
from tidemq.broker.stats import BrokerStats
from tidemq.broker.subscriptions import SubscriptionGroupManager
from tidemq.broker.timer import TimerMessageStore
from tidemq.broker.topics import TopicConfigManager
from tidemq.broker.transaction import TransactionalMessageService
from tidemq.config import Components, build_filters
from tidemq.filter import DispatchingFilterFactory, FilterFactory

if TYPE_CHECKING:
    from tidemq.config import BrokerSettings
    from tidemq.context import (
        BrokerContext,
        BrokerStatsView,
        ConfirmedReads,
        ConsumerOffsetTable,
        ConsumerRegistry,
        DedupFigures,
        PopFigures,
        ProducerRegistry,
        PullHoldService,
        TimerFigures,
    )
    from tidemq.index import KeyIndex
    from tidemq.replication import MetadataSink, Replication
    from tidemq.store import MessageStore


@attrs.frozen
class BrokerParts:
    """The parts of a broker :func:`build_parts` makes over its plugins (its managers and services);
    not to be confused with :class:`tidemq.broker.services.BrokerServices`, the operations a transport calls."""

    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    consumers: ConsumerManager
    producers: ProducerManager
    locks: RebalanceLockManager
    stats: BrokerStats
    filters: dict[str, FilterFactory]
    registrar: NamesrvRegistrar
    schedule: ScheduleMessageService
    timers: TimerMessageStore
    transactions: TransactionalMessageService
    filter_servers: FilterServerManager
    pop: PopService
    metadata_sink: MetadataSink
    dedup: DuplicateWindow


def build_parts(broker: BrokerContext, components: Components) -> BrokerParts:
    """The services of ``broker`` over ``components``; those that work through the broker keep it.

    Called once, by :class:`tidemq.broker.Broker` as it is made.  The filter types are built here
    and their dispatchers (the SQL92 bit map) attached to the store, which has not loaded yet.
    """
    settings = components.config.broker
    config_dir = settings.store_path / "config"
    apply_memory_window(broker)  # the store's pull rule, from [broker] access_message_in_memory_max_ratio
    filters = build_filters(components.config, components.manager, components.instances)
    for factory in filters.values():
        if isinstance(factory, DispatchingFilterFactory):
            for dispatcher in factory.dispatchers():
                components.store.add_dispatcher(dispatcher)
    return BrokerParts(
        topics=TopicConfigManager(
            config_dir / "topics.json",
            auto_create_topic=settings.auto_create_topic,
            default_queue_nums=settings.default_topic_queues,
            default_perm=settings.default_perm,
        ),
        groups=SubscriptionGroupManager(
            config_dir / "subscriptionGroup.json",
            auto_create=settings.auto_create_subscription_group,
            retry_max_times=settings.max_reconsume_times,
        ),
        offsets=ConsumerOffsetManager(config_dir / "consumerOffset.json"),
        consumers=ConsumerManager(),
        producers=ProducerManager(),
        locks=RebalanceLockManager(),
        stats=BrokerStats(),
        filters=filters,
        registrar=NamesrvRegistrar(broker),
        schedule=ScheduleMessageService(broker),  # delayed messages (issue 10)
        timers=TimerMessageStore(broker),  # timer messages (RocketMQ 5, issue 36)
        transactions=TransactionalMessageService(broker),  # transactional messages (issue 10)
        filter_servers=FilterServerManager(broker),  # live `tidemq filtersrv` processes
        pop=PopService(broker),  # POP consumption (RocketMQ 5, issue 39)
        # Where a replication plugin writes the metadata a slave copies from its master.
        metadata_sink=BrokerMetadataSink(broker),
        # The duplicate window on UNIQ_KEY (issue 37), rebuilt from the commit log as the broker starts.
        dedup=DuplicateWindow(
            settings.dedup_window_s,
            settings.dedup_max_entries,
            settings.dedup_max_bytes,
            content=settings.dedup_key == "content",
        ),
    )


class BrokerFigures:
    """What the metrics exporter gets of a broker: :class:`tidemq.context.BrokerFiguresView`.

    Read-only properties over the broker (the role, address and counters change while it runs),
    plus ``metrics_companions``: other services of the process whose figures the exporter serves
    too (``tidemq standalone``'s NameServer).
    """

    __slots__ = ("_broker", "metrics_companions")

    def __init__(self, broker: BrokerContext, companions: list[Any]) -> None:
        self._broker = broker
        self.metrics_companions = companions

    @property
    def settings(self) -> BrokerSettings:
        return self._broker.settings

    @property
    def data_dir(self) -> Path:
        return self._broker.data_dir

    @property
    def address(self) -> str:
        return self._broker.address

    @property
    def role(self) -> str:
        return self._broker.role

    @property
    def store(self) -> MessageStore:
        return self._broker.store

    @property
    def index(self) -> KeyIndex | None:
        return self._broker.index

    @property
    def read_bound(self) -> ConfirmedReads:
        return self._broker.read_bound

    @property
    def replication(self) -> Replication:
        return self._broker.replication

    @property
    def stats(self) -> BrokerStatsView:
        return self._broker.stats

    @property
    def dedup(self) -> DedupFigures:
        return self._broker.dedup

    @property
    def offsets(self) -> ConsumerOffsetTable:
        return self._broker.offsets

    @property
    def consumers(self) -> ConsumerRegistry:
        return self._broker.consumers

    @property
    def producers(self) -> ProducerRegistry:
        return self._broker.producers

    @property
    def hold(self) -> PullHoldService | None:
        return self._broker.hold

    @property
    def pop(self) -> PopFigures:
        return self._broker.pop

    @property
    def timers(self) -> TimerFigures:
        return self._broker.timers

    @property
    def recovery_seconds(self) -> float:
        return self._broker.recovery_seconds

    @property
    def acl_refusals(self) -> int:
        return self._broker.acl_refusals

    @property
    def endpoint_figures(self) -> dict[str, Callable[[], Mapping[str, int]]]:
        return self._broker.endpoint_figures
