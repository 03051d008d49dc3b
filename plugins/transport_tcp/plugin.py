"""Entry point of the transport_tcp plugin: registers transport ``tcp``."""

from __future__ import annotations

from tidemq import hookimpl
from tidemq.plugins import PluginContext, Register
from tidemq_transport_tcp.options import parse_tcp_options
from tidemq_transport_tcp.transport import TcpTransport


def create(ctx: PluginContext) -> TcpTransport:
    return TcpTransport(parse_tcp_options(dict(ctx.options), "[transport.tcp]"))


@hookimpl
def tidemq_register_transports(register: Register) -> None:
    register.add("tcp", create, "asyncio TCP (uvloop when installed), optional TLS")
