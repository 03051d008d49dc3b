"""Errors of the remoting layer: framing, header decoding and request/response calls."""

from __future__ import annotations

from tidemq.errors import TidemqError


class ProtocolError(TidemqError):
    """Bytes on the wire do not follow the RocketMQ remoting protocol.

    The codec's one error type: encoding and decoding raise nothing else (a MemoryError aside).
    """


class FrameError(ProtocolError):
    """The frame itself is broken (bad length, oversize, unknown serialize type).

    The byte stream cannot be resynchronised: the connection must be closed.
    """


class HeaderError(ProtocolError):
    """A well-framed command whose header cannot be decoded.

    The stream stays in sync, so the connection may be kept; ``opaque``/``code``/``flag`` hold
    what could be read (None when unknown) so an error response can be sent.
    """

    def __init__(
        self,
        message: str,
        *,
        opaque: int | None = None,
        code: int | None = None,
        flag: int | None = None,
        serialize_type: int = 0,
    ) -> None:
        super().__init__(message)
        self.opaque = opaque
        self.code = code
        self.flag = flag
        self.serialize_type = serialize_type


class BodyError(ProtocolError):
    """A command body is not in the format its code calls for (bad JSON, bad compressed data)."""


class RemotingError(TidemqError):
    """A remote call failed."""


class RemotingTimeoutError(RemotingError):
    """No response arrived within the call's timeout."""


class RemotingConnectError(RemotingError):
    """The peer could not be connected to (refused, unreachable, bad address, TLS failure)."""


class RemotingSendError(RemotingError):
    """The request could not be sent, or the connection closed before the response arrived."""


__all__ = [
    "BodyError",
    "FrameError",
    "HeaderError",
    "ProtocolError",
    "RemotingConnectError",
    "RemotingError",
    "RemotingSendError",
    "RemotingTimeoutError",
]
