"""Bad bytes from a peer: the log lines they are worth and the answer a bad header gets.

Deliberately laxer than RocketMQ, whose NettyDecoder closes the channel on any decoding failure:
the stream is still in sync after a bad header, so a command whose opaque could be read is
answered with SYSTEM_ERROR and the connection kept (:class:`~tidemq_transport_tcp.connection.
Connection` closes it when no opaque could be read, or the frame itself is broken).
"""

from __future__ import annotations

import logging

from tidemq.remoting import HeaderError, RemotingCommand, ResponseCode, SerializeType
from tidemq.remoting.codes import FLAG_RESPONSE

log = logging.getLogger("tidemq_transport_tcp.connection")

#: Bad headers of one connection logged at WARNING; the rest at DEBUG.
BAD_HEADER_WARNINGS = 10


def log_bad_header(count: int, address: str, exc: HeaderError) -> None:
    """The ``count``-th bad header from ``address``: WARNING for the first ones, then DEBUG (each
    is still answered; a flood of them must not become a flood of log lines)."""
    if count <= BAD_HEADER_WARNINGS:
        log.warning("bad command header from %s: %s", address, exc)
        if count == BAD_HEADER_WARNINGS:
            log.warning("further bad command headers from %s are logged at DEBUG", address)
    else:
        log.debug("bad command header from %s: %s", address, exc)


def bad_header_reply(exc: HeaderError, opaque: int) -> RemotingCommand:
    """SYSTEM_ERROR for a request whose header could not be read but whose ``opaque`` could."""
    return RemotingCommand(
        code=ResponseCode.SYSTEM_ERROR,
        opaque=opaque,
        flag=FLAG_RESPONSE,
        remark=f"bad request header: {exc}",
        serialize_type=SerializeType(exc.serialize_type),
    )
