"""Hook specifications: the whole contract between the kernel and its plugins.

Two kinds of hooks live here.

*Registration hooks* (``tidemq_register_<role>s``) are called once by
:class:`tidemq.plugins.PluginManager` right after plugins are loaded.  Each receives a
:class:`tidemq.plugins.Register` for its role and adds named factories to it.  Every plugin is
called (no firstresult); the order does not matter because a name may be registered only once
per role: a duplicate is a load-time :class:`~tidemq.errors.PluginError` naming both plugins.
The broker's TOML config then picks one name per role (``store = "mmap"``); see
:mod:`tidemq.config`.

A factory is a callable ``factory(ctx: tidemq.plugins.PluginContext) -> instance``.  The
composer builds the roles in :data:`tidemq.plugins.BUILD_ORDER`, and ``ctx.components`` holds
the instances already built (the store factory finds its flush policy and key index there).

*Runtime hooks* are called by the broker (or by tidemq's client) while it runs.  pluggy calls
implementations last-registered first; built-in plugins are registered before third-party ones
(entry points are loaded sorted by distribution then name, built-ins first), so a third-party
plugin sees a runtime hook before the built-ins unless it marks itself ``trylast``.  Hooks marked
firstresult stop at the first implementation returning something other than ``None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from tidemq import PROJECT

if TYPE_CHECKING:
    import click

    from tidemq.context import BrokerContext, ProcessorRegister
    from tidemq.observe import ConsumeContext, SendContext
    from tidemq.plugins import Register
    from tidemq.trace.format import TraceContext

hookspec = pluggy.HookspecMarker(PROJECT)


# --------------------------------------------------------------------------- registration hooks


@hookspec
def tidemq_register_transports(register: Register) -> None:
    """Add transport factories (role ``transport``).

    Called once by the plugin manager at load time.  A factory returns an object implementing
    :class:`tidemq.transport.Transport`: it creates servers (broker, NameServer) and clients
    (broker→NameServer registration, tidemq's own client).  Returns nothing.
    """


@hookspec
def tidemq_register_stores(register: Register) -> None:
    """Add message store factories (role ``store``).

    Called once by the plugin manager at load time.  A factory returns an object implementing
    :class:`tidemq.store.MessageStore`; it may read ``ctx.components["flush"]`` and
    ``ctx.components["index"]``, which are built before it.  Returns nothing.
    """


@hookspec
def tidemq_register_flush_policies(register: Register) -> None:
    """Add flush policy factories (role ``flush``: ``sync``, ``async``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.flush.FlushPolicy` which the store starts with its commit log as target.
    Returns nothing.
    """


@hookspec
def tidemq_register_indexes(register: Register) -> None:
    """Add key index factories (role ``index``: ``hash``, ``none``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.index.KeyIndex`; the store dispatches every stored message to it and the
    broker queries it for QUERY_MESSAGE.  Returns nothing.
    """


@hookspec
def tidemq_register_filters(register: Register) -> None:
    """Add message filter types (role ``filter``; names are expression types: ``TAG``, ``SQL92``).

    Called once by the plugin manager at load time.  Unlike other roles, every registered filter
    type is available at once: a consumer names its expression type when it subscribes.  A
    factory returns a :class:`tidemq.filter.FilterFactory`.  Returns nothing.
    """


@hookspec
def tidemq_register_replications(register: Register) -> None:
    """Add replication (HA) factories (role ``replication``: ``none``, ``master_slave``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.replication.Replication` which the broker starts after the store.
    Returns nothing.
    """


@hookspec
def tidemq_register_allocate_strategies(register: Register) -> None:
    """Add consumer rebalance strategies (role ``allocate``: ``averagely``, ``consistent_hash``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.queues.AllocateStrategy`, used by consumers when they rebalance.
    Returns nothing.
    """


@hookspec
def tidemq_register_queue_selectors(register: Register) -> None:
    """Add producer queue selectors (role ``select``: ``round_robin``, ``latency_fault``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.queues.QueueSelector`, which picks the queue for each send and learns from
    send latencies and failures (fault avoidance).  Returns nothing.
    """


@hookspec
def tidemq_register_acl_validators(register: Register) -> None:
    """Add access validator factories (role ``acl``: ``none``, ``plain``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.acl.AccessValidator`; the broker builds the one its config names
    (``[plugins] acl = "plain"``, default none) after its other roles and calls its
    ``validate(request, remote_addr)`` for every request before the request's processor, answering
    NO_PERMISSION when it raises :class:`tidemq.acl.AccessDenied`.  Returns nothing.
    """


@hookspec
def tidemq_register_metrics_exporters(register: Register) -> None:
    """Add metrics exporter factories (role ``metrics``: ``prometheus``...).

    Called once by the plugin manager at load time.  A factory returns a
    :class:`tidemq.metrics.MetricsExporter`; a broker (or NameServer) whose config names one
    (``[plugins] metrics = "prometheus"``, default none; ``tidemq standalone`` defaults to
    ``prometheus`` on loopback) builds it with its other roles and awaits ``start(service)`` once
    it serves, ``stop()`` when it stops.  Returns nothing.
    """


@hookspec
def tidemq_register_processors(register: ProcessorRegister) -> None:
    """Add (or wrap) the broker's request handlers, by request code.

    Called by each broker as it starts, after its metadata and filters are loaded and before its
    store loads (handlers run only once the server accepts connections), with a :class:`tidemq.context.ProcessorRegister` whose ``context``
    is the broker (a :class:`tidemq.context.BrokerContext`).  ``register.add(code, handler)``
    serves a code (a code taken twice is an error naming both plugins); ``register.wrap(code, fn)``
    replaces a handler by ``fn(handler)`` once all are added.  The built-in processors register
    here too.  Returns nothing.
    """


@hookspec
def tidemq_add_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``tidemq`` command line.

    Called by :mod:`tidemq.cli` while it builds its command group, before arguments are parsed.
    Plugins add their own commands (``tidemq filtersrv``, ``tidemq admin ...``).  Returns nothing.
    """


# --------------------------------------------------------------------------- runtime hooks


@hookspec
def tidemq_broker_started(broker: BrokerContext) -> None:
    """Observe a broker that has started serving.

    Called by the broker once, after its store, replication and transport have started and it has
    registered with the NameServers, with the broker as a :class:`tidemq.context.BrokerContext`.
    Returns nothing; an exception is logged, not raised.  A plugin that needs a part of the broker
    to work gets it handed at start instead (a replication its metadata sink and client through
    :class:`tidemq.replication.MetadataFollower`, a metrics exporter its figures view).
    """


@hookspec
def tidemq_broker_stopping(broker: BrokerContext) -> None:
    """Observe a broker that is about to stop.

    Called by the broker once at the start of shutdown, while the store is still open.
    Returns nothing.
    """


@hookspec(firstresult=True)
def tidemq_before_send(context: SendContext) -> str | None:
    """Inspect, annotate or veto a message before it is stored (broker side) or sent (client side).

    Called by the broker's send processor (and tidemq's producer) for every message, with a
    :class:`tidemq.observe.SendContext` (``context.side``: ``"broker"`` or ``"client"``).  Tracing
    plugins add properties and return ``None``.  A
    plugin that refuses the message (an ACL, a quota) returns the reason as a string; the first
    non-``None`` result wins, stops the remaining implementations and fails the send with it.
    """


@hookspec
def tidemq_after_send(context: SendContext) -> None:
    """Observe the outcome of a send (``context.status``, ``context.elapsed``).

    Called by the broker's send processor (and tidemq's producer) after the store answered,
    whether the send succeeded or not.  For metrics and tracing.  Returns nothing.
    """


@hookspec
def tidemq_before_consume(context: ConsumeContext) -> None:
    """Observe a pull request before the store is read.

    Called by the broker's pull processor (and tidemq's consumers before they run the listener)
    with a :class:`tidemq.observe.ConsumeContext` (``context.side``: ``"broker"`` or ``"client"``).
    The broker builds the context only when some plugin implements a consume hook.  Returns nothing.
    """


@hookspec
def tidemq_after_consume(context: ConsumeContext) -> None:
    """Observe the messages found (``context.message_count``) or the consume outcome.

    Called by the broker's pull processor after the store answered (and by tidemq's consumers
    after the listener returned).  Returns nothing.
    """


@hookspec
def tidemq_trace_dispatched(contexts: list[TraceContext]) -> None:
    """Export message-trace records elsewhere (OpenTelemetry spans, logs, another store).

    Called by the trace dispatcher of a tidemq client built with ``enable_msg_trace=True``, from
    its background task, with each batch of :class:`tidemq.trace.TraceContext` (Pub, SubBefore,
    SubAfter, EndTransaction) just before the batch is sent to the trace topic; the hook is
    consulted per batch and only when some plugin implements it.  An error is logged, never
    raised into the client.  Returns nothing.
    """
