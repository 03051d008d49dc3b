"""Entry point of the transport_grpc plugin: a gRPC endpoint beside the broker's remoting one.

A ``[transport.grpc]`` table in the broker's TOML file turns it on; the endpoint is bound while
the broker registers its request handlers (before it serves: a busy port or a missing grpcio
fails the start with one clear line), started once the broker serves and stopped with it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tidemq import CallValidator, hookimpl
from tidemq.context import BrokerContext, ProcessorRegister
from tidemq.errors import ConfigError
from tidemq.plugins import PluginContext, Register

from .options import grpc_options

if TYPE_CHECKING:
    from .server import GrpcServer

log = logging.getLogger(__name__)

#: The running endpoints, by broker (a process may run more than one broker: tests, standalone).
_SERVERS: dict[int, GrpcServer] = {}
_STOPPING: set[asyncio.Task[None]] = set()


def _refuse(ctx: PluginContext) -> Any:
    raise ConfigError(
        '[plugins] transport = "grpc": the gRPC endpoint serves beside the remoting transport, not '
        'instead of it; keep transport = "tcp" and add a [transport.grpc] table'
    )


@hookimpl
def tidemq_register_transports(register: Register) -> None:
    # Registered so that [transport.grpc] is a known options table; selecting it is refused.
    register.add("grpc", _refuse, "RocketMQ 5 gRPC endpoint, enabled by a [transport.grpc] table")


def enabled(broker: BrokerContext) -> dict[str, Any] | None:
    return broker.config.options.get("transport", {}).get("grpc")


def server_of(broker: BrokerContext) -> GrpcServer | None:
    """The broker's gRPC endpoint, when it has one (its ``address`` is where clients connect)."""
    return _SERVERS.get(id(broker))


@hookimpl
def tidemq_register_processors(register: ProcessorRegister) -> None:
    broker = register.context
    table = enabled(broker)
    if table is None:
        return
    options = grpc_options(table)
    if broker.acl is not None and not isinstance(broker.acl, CallValidator):
        # The RocketMQ 5 clients' signature is checked by the validator's validate_call: an
        # endpoint serving without it would let unsigned clients past the broker's ACL.
        raise ConfigError(
            f"[transport.grpc] cannot serve with this [plugins] acl: {type(broker.acl).__name__} does "
            "not check RocketMQ 5 clients' signatures (validate_call), so the gRPC endpoint would "
            'bypass the ACL; use acl = "plain" or remove one of the two'
        )
    try:
        from . import proto

        pb = proto.load()
        from .server import GrpcServer

        _SERVERS[id(broker)] = GrpcServer(broker, options, pb)
    except ConfigError as exc:
        if options.required:
            raise
        log.warning("gRPC endpoint (RocketMQ 5 clients) not served: %s", exc)


@hookimpl
def tidemq_broker_started(broker: BrokerContext) -> None:
    server = _SERVERS.get(id(broker))
    if server is not None:
        server.begin()


@hookimpl
def tidemq_broker_stopping(broker: BrokerContext) -> None:
    server = _SERVERS.pop(id(broker), None)
    if server is not None:
        task = asyncio.get_running_loop().create_task(server.stop())
        _STOPPING.add(task)
        task.add_done_callback(_STOPPING.discard)
