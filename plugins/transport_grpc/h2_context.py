"""What a handler of the native gRPC server (:mod:`.h2_server`) sees of its call.

:class:`CallContext` has the ``grpc.aio.ServicerContext`` methods the service's handlers use
(``peer``, ``invocation_metadata``, ``abort``, ``time_remaining``, ``cancelled``, ``write``,
``set_code``/``set_details``), so the same handlers serve under grpcio and under this server.
Also the wire helpers of gRPC over HTTP/2: ``grpc-timeout`` parsing, the message prefix, the
status trailers.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from .h2_frames import literal

if TYPE_CHECKING:
    from .h2_call import Call as _Call
    from .h2_connection import Http2Protocol

#: grpc-timeout's units, in seconds.
_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}


def parse_timeout(value: bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` value (``100m``, ``5S``: at most 8 digits and a unit), None
    for none or one that does not parse (the call then has no deadline, as grpcio's core does)."""
    if not value or len(value) > 9 or value[-1] not in _UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * _UNITS[value[-1]]


def encode_message(payload: bytes) -> bytes:
    """One gRPC message: uncompressed flag, 4-byte big-endian length, the bytes."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _percent(text: str) -> bytes:
    """grpc-message's encoding: UTF-8, bytes outside printable ASCII and ``%`` as ``%XX``."""
    raw = text.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


_STATUS_CACHE: dict[tuple[grpc.StatusCode, str], bytes] = {}


def status_of(code: grpc.StatusCode, details: str) -> bytes:
    """The trailers of a call's status, as an HPACK block of literals (no table state)."""
    cached = _STATUS_CACHE.get((code, details))
    if cached is not None:
        return cached
    block = literal(b"grpc-status", str(code.value[0]).encode())
    if details:
        block += literal(b"grpc-message", _percent(details[:1024]))
    if len(_STATUS_CACHE) < 256:
        _STATUS_CACHE[(code, details)] = block
    return block


_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))


def metadata_of(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, Any], ...]:
    metadata: list[tuple[str, Any]] = []
    for name, value in headers:
        if name[:1] == b":" or name in _RESERVED:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            metadata.append((key, value.decode("latin-1")))
    return tuple(metadata)


class AbortError(Exception):
    """Raised by :meth:`CallContext.abort`: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class CallDetails:
    """``grpc.HandlerCallDetails``: what a generic handler looks a method up by."""

    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, invocation_metadata: tuple[tuple[str, Any], ...]) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class CallContext:
    """One call, as a ``grpc.aio.ServicerContext`` shows it to a handler."""

    __slots__ = (
        "method",
        "_peer",
        "_headers",
        "_metadata",
        "deadline",
        "_code",
        "_details",
        "_cancelled",
        "_expired",
        "_call",
        "_connection",
    )

    def __init__(
        self, method: str, peer: str, headers: list[tuple[bytes, bytes]], timeout: float | None
    ) -> None:
        self.method = method
        self._peer = peer
        self._headers = headers
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        #: The loop's clock (time.monotonic) at which the call's deadline passes, or None.
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self._cancelled = False
        self._expired = False
        self._call: _Call | None = None
        self._connection: Http2Protocol | None = None

    def peer(self) -> str:
        """The client's address, as grpcio says it: ``ipv4:127.0.0.1:5678``, ``ipv6:[::1]:5678``."""
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        """The request's metadata (``-bin`` keys' values as bytes), made from its headers when
        first asked for: pseudo-headers and HTTP/2's and gRPC's own fields are not metadata."""
        if self._metadata is None:
            self._metadata = metadata_of(self._headers)
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        """End the call with this status (raises)."""
        raise AbortError(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def time_remaining(self) -> float | None:
        """Seconds left before the deadline, None without one."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def cancelled(self) -> bool:
        """The client cancelled (reset the stream, closed the connection) or the deadline passed."""
        return self._cancelled or self._expired

    def done(self) -> bool:
        return self._call is not None and self._call.closed

    async def write(self, message: Any) -> None:
        """One response message of a streaming call."""
        assert self._connection is not None and self._call is not None
        await self._connection.write(self._call, message)

    async def send_initial_metadata(self, metadata: Any) -> None:
        return None

    def set_trailing_metadata(self, metadata: Any) -> None:
        return None
