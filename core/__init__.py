"""tidemq: a RocketMQ 4.x compatible message broker built as a pluggy plugin framework.

The kernel is small: :mod:`tidemq.hookspecs` names the hooks, :mod:`tidemq.plugins` loads plugins
from the ``tidemq`` entry-point group and :mod:`tidemq.config` composes a broker from a TOML file
that names the plugin serving each role.

The plugin-facing API is ``tidemq.__all__``: ``hookimpl``, the plugin machinery
(``PluginContext``, ``Register``...), option parsing, the errors and the role contracts (one
Protocol per role, and what crosses them: messages, put/get results, dispatch requests...).  These
names import lazily, so ``import tidemq`` stays as cheap as pluggy.  Besides them, these
submodules are public through their own ``__all__``: ``tidemq.client`` (the client and its
lower-level requests), ``tidemq.remoting`` (and its ``codes``, ``command``, ``codec``, ``errors``
and ``protocol`` modules: the wire format), ``tidemq.cli`` (running a service from a plugin's
command), ``tidemq.message`` (the message and commit-log record format), ``tidemq.address``,
``tidemq.compression``, ``tidemq.context`` (the broker as processors see it: its service
Protocols and ``ProcessorRegister``, also in ``__all__``), ``tidemq.datadir``, ``tidemq.file_regions`` (sendfile sources),
``tidemq.writeback`` (a file's dirty pages written back early, ``sync_file_range``),
``tidemq.logs`` (log handlers and progress reports of long tasks), ``tidemq.threads`` (a
plugin thread's name in the kernel, for ``top -H`` and ``perf``),
``tidemq.metrics`` (the metrics role and its ``Buckets`` histogram), ``tidemq.mqjson``
(fastjson's MessageQueue-keyed maps), ``tidemq.names`` and ``tidemq.trace`` (message trace
records in RocketMQ's format, and ``tidemq.trace.view``, the per-message view of them: what a trace
exporter plugin reads).  ``tidemq.broker.services`` is the broker's operations for a transport
plugin (send, pull, offsets, clients, transactions: plain values in, a typed outcome out, the
services the remoting processors call), with ``tidemq.broker.services.transactions`` for the
transaction check's seam (a producer connection that takes a check as a value).
``tidemq.pop_header`` is RocketMQ 5's POP answer header (retry marks, info items), as the broker writes
it and a POP client reads it.  ``tidemq.topic_attributes`` is RocketMQ 5's topic attributes (``message.type``: which messages a
topic takes, and the check a transport makes of a message's type).
Anything else a plugin imports is an internal it should not rely on: ``tests/test_public_api.py``
keeps the built-in plugins to this surface and lists the exceptions, each with its reason.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

__version__ = "0.1.0"

PROJECT = "tidemq"
#: Mark plugin functions with ``@tidemq.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = [
    "PROJECT",
    "__version__",
    "hookimpl",
    # plugin machinery and options
    "PluginContext",
    "PluginManager",
    "Register",
    "get_plugin_manager",
    "number",
    "parse_address",
    "parse_options",
    # errors
    "AccessDenied",
    "ConfigError",
    "CorruptDataError",
    "MessageTooLargeError",
    "PluginError",
    "StoreError",
    "TidemqError",
    "WindowRebuilding",  # the duplicate window is being rebuilt: a transport answers "retry"
    # role contracts (runtime-checkable Protocols), by role
    "Connection",  # transport
    "ConnectionState",
    "RequestHandler",
    "BatchedRequestHandler",
    "ReadLaneHandler",
    "BatchedProcessor",
    "Transport",
    "TransportClient",
    "TransportServer",
    "Flushable",  # flush
    "FlushPolicy",
    "SubmittingFlushPolicy",
    "RoundFlushPolicy",
    "FlushStatistics",
    "RoundStatistics",
    "FlushRoundStats",
    "DirectRound",
    "DirectRoundFlushable",
    "StoreFuture",
    "SharedCompletion",
    "resolve_all",
    "complete_all",
    "complete_here",
    "resume_eager",  # eager (the transports' handlers run before a Task)
    "KeyIndex",  # index
    "RecoverableIndex",
    "VerifiableIndex",
    "IndexBacklog",
    "IndexFileInfo",
    "IndexFileEntry",
    "Dispatcher",  # store
    "BatchDispatcher",
    "GroupDispatcher",
    "DispatchedPut",
    "takes_groups",
    "MessageStore",
    "RawCommitLogStore",
    "StoreIntrospection",
    "TruncatableStore",
    "GroupPut",
    "group_put",
    "RequestLanes",
    "SendLane",
    "PullLane",
    "PullLanes",
    "PulledRecords",
    "SendFrameLane",
    "InMemoryWindow",  # the store's pull rule: accessMessageInMemoryMaxRatio of RAM
    "DEFAULT_IN_MEMORY_RATIO",
    "memory_for_messages",
    "lane_counts",  # the broker's request lanes: what they served and handed to Python
    "EntryPrefilter",  # filter
    "DispatchingFilterFactory",
    "FilterFactory",
    "MessageFilter",
    "SelectsEverything",
    "SelectsByTag",
    "queue_entry_check",
    "tag_selection",
    "compiled_twin",  # extensions
    "twins",
    "MasterAware",  # replication
    "RoleAware",
    "MetadataFollower",
    "MetadataSink",
    "Replication",
    "AllocateStrategy",  # allocate, select
    "QueueSelector",
    "AccessValidator",  # acl
    "AccessLanes",
    "AllowAll",
    "CallValidator",
    "LaneAccessCheck",
    "NotAuthenticated",
    "SignedCall",
    "MetricsExporter",  # metrics
    "BrokerContext",  # the broker as processors and plugins see it (tidemq.context)
    "BrokerFiguresView",
    "BrokerStatsService",
    "BrokerStatsView",
    "ConsumerOffsetTable",
    "ConsumerRegistry",
    "FilterServerTable",
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
    # what crosses the contracts
    "EXPRESSION_SQL92",
    "EXPRESSION_TAG",
    "MessageExt",
    "MessageInner",
    "MessageQueue",
    "Prop",
    "DispatchRequest",
    "GetResult",
    "GetStatus",
    "PutResult",
    "PutStatus",
    "ArrivalNotifier",  # helpers for store plugins
    "ArrivalInterest",
    "ArrivalInterests",
    "arrival_interest",
    "check_queue_offset",
    "dispatch_messages",
    "store_introspection",
    "QueryResult",
    "ReplicaStatus",
    "ConsumeContext",
    "SendContext",
]

#: Where each name above (but the first three) is defined: imported on first use by __getattr__.
_SOURCES: dict[str, tuple[str, ...]] = {
    "tidemq.acl": (
        "AccessDenied",
        "AccessLanes",
        "AccessValidator",
        "AllowAll",
        "CallValidator",
        "LaneAccessCheck",
        "NotAuthenticated",
        "SignedCall",
    ),
    "tidemq.config": ("number", "parse_address", "parse_options"),
    "tidemq.context": (
        "BrokerContext",
        "BrokerFiguresView",
        "BrokerStatsService",
        "BrokerStatsView",
        "ConsumerOffsetTable",
        "ConsumerRegistry",
        "FilterServerTable",
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
    ),
    "tidemq.errors": (
        "ConfigError",
        "CorruptDataError",
        "MessageTooLargeError",
        "PluginError",
        "StoreError",
        "TidemqError",
    ),
    "tidemq.filter": (
        "EXPRESSION_SQL92",
        "EXPRESSION_TAG",
        "DispatchingFilterFactory",
        "EntryPrefilter",
        "FilterFactory",
        "MessageFilter",
        "SelectsEverything",
        "SelectsByTag",
        "queue_entry_check",
        "tag_selection",
    ),
    "tidemq.eager": ("resume_eager",),
    "tidemq.extensions": ("compiled_twin", "twins"),
    "tidemq.flush": (
        "DirectRound",
        "DirectRoundFlushable",
        "Flushable",
        "FlushPolicy",
        "FlushRoundStats",
        "FlushStatistics",
        "RoundFlushPolicy",
        "RoundStatistics",
        "SubmittingFlushPolicy",
    ),
    "tidemq.futures": ("SharedCompletion", "StoreFuture", "complete_all", "complete_here", "resolve_all"),
    "tidemq.broker.dedup": ("WindowRebuilding",),
    "tidemq.broker.lanes": ("lane_counts",),
    "tidemq.index": (
        "IndexBacklog",
        "IndexFileEntry",
        "IndexFileInfo",
        "KeyIndex",
        "QueryResult",
        "RecoverableIndex",
        "VerifiableIndex",
    ),
    "tidemq.message": ("MessageExt", "MessageInner", "Prop"),
    "tidemq.metrics": ("MetricsExporter",),
    "tidemq.observe": ("ConsumeContext", "SendContext"),
    "tidemq.plugins": ("PluginContext", "PluginManager", "Register", "get_plugin_manager"),
    "tidemq.queues": ("AllocateStrategy", "MessageQueue", "QueueSelector"),
    "tidemq.replication": (
        "MasterAware",
        "MetadataFollower",
        "MetadataSink",
        "ReplicaStatus",
        "Replication",
        "RoleAware",
    ),
    "tidemq.store": (
        "ArrivalInterest",
        "ArrivalInterests",
        "DEFAULT_IN_MEMORY_RATIO",
        "ArrivalNotifier",
        "BatchDispatcher",
        "Dispatcher",
        "DispatchRequest",
        "DispatchedPut",
        "GroupDispatcher",
        "GetResult",
        "GetStatus",
        "GroupPut",
        "InMemoryWindow",
        "MessageStore",
        "PutResult",
        "PutStatus",
        "RawCommitLogStore",
        "PullLane",
        "PullLanes",
        "PulledRecords",
        "RequestLanes",
        "SendFrameLane",
        "SendLane",
        "StoreIntrospection",
        "TruncatableStore",
        "check_queue_offset",
        "arrival_interest",
        "dispatch_messages",
        "group_put",
        "memory_for_messages",
        "store_introspection",
        "takes_groups",
    ),
    "tidemq.transport": (
        "BatchedProcessor",
        "BatchedRequestHandler",
        "Connection",
        "ConnectionState",
        "ReadLaneHandler",
        "RequestHandler",
        "Transport",
        "TransportClient",
        "TransportServer",
    ),
}
_LAZY = {name: module for module, names in _SOURCES.items() for name in names}

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from tidemq.acl import (
        AccessDenied,
        AccessLanes,
        AccessValidator,
        AllowAll,
        CallValidator,
        LaneAccessCheck,
        NotAuthenticated,
        SignedCall,
    )
    from tidemq.broker.dedup import WindowRebuilding
    from tidemq.broker.lanes import lane_counts
    from tidemq.config import number, parse_address, parse_options
    from tidemq.context import (
        BrokerContext,
        BrokerFiguresView,
        BrokerStatsService,
        BrokerStatsView,
        ConsumerOffsetTable,
        ConsumerRegistry,
        FilterServerTable,
        NamesrvRegistration,
        PopFigures,
        ProcessorRegister,
        ProducerRegistry,
        PullHoldService,
        RebalanceLocks,
        ScheduleService,
        SubscriptionGroupTable,
        TimerFigures,
        TimerService,
        TopicConfigTable,
        TransactionService,
    )
    from tidemq.eager import resume_eager
    from tidemq.errors import (
        ConfigError,
        CorruptDataError,
        MessageTooLargeError,
        PluginError,
        StoreError,
        TidemqError,
    )
    from tidemq.extensions import compiled_twin, twins
    from tidemq.filter import (
        EXPRESSION_SQL92,
        EXPRESSION_TAG,
        DispatchingFilterFactory,
        EntryPrefilter,
        FilterFactory,
        MessageFilter,
        SelectsByTag,
        SelectsEverything,
        queue_entry_check,
        tag_selection,
    )
    from tidemq.flush import (
        DirectRound,
        DirectRoundFlushable,
        Flushable,
        FlushPolicy,
        FlushRoundStats,
        FlushStatistics,
        RoundFlushPolicy,
        RoundStatistics,
        SubmittingFlushPolicy,
    )
    from tidemq.futures import SharedCompletion, StoreFuture, complete_all, complete_here, resolve_all
    from tidemq.index import (
        IndexBacklog,
        IndexFileEntry,
        IndexFileInfo,
        KeyIndex,
        QueryResult,
        RecoverableIndex,
        VerifiableIndex,
    )
    from tidemq.message import MessageExt, MessageInner, Prop
    from tidemq.metrics import MetricsExporter
    from tidemq.observe import ConsumeContext, SendContext
    from tidemq.plugins import PluginContext, PluginManager, Register, get_plugin_manager
    from tidemq.queues import AllocateStrategy, MessageQueue, QueueSelector
    from tidemq.replication import (
        MasterAware,
        MetadataFollower,
        MetadataSink,
        ReplicaStatus,
        Replication,
        RoleAware,
    )
    from tidemq.store import (
        DEFAULT_IN_MEMORY_RATIO,
        ArrivalInterest,
        ArrivalInterests,
        ArrivalNotifier,
        BatchDispatcher,
        DispatchedPut,
        Dispatcher,
        DispatchRequest,
        GetResult,
        GetStatus,
        GroupDispatcher,
        GroupPut,
        InMemoryWindow,
        MessageStore,
        PulledRecords,
        PullLane,
        PullLanes,
        PutResult,
        PutStatus,
        RawCommitLogStore,
        RequestLanes,
        SendFrameLane,
        SendLane,
        StoreIntrospection,
        TruncatableStore,
        arrival_interest,
        check_queue_offset,
        dispatch_messages,
        group_put,
        memory_for_messages,
        store_introspection,
        takes_groups,
    )
    from tidemq.transport import (
        BatchedProcessor,
        BatchedRequestHandler,
        Connection,
        ConnectionState,
        ReadLaneHandler,
        RequestHandler,
        Transport,
        TransportClient,
        TransportServer,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
