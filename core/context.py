"""The broker as its request handlers and plugins see it: :class:`BrokerContext` and its services.

:class:`BrokerContext` is made of small service Protocols, one per RocketMQ manager
(``TopicConfigManager`` -> :class:`TopicConfigTable`, ``ConsumerOffsetManager`` ->
:class:`ConsumerOffsetTable`...), so a processor, a plugin or a type checker sees what each part
offers without the broker's concrete classes.  :class:`tidemq.broker.Broker` implements them all
(its managers live in :mod:`tidemq.broker`); request processors and plugins call them.

Request handlers are registered through the ``tidemq_register_processors`` hook with a
:class:`ProcessorRegister`: built-in processors and third-party plugins alike add handlers by
request code (a code taken twice is an error naming both plugins) and may wrap a handler, all
before the broker's server starts.

This module lives in the kernel and imports nothing of the broker's services at run time: the
hook specifications name these types without depending on the broker application.  The value
types some services return (a group's config, a client channel, a stats counter) are the
broker's own data classes, named here for type checkers only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tidemq.errors import PluginError
from tidemq.transport import RequestHandler

if TYPE_CHECKING:
    import asyncio

    import pluggy

    from tidemq.acl import AccessValidator
    from tidemq.broker.clients import ClientChannel, ConsumerGroupInfo, SubscriptionData
    from tidemq.broker.stats import Counter, StatsSnapshot
    from tidemq.broker.subscriptions import SubscriptionGroupConfig
    from tidemq.config import BrokerSettings, Config
    from tidemq.filter import FilterFactory, MessageFilter
    from tidemq.index import KeyIndex
    from tidemq.message import MessageInner
    from tidemq.metrics import Buckets
    from tidemq.queues import MessageQueue
    from tidemq.remoting.command import RemotingCommand
    from tidemq.remoting.protocol import DataVersion, TopicConfig
    from tidemq.replication import Replication, RoleAware
    from tidemq.store import GetResult, MessageStore
    from tidemq.transport import Connection, TransportClient

__all__ = [
    "BrokerContext",
    "ConfirmedReads",
    "BrokerStatsView",
    "BrokerStatsService",
    "BrokerFiguresView",
    "DedupFigures",
    "DuplicateWindowService",
    "ConsumerOffsetTable",
    "ConsumerRegistry",
    "FilterServerTable",
    "Handler",
    "NamesrvRegistration",
    "PopFigures",
    "ProcessorRegister",
    "ProducerRegistry",
    "PullHoldService",
    "RebalanceLocks",
    "ScheduleService",
    "SubscriptionGroupTable",
    "TimerFigures",
    "TimerService",
    "TopicConfigTable",
    "TransactionService",
]

#: ``handler(conn, request)`` -> the response, or None (oneway requests, connections gone): one
#: type with the transport's :data:`tidemq.transport.RequestHandler` (published under that name).
Handler = RequestHandler


# --------------------------------------------------------------------------- metadata tables


class TopicConfigTable(Protocol):
    """The topic table, ``topics.json`` (RocketMQ's TopicConfigManager).

    Implemented by :class:`tidemq.broker.topics.TopicConfigManager`; called by the send, admin and
    pull processors (topic checks and auto-creation) and by NameServer registration.
    """

    data_version: DataVersion
    #: Called after any change (the broker re-registers with its NameServers).
    on_change: Callable[[], None]
    #: Topics created on first use whose creation is not in ``topics.json`` yet (topic -> a
    #: ticket); empty nearly always: the send path tests it per send.
    unwritten: dict[str, int]

    def get(self, topic: str) -> TopicConfig | None: ...

    def all(self) -> dict[str, TopicConfig]: ...

    def update(self, config: TopicConfig) -> None: ...

    def delete(self, topic: str) -> bool: ...

    def system_topics(self) -> set[str]: ...

    def set_auto_create_topic(self, enabled: bool) -> None: ...

    def create_in_send(
        self, topic: str, default_topic: str, client_queue_nums: int, sys_flag: int = 0
    ) -> TopicConfig | None:
        """Auto-create ``topic`` from ``default_topic`` on a send (None when not allowed)."""

    def create_in_send_back(self, topic: str, queue_nums: int, perm: int, sys_flag: int = 0) -> TopicConfig:
        """The retry or dead-letter topic of a group, created when missing."""

    def when_written(self, *topics: str) -> Future[None] | None:
        """A future resolved once the creation of those of ``topics`` created on first use is in
        ``topics.json`` (failed with the write's OSError); None when it is there already."""

    async def written(self, *topics: str) -> str | None:
        """Waits until the creation of those of ``topics`` created on first use is on disk: None
        then, else why not (a send is answered FLUSH_DISK_TIMEOUT)."""

    def add_system_topics(
        self,
        cluster: str,
        broker_name: str,
        *,
        cluster_topic_enable: bool,
        broker_topic_enable: bool,
        trace_topic: str = "",
    ) -> None: ...

    def serialize(self) -> dict[str, Any]:
        """The table as TopicConfigSerializeWrapper JSON (GET_ALL_TOPIC_CONFIG, registration)."""

    def persist(self) -> None: ...


class SubscriptionGroupTable(Protocol):
    """Consumer groups, ``subscriptionGroup.json`` (RocketMQ's SubscriptionGroupManager).

    Implemented by :class:`tidemq.broker.subscriptions.SubscriptionGroupManager`; called by the
    pull, heartbeat and admin processors.
    """

    data_version: DataVersion
    auto_create: bool

    def get(self, group: str) -> SubscriptionGroupConfig | None: ...

    def all(self) -> dict[str, SubscriptionGroupConfig]: ...

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config, created with defaults when auto-creation is on (else None)."""

    def update(self, cfg: SubscriptionGroupConfig) -> None: ...

    def delete(self, group: str) -> bool: ...

    def serialize(self) -> dict[str, Any]: ...

    def persist(self) -> None: ...


class ConsumerOffsetTable(Protocol):
    """Committed consumer offsets, ``consumerOffset.json`` (RocketMQ's ConsumerOffsetManager).

    Implemented by :class:`tidemq.broker.offsets.ConsumerOffsetManager`; called by the pull and
    offset processors, admin requests and the metrics exporter.
    """

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 when the group has none for the queue."""

    def query_all(self, group: str, topic: str) -> dict[int, int]: ...

    def topics_of_group(self, group: str) -> set[str]: ...

    def groups_of_topic(self, topic: str) -> set[str]: ...

    def remove_topic(self, topic: str) -> None: ...

    def remove_group(self, group: str) -> None: ...

    def clone_offset(self, src_group: str, dest_group: str, topic: str) -> bool: ...

    def min_offset_in_all_groups(
        self, topic: str, exclude_groups: set[str], min_offsets: dict[int, int]
    ) -> dict[int, int]: ...

    def serialize(self) -> dict[str, Any]:
        """``{"offsetTable": {"topic@group": {queue id: offset}}}``."""

    def persist(self, force: bool = False) -> bool: ...


# --------------------------------------------------------------------------- clients


class ConsumerRegistry(Protocol):
    """Connected consumers by group (RocketMQ's ConsumerManager).

    Implemented by :class:`tidemq.broker.clients.ConsumerManager`; called by the heartbeat, pull
    and consumer-admin processors and the metrics exporter.
    """

    groups: dict[str, ConsumerGroupInfo]

    def register(
        self,
        group: str,
        channel: ClientChannel,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: Iterable[SubscriptionData],
    ) -> bool:
        """Record a heartbeat; True when the group's membership or subscriptions changed."""

    def unregister(self, group: str, conn: Connection, client_id: str = "") -> bool:
        """Drop ``client_id`` of ``conn`` (every client of ``conn`` without one: a connection may
        carry several, a proxy's); True when the group lost a member."""

    def get(self, group: str) -> ConsumerGroupInfo | None: ...

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None: ...

    def groups_of_topic(self, topic: str) -> list[str]: ...

    def find_channel(self, group: str, client_id: str) -> ClientChannel | None: ...

    def live_channels(self, group: str) -> list[ClientChannel]: ...


class ProducerRegistry(Protocol):
    """Connected producers by group (RocketMQ's ProducerManager).

    Implemented by :class:`tidemq.broker.clients.ProducerManager`; called by the heartbeat
    processor, transaction checks and the metrics exporter.
    """

    #: group -> (connection, client id) -> the producer
    groups: dict[str, dict[tuple[Any, str], ClientChannel]]

    def register(self, group: str, channel: ClientChannel) -> None: ...

    def unregister(self, group: str, conn: Connection, client_id: str = "") -> None:
        """Drop ``client_id`` of ``conn`` (every client of ``conn`` without one)."""

    def channels(self, group: str) -> list[ClientChannel] | None: ...

    def table(self) -> dict[str, list[ClientChannel]]: ...


class RebalanceLocks(Protocol):
    """Queue locks of orderly consumers (RocketMQ's RebalanceLockManager).

    Implemented by :class:`tidemq.broker.clients.RebalanceLockManager`; called by LOCK/UNLOCK_BATCH_MQ.
    """

    def try_lock_batch(
        self, group: str, mqs: Iterable[MessageQueue], client_id: str
    ) -> list[MessageQueue]: ...

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None: ...

    def owner(self, group: str, mq: MessageQueue) -> str | None: ...


# --------------------------------------------------------------------------- figures


class BrokerStatsView(Protocol):
    """The broker's counters, read-only (RocketMQ's BrokerStatsManager as its readers see it).

    Implemented by :class:`tidemq.broker.stats.BrokerStats`; read by the admin processors
    (GET_BROKER_RUNTIME_INFO, VIEW_BROKER_STATS_DATA) and the metrics exporter.
    """

    cluster: str
    started_at: float
    topic_puts: dict[str, Counter]
    group_gets: dict[str, Counter]
    broker_put: Counter
    broker_get: Counter
    get_misses: int
    put_seconds: Buckets
    put_total_yesterday_morning: int
    put_total_today_morning: int
    get_total_yesterday_morning: int
    get_total_today_morning: int

    @property
    def put_count(self) -> int: ...

    @property
    def put_bytes(self) -> int: ...

    @property
    def get_count(self) -> int: ...

    @property
    def get_bytes(self) -> int: ...

    def snapshots(self, name: str, key: str) -> dict[str, StatsSnapshot] | None: ...

    def group_get_tps(self, group: str, topic: str) -> float: ...

    def broker_tps(self, *fields: int, now_ms: int | None = None) -> str:
        """RocketMQ's "t10 t60 t600" rate text of the broker's put or get figures."""


class BrokerStatsService(BrokerStatsView, Protocol):
    """The counters with their writers: the send, pull and offset processors record into them."""

    def on_put(self, topic: str, count: int, size: int) -> None: ...

    def on_get(self, group: str, topic: str, count: int, size: int) -> None: ...

    def on_commit(self, group: str, topic: str, queue_id: int) -> None: ...

    def remove_topic(self, topic: str) -> None: ...


# --------------------------------------------------------------------------- broker services


class PullHoldService(Protocol):
    """Long polling: pulls that found nothing wait here (RocketMQ's PullRequestHoldService).

    Implemented by :class:`tidemq.broker.hold.PullRequestHoldService`; the pull processor waits on
    it, the store's arrival listener wakes it.
    """

    @property
    def waiting(self) -> int:
        """Pulls held now."""

    def held_by(self, conn: Connection) -> int: ...

    def connection_closed(self, conn: Connection) -> None: ...

    async def wait(
        self, topic: str, queue_id: int, offset: int, timeout_s: float, conn: Connection | None = None
    ) -> bool:
        """Wait until the queue grows past ``offset`` (True) or ``timeout_s`` passes (False)."""


class ConfirmedReads(Protocol):
    """Consumers' reads bounded by the replication's confirm offset (RocketMQ 5's confirmOffset).

    Implemented by :class:`tidemq.broker.confirmed.ReadBound`: pulls, POP, gRPC receive, the
    max-offset queries and the broker's own readers of system queues (delay levels, timer enqueue,
    transaction checks) read through it; ``active`` is False when the replication never bounds.
    """

    active: bool

    def limit(self, topic: str, queue_id: int) -> int | None:
        """The queue's readable end when below its stored end, else None."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        """``get_max_offset_in_queue`` bounded by the confirm offset."""

    def holds(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the bound, not the queue's end, stops a read at ``offset``."""

    def bind(
        self, loop: asyncio.AbstractEventLoop, recheck: Callable[[], None], waited: Callable[[], bool]
    ) -> None:
        """``recheck`` runs on ``loop`` after each advance of the confirm offset while ``waited()``."""

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        flt: MessageFilter | None = None,
    ) -> GetResult:
        """``store.get_message`` serving no record past the confirm offset."""


class NamesrvRegistration(Protocol):
    """Registration with the NameServers (RocketMQ's BrokerOuterAPI side of the broker).

    Implemented by :class:`tidemq.broker.registration.NamesrvRegistrar`; called by admin
    processors after a metadata change, and by the broker's start and stop.
    """

    registered: dict[str, bool]

    def request(self) -> None:
        """Register again soon (coalesced): the topic table or the role changed."""

    async def register_all(self) -> None: ...

    async def unregister_all(self) -> None: ...


class ScheduleService(Protocol):
    """Delayed messages (RocketMQ's ScheduleMessageService).

    Implemented by :class:`tidemq.broker.schedule.ScheduleMessageService`; the send processor
    rewrites delayed messages with it, admin requests read its offsets.
    """

    offsets: dict[int, int]
    delivered: int

    @property
    def max_level(self) -> int: ...

    def rewrite(self, msg: MessageInner) -> bool:
        """Move a message with a delay level to the schedule topic; False when it has none."""

    def serialize(self) -> dict[str, Any]:
        """``{"offsetTable": {level: offset}}`` (delayOffset.json)."""

    def persist(self, force: bool = False) -> None: ...

    async def get_all_delay_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand: ...


class TransactionService(Protocol):
    """Transactional messages: half messages, commit/rollback, checks (TransactionalMessageService).

    Implemented by :class:`tidemq.broker.transaction.TransactionalMessageService`; the send
    service stores halves through it, the transaction service and RESUME_CHECK_HALF_MESSAGE call it.
    """

    checks_sent: int
    discarded: int

    def to_half(self, msg: MessageInner) -> None:
        """Rewrite a prepared message into the half topic."""

    async def end(
        self,
        peer_address: str,
        producer_group: str,
        tran_state_offset: int,
        commit_log_offset: int,
        kind: int,
        from_check: bool,
        transaction_id: str,
    ) -> str | None:
        """Commit or roll back the half message at ``commit_log_offset`` (END_TRANSACTION, without
        the wire); None when done, else why it was refused."""

    async def resume_check(self, msg_id: str) -> str | None:
        """Check a half message again; the problem found, or None."""


class FilterServerTable(Protocol):
    """Live ``tidemq filtersrv`` processes of this broker (RocketMQ's FilterServerManager).

    Implemented by :class:`tidemq.broker.processors.filter_server.FilterServerManager`; read by
    NameServer registration and the filter-server processor.
    """

    def addresses(self) -> list[str]: ...

    async def register(self, conn: Connection, request: RemotingCommand) -> RemotingCommand: ...


class PopFigures(Protocol):
    """POP consumption's figures (RocketMQ 5, issue 39), read-only.

    Implemented by :class:`tidemq.broker.pop.service.PopService` (its operations are served through
    :mod:`tidemq.broker.services.pop`); read by the admin service (consume stats, runtime info) and
    the metrics exporter.
    """

    def queue_progress(self, group: str, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(pop offset, messages in flight) of a queue ``group`` pops; None when it never popped it."""

    def in_flight_table(self) -> dict[tuple[str, str], int]:
        """(group, stored topic) -> popped, unacknowledged messages."""

    def figures(self) -> dict[str, int]:
        """``popCheckpoints``, ``popInFlight``, ``popRevived``, ``popDeadLettered``,
        ``popReviveLagMs``, ``popJournalBytes``."""


class TimerFigures(Protocol):
    """Timer messages' figures (RocketMQ 5, issue 36), read-only.

    Implemented by :class:`tidemq.broker.timer.TimerMessageStore` (its requests are served through
    :mod:`tidemq.broker.services.timer`); read by the admin service (runtime info) and the metrics
    exporter.
    """

    def runtime_info(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's timer keys (``timerReadBehind``, ``timerOffsetBehind``,
        ``timerCongestNum``, ``timerEnqueueTps``, ``timerDequeueTps``)."""

    def metric_values(self) -> dict[str, Any]:
        """Name -> value under RocketMQ 5's timer metric names (``*_total`` counters, a dict per
        topic for ``rocketmq_timing_messages``, gauges otherwise)."""


class TimerService(TimerFigures, Protocol):
    """Timer messages as the send paths see them: a message with ``TIMER_DELIVER_MS``,
    ``TIMER_DELAY_SEC`` or ``TIMER_DELAY_MS`` is parked in ``rmq_sys_wheel_timer`` until due.

    Implemented by :class:`tidemq.broker.timer.TimerMessageStore`; the send service rewrites single,
    batch and reply sends with it (after the send hooks), the transaction commit times a committed
    message from its commit.  A bad timer raises :class:`tidemq.broker.timer.TimerRefused` (its
    ``code`` and ``remark`` are the answer).
    """

    def rewrite(self, msg: MessageInner, strict: bool = True) -> bool:
        """Park ``msg`` when a timer asks for a later delivery; False when it goes now.  Not
        ``strict``: a bad timer is logged and the message goes now instead of raising."""

    def rewrite_batch(self, msgs: Sequence[MessageInner]) -> bool:
        """Park every message of a batch with a timer on any of them; False when none has one."""

    def recall_handle(self, msg: MessageInner) -> str | None:
        """The recall handle of a parked message (the send answer's ``recallHandle``), else None."""


# --------------------------------------------------------------------------- the broker


class DedupFigures(Protocol):
    """What runtime info and the metrics exporter read of the duplicate window (issue 37).

    Implemented by :class:`tidemq.broker.dedup.DuplicateWindow`; read on the broker's loop.
    """

    #: Keys held now, and their estimated bytes.
    entries: int
    nbytes: int
    #: Messages answered from the window instead of being stored, per topic, since start.
    dropped: dict[str, int]
    #: Sends evicted before their time to keep the bounds.
    evicted: int

    def figures(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's ``dedup*`` keys."""


class DuplicateWindowService(DedupFigures, Protocol):
    """The duplicate window as a send path asks it (issue 37; :mod:`tidemq.broker.dedup`).

    Implemented by :class:`tidemq.broker.dedup.DuplicateWindow`, whose docstrings say more; a
    ``Sent`` is what stored a key (answered, or pending while its ``send`` is set), ``hashes``
    the packed 64-bit hashes of a batch's keys (``tidemq.broker.dedup_table.hashes_of``).
    Called on the broker's loop, synchronously, one call per send or per batch.
    """

    def topic_settings(self, topic: str, cfg: object) -> tuple[float, bool]:
        """(seconds a topic's keys are kept, 0: none; whether its key is the content)."""

    def check(self, topic: str, key: str) -> Any:
        """The ``Sent`` that stored ``key`` within the window, or None."""

    def check_many(self, topic: str, hashes: Any) -> list[Any] | None:
        """Per key its ``Sent`` or None; None when no key is in the window at all."""

    def record(self, topic: str, hashes: Any, send: Any, window_s: float) -> Any:
        """The send about to be stored under its keys: its ``Sent`` (None: too large to keep)."""

    def same_body(self, sent: Any, pos: int, body: bytes, store: MessageStore) -> bool:
        """Whether ``body`` is the body of ``sent``'s message ``pos`` (a resend, not a reused key)."""

    def count_dropped(self, topic: str, n: int) -> None:
        """``n`` messages of ``topic`` were answered from the window instead of being stored."""

    def admit_run(self, sends: Sequence[Any], config_of: Callable[[str], object]) -> bool:
        """A run of prepared sends checked and recorded in one call (the send lane's); False:
        a resend or a repeated key, nothing recorded (the handler serves the run)."""

    def serving(self) -> bool:
        """Whether sends may be checked now (False while a rebuild after a promotion runs)."""

    async def wait_rebuilt(self, timeout: float = ...) -> bool:
        """Wait up to ``timeout`` seconds for that rebuild; whether none runs now."""


class BrokerFiguresView(Protocol):
    """What a metrics exporter reads of a broker, and nothing it could change.

    Handed by the broker to its metrics exporter (``MetricsExporter.start(service)``); implemented
    by :class:`tidemq.broker.Broker`.  Read on the broker's event loop at scrape time.
    """

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def address(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def store(self) -> MessageStore: ...

    @property
    def index(self) -> KeyIndex | None: ...

    @property
    def read_bound(self) -> ConfirmedReads:
        """The confirm offset's bound: queue ends and consumer lag as consumers see them
        (``max_offset``, ``limit``; RocketMQ 5's committed max offsets)."""

    @property
    def replication(self) -> Replication: ...

    @property
    def stats(self) -> BrokerStatsView: ...

    @property
    def offsets(self) -> ConsumerOffsetTable: ...

    @property
    def consumers(self) -> ConsumerRegistry: ...

    @property
    def producers(self) -> ProducerRegistry: ...

    @property
    def endpoint_figures(self) -> dict[str, Callable[[], Mapping[str, int]]]:
        """Counters of the endpoints plugins serve (BrokerContext.endpoint_figures)."""

    @property
    def hold(self) -> PullHoldService | None: ...

    @property
    def pop(self) -> PopFigures: ...

    @property
    def timers(self) -> TimerFigures: ...

    @property
    def dedup(self) -> DedupFigures:
        """The duplicate window on UNIQ_KEY (issue 37)."""

    @property
    def recovery_seconds(self) -> float:
        """Seconds the store took to load (recovery) at start-up."""

    @property
    def acl_refusals(self) -> int:
        """Requests the access validator refused since start."""


class BrokerContext(Protocol):
    """The broker as its request processors and plugins see it.

    Implemented by :class:`tidemq.broker.Broker`; handed to processors as
    ``ProcessorRegister.context`` and to the ``tidemq_broker_started``/``_stopping`` hooks.
    """

    @property
    def config(self) -> Config:
        """The broker's whole file: ``plugins`` (the plugin chosen per role) and their options."""

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def store(self) -> MessageStore: ...

    @property
    def index(self) -> KeyIndex | None:
        """The key index (role ``index``), None when the broker has none."""

    @property
    def replication(self) -> Replication: ...

    @property
    def role_aware(self) -> RoleAware | None:
        """The replication when it decides the role at run time (controller mode), else None."""

    @property
    def acl(self) -> AccessValidator | None:
        """The access validator (role ``acl``) when it enforces, else None."""

    @property
    def endpoints(self) -> dict[str, str]:
        """Other endpoints plugins serve for this broker, name -> ``host:port`` (``grpc``...): a
        plugin adds its own when it binds; the CLI announces each in its start-up lines."""

    @property
    def endpoint_figures(self) -> dict[str, Callable[[], Mapping[str, int]]]:
        """Counters of those endpoints, name -> a function giving ``figure -> value``
        (``connections``, ``calls``, ``requests_total``...): the metrics exporter serves them as
        ``tidemq_<name>_<figure>``, GET_BROKER_RUNTIME_INFO as ``<name><Figure>``."""

    @property
    def topics(self) -> TopicConfigTable: ...

    @property
    def groups(self) -> SubscriptionGroupTable: ...

    @property
    def offsets(self) -> ConsumerOffsetTable: ...

    @property
    def consumers(self) -> ConsumerRegistry: ...

    @property
    def producers(self) -> ProducerRegistry: ...

    @property
    def locks(self) -> RebalanceLocks: ...

    @property
    def stats(self) -> BrokerStatsService: ...

    @property
    def filters(self) -> dict[str, FilterFactory]:
        """Expression type -> its filter factory (every registered filter type, built at start)."""

    @property
    def filter_servers(self) -> FilterServerTable: ...

    @property
    def hold(self) -> PullHoldService | None:
        """Long polling, None until the broker has started."""

    @property
    def read_bound(self) -> ConfirmedReads:
        """Consumers' reads bounded by the confirm offset (controller SYNC masters)."""

    @property
    def registrar(self) -> NamesrvRegistration: ...

    @property
    def schedule(self) -> ScheduleService: ...

    @property
    def transactions(self) -> TransactionService: ...

    @property
    def pop(self) -> PopFigures:
        """POP consumption (RocketMQ 5); its operations: :mod:`tidemq.broker.services.pop`."""

    @property
    def timers(self) -> TimerService:
        """Timer messages (RocketMQ 5); its requests: :mod:`tidemq.broker.services.timer`."""

    @property
    def dedup(self) -> DuplicateWindowService:
        """The duplicate window on UNIQ_KEY (issue 37): asked by the send path, rebuilt at start."""

    @property
    def hooks(self) -> pluggy.HookRelay:
        """The pluggy hook relay (``hooks.tidemq_after_send(context=...)``)."""

    @property
    def client(self) -> TransportClient:
        """The transport's client (requests to clients and NameServers); usable once the broker serves."""

    @property
    def address(self) -> str: ...

    @property
    def store_host(self) -> tuple[str, int]: ...

    @property
    def is_master(self) -> bool: ...

    @property
    def role(self) -> str: ...

    @property
    def broker_id(self) -> int: ...

    @property
    def running(self) -> bool: ...

    @property
    def recovery_seconds(self) -> float: ...

    @property
    def acl_refusals(self) -> int: ...

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a fire-and-forget coroutine, keeping a reference until it ends."""

    def notify_consumer_ids_changed(self, group: str) -> None: ...

    def watch_connection(self, conn: Connection) -> None:
        """Drop a client's registrations when its connection closes."""


class ProcessorRegister:
    """Handed to ``tidemq_register_processors``: request code -> handler, for one broker.

    Built by the broker as it starts; plugins call :meth:`add` and :meth:`wrap`.
    """

    def __init__(self, context: BrokerContext) -> None:
        #: The broker the handlers serve; build processors around it.
        self.context = context
        self._handlers: dict[int, tuple[Handler, str]] = {}
        self._wrappers: list[tuple[int, Callable[[Handler], Handler], str]] = []
        self._plugin = "?"

    def add(self, code: int, handler: Handler) -> None:
        """Serve request ``code`` with ``handler``; a code may be taken by one plugin only.

        A handler that is also a :class:`tidemq.transport.BatchedProcessor` (the built-in send
        handler) gets consecutive requests of one read for its codes together through ``many``,
        each already past the ACL check.  A code that :meth:`wrap` wraps is served one request at
        a time.
        """
        code = int(code)
        existing = self._handlers.get(code)
        if existing is not None:
            raise PluginError(
                f"request code {code} is registered twice: by plugin {existing[1]!r} and by plugin {self._plugin!r}"
            )
        self._handlers[code] = (handler, self._plugin)

    def wrap(self, code: int, wrapper: Callable[[Handler], Handler]) -> None:
        """Replace the handler of ``code`` by ``wrapper(handler)`` once every plugin has added its own
        (RocketMQ's RPCHook role: time, trace or guard a request code)."""
        self._wrappers.append((int(code), wrapper, self._plugin))

    def handlers(self) -> dict[int, Handler]:
        """The handlers by code, wrappers applied in registration order."""
        out = {code: handler for code, (handler, _plugin) in self._handlers.items()}
        for code, wrapper, plugin in self._wrappers:
            if code not in out:
                raise PluginError(f"plugin {plugin!r} wraps request code {code}, which no plugin serves")
            out[code] = wrapper(out[code])
        return out

    def _as(self, plugin: str) -> ProcessorRegister:
        self._plugin = plugin
        return self
