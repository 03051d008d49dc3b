"""What request processors may use of the broker (:class:`BrokerContext`), and how they register.

Processors used to receive ``broker: Any`` and reach through it; :class:`BrokerContext` names the
collaborators they really use, so a type checker holds them to it and a third-party processor
knows what it may touch.  :class:`tidemq.broker.Broker` satisfies it.

Request handlers are registered through the ``tidemq_register_processors`` hook with a
:class:`ProcessorRegister`: built-in processors and third-party plugins alike add handlers by
request code (a code taken twice is an error naming both plugins) and may wrap a handler, all
before the broker's server starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tidemq.errors import PluginError
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.broker.clients import ConsumerManager, ProducerManager, RebalanceLockManager
    from tidemq.broker.hold import PullRequestHoldService
    from tidemq.broker.offsets import ConsumerOffsetManager
    from tidemq.broker.processors.filter_server import FilterServerManager
    from tidemq.broker.registration import NamesrvRegistrar
    from tidemq.broker.schedule import ScheduleMessageService
    from tidemq.broker.stats import BrokerStats
    from tidemq.broker.subscriptions import SubscriptionGroupManager
    from tidemq.broker.timer import TimerMessageStore
    from tidemq.broker.topics import TopicConfigManager
    from tidemq.broker.transaction import TransactionalMessageService
    from tidemq.config import BrokerSettings
    from tidemq.remoting.command import RemotingCommand
    from tidemq.replication import Replication, RoleAware
    from tidemq.store import MessageStore

#: ``handler(conn, request)`` -> the response, or None (oneway requests, connections gone).
Handler = Callable[[Any, "RemotingCommand"], Awaitable["RemotingCommand | None"]]


class BrokerContext(Protocol):
    """The broker as its request processors see it."""

    settings: BrokerSettings
    data_dir: Path
    store: MessageStore
    index: Any  # the key index (role ``index``), None when the broker has none
    replication: Replication
    role_aware: RoleAware | None  # the replication when it decides the role at run time (controller mode)
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    consumers: ConsumerManager
    producers: ProducerManager
    locks: RebalanceLockManager
    stats: BrokerStats
    filters: dict[str, Any]  # expression type -> tidemq.filter.FilterFactory
    filter_servers: FilterServerManager
    hold: PullRequestHoldService | None
    registrar: NamesrvRegistrar
    schedule: ScheduleMessageService
    timers: TimerMessageStore  # timer messages (issue 36)
    transactions: TransactionalMessageService
    hooks: Any  # the pluggy hook relay
    client: Any  # the transport client (requests to clients and NameServers)

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

    def spawn(self, coro: Awaitable[Any]) -> None: ...

    def notify_consumer_ids_changed(self, group: str) -> None: ...

    def watch_connection(self, conn: Connection) -> None: ...


class ProcessorRegister:
    """Handed to ``tidemq_register_processors``: request code -> handler, for one broker."""

    def __init__(self, context: BrokerContext) -> None:
        #: The broker the handlers serve; build processors around it.
        self.context = context
        self._handlers: dict[int, tuple[Handler, str]] = {}
        self._wrappers: list[tuple[int, Callable[[Handler], Handler], str]] = []
        self._plugin = "?"

    def add(self, code: int, handler: Handler) -> None:
        """Serve request ``code`` with ``handler``; a code may be taken by one plugin only.

        A handler with a ``many(conn, requests, failed)`` method (the built-in send handler) also
        gets consecutive requests of one read for its codes together, each already past the ACL
        check, and returns one response or awaitable per request; ``failed(request, exc)`` answers
        one that raised.  A code that :meth:`wrap` wraps is served one request at a time.
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
