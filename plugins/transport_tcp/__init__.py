"""tidemq_transport_tcp: the asyncio TCP transport plugin."""

from tidemq_transport_tcp.loop import new_event_loop, run, uvloop_available
from tidemq_transport_tcp.options import TcpOptions
from tidemq_transport_tcp.transport import Connection, TcpClient, TcpServer, TcpTransport, parse_address

__all__ = [
    "Connection",
    "TcpClient",
    "TcpOptions",
    "TcpServer",
    "TcpTransport",
    "new_event_loop",
    "parse_address",
    "run",
    "uvloop_available",
]
