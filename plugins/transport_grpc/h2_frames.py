"""HTTP/2 for a gRPC server, sans-IO: bytes in, events and bytes out (RFC 9113).

Only what a gRPC server needs, kept cheap per call: the client's preface, SETTINGS (and their
ACK), PING (answered), WINDOW_UPDATE and both levels of flow control, RST_STREAM, GOAWAY,
HEADERS with CONTINUATION (HPACK decoded by the ``hpack`` library), DATA (padding allowed),
PRIORITY (ignored), unknown frame types (ignored).  Responses need no HPACK state: their fields
are written as literals "without indexing", so one response costs a few ``bytes`` joins.

A frame that breaks the protocol raises :class:`ConnectionError_` (the connection answers GOAWAY
with its code and closes); one that breaks only its stream is answered RST_STREAM and reported as
a reset.  No input makes this module hold more than its bounds: a frame's length is checked
against the SETTINGS_MAX_FRAME_SIZE this side announced, a header block (with its CONTINUATIONs)
against ``max_header_list_size``, a stream's and the connection's DATA against their windows.
"""

from __future__ import annotations

import importlib
from typing import Any

hpack: Any = None
try:
    hpack = importlib.import_module("hpack")
except ImportError:  # the grpc extra installs it; h2_server.aio_like says so when it is missing
    pass

_Decoder: Any = None
try:  # the compiled decoder (_hpack.pyx), built with the package; else hpack's own
    from ._hpack import Decoder as _Compiled

    _Decoder = _Compiled
except ImportError:
    pass

#: Which HPACK decoder the native server runs: "compiled" or "hpack" (the pure-Python library).
HPACK_DECODER = "compiled" if _Decoder is not None else "hpack"

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
# Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
# Settings.
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE = 1, 2, 3, 4
S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 5, 6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
FRAME_SIZE = 16384

# Events, as tuples (kind first): cheaper than an object per event.
#: (EV_REQUEST, stream_id, headers [(name, value) bytes], end_stream)
EV_REQUEST = 0
#: (EV_DATA, stream_id, data, end_stream)
EV_DATA = 1
#: (EV_RESET, stream_id, error code): the client reset the stream (or this side refused it)
EV_RESET = 2
#: (EV_WINDOW, stream_id or 0): more room to send
EV_WINDOW = 3
#: (EV_GOAWAY, last stream id, error code)
EV_GOAWAY = 4


class ConnectionError_(Exception):
    """The client broke HTTP/2: the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first``'s high bits in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes | int, value: bytes) -> bytes:
    """A header field as a literal without indexing (no HPACK state changes); ``name`` may be a
    static table index."""
    if isinstance(name, int):
        head = hpack_int(name, 4)
    else:
        head = b"\x00" + hpack_int(len(name), 7) + name
    return head + hpack_int(len(value), 7) + value


#: ``:status: 200`` (static index 8) and ``content-type: application/grpc`` (name index 31).
RESPONSE_HEADERS = b"\x88" + literal(31, b"application/grpc")


class _Stream:
    __slots__ = ("send_window", "recv_window", "remote_closed", "local_closed")

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.remote_closed = False
        self.local_closed = False


class ServerConnection:
    """The server side of one HTTP/2 connection."""

    def __init__(
        self,
        *,
        max_concurrent_streams: int = 100,
        initial_window: int = 1 << 20,
        max_header_list_size: int = 16 * 1024,
    ) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.initial_window = initial_window
        self.max_header_list_size = max_header_list_size
        if _Decoder is not None:
            self.decoder: Any = _Decoder(max_header_list_size, 4096)
        else:
            self.decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
            self.decoder.max_allowed_table_size = 4096
        self.streams: dict[int, _Stream] = {}
        self.buffer = bytearray()
        self.out: list[bytes] = []
        self.preface_seen = False
        self.last_stream_id = 0
        # What the client lets this side send.
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = FRAME_SIZE
        self.send_window = DEFAULT_WINDOW
        # What this side lets the client send on the connection (returned as it arrives).
        self.recv_window = DEFAULT_WINDOW
        self._headers: bytearray | None = None
        self._headers_stream = 0
        self._headers_end_stream = False
        self.goaway_sent = False
        settings = (
            S_MAX_CONCURRENT_STREAMS.to_bytes(2, "big")
            + max_concurrent_streams.to_bytes(4, "big")
            + S_INITIAL_WINDOW_SIZE.to_bytes(2, "big")
            + initial_window.to_bytes(4, "big")
            + S_MAX_HEADER_LIST_SIZE.to_bytes(2, "big")
            + max_header_list_size.to_bytes(4, "big")
            + S_ENABLE_PUSH.to_bytes(2, "big")
            + (0).to_bytes(4, "big")
        )
        self.out.append(frame(SETTINGS, 0, 0, settings))
        # The connection's window, as large as a stream's times a few streams.
        grant = 4 * initial_window
        self.out.append(frame(WINDOW_UPDATE, 0, 0, (grant - DEFAULT_WINDOW).to_bytes(4, "big")))
        self.recv_window = grant
        self._recv_grant = grant

    # ------------------------------------------------------------------ output
    def data_to_send(self) -> bytes:
        if not self.out:
            return b""
        data = b"".join(self.out)
        self.out.clear()
        return data

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block (already HPACK-encoded), split into CONTINUATIONs as the client's
        SETTINGS_MAX_FRAME_SIZE requires."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed:
            return
        size = self.peer_max_frame
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            self.out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
        else:
            self.out.append(frame(HEADERS, flags, stream_id, block[:size]))
            rest = block[size:]
            while rest:
                chunk, rest = rest[:size], rest[size:]
                self.out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk))
        if end_stream:
            self._local_close(stream_id, stream)

    def window(self, stream_id: int) -> int:
        """Bytes of DATA the client lets this side send now on the stream."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return 0
        return min(stream.send_window, self.send_window, self.peer_max_frame)

    def send_data(self, stream_id: int, data: bytes) -> None:
        """DATA within :meth:`window` (the caller checked it)."""
        stream = self.streams[stream_id]
        stream.send_window -= len(data)
        self.send_window -= len(data)
        self.out.append(frame(DATA, 0, stream_id, data))

    def send_unary(self, stream_id: int, headers: bytes, data: bytes, trailers: bytes) -> bool:
        """A unary call's whole answer (headers, one DATA, trailers ending the stream) as one
        output, when the windows and the frame size take it; False (nothing sent) otherwise."""
        stream = self.streams.get(stream_id)
        size = len(data)
        limit = self.peer_max_frame
        if (
            stream is None
            or stream.local_closed
            or size > stream.send_window
            or size > self.send_window
            or size > limit
            or len(headers) > limit
            or len(trailers) > limit
        ):
            return False
        stream.send_window -= size
        self.send_window -= size
        self.out.append(
            frame(HEADERS, END_HEADERS, stream_id, headers)
            + frame(DATA, 0, stream_id, data)
            + frame(HEADERS, END_STREAM | END_HEADERS, stream_id, trailers)
        )
        self._local_close(stream_id, stream)
        return True

    def reset(self, stream_id: int, code: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self.out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def acknowledge(self, stream_id: int, size: int) -> None:
        """The handler read ``size`` bytes of the stream's DATA: the client may send that much more."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed or size <= 0:
            return
        stream.recv_window += size
        self.out.append(frame(WINDOW_UPDATE, 0, stream_id, size.to_bytes(4, "big")))

    def goaway(self, code: int = NO_ERROR, reason: bytes = b"") -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            payload = self.last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + reason[:256]
            self.out.append(frame(GOAWAY, 0, 0, payload))

    def _local_close(self, stream_id: int, stream: _Stream) -> None:
        stream.local_closed = True
        if stream.remote_closed:
            del self.streams[stream_id]

    # ------------------------------------------------------------------ input
    def receive(self, data: bytes) -> list[Any]:
        """The events of ``data``; raises :class:`ConnectionError_` (GOAWAY queued) on a broken
        connection."""
        try:
            return self._receive(data)
        except ConnectionError_ as exc:
            self.goaway(exc.code, exc.reason.encode("utf-8", "replace"))
            raise
        except hpack.HPACKError as exc:
            error = ConnectionError_(COMPRESSION_ERROR, f"HPACK: {exc}")
            self.goaway(error.code, error.reason.encode("utf-8", "replace"))
            raise error from exc

    def _receive(self, data: bytes) -> list[Any]:
        buffer = self.buffer
        buffer += data
        events: list[Any] = []
        position = 0
        if not self.preface_seen:
            if len(buffer) < 24:
                if not PREFACE.startswith(bytes(buffer)):
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                return events
            if buffer[:24] != PREFACE:
                raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 client preface")
            self.preface_seen = True
            position = 24
        end = len(buffer)
        while end - position >= 9:
            length = (buffer[position] << 16) | (buffer[position + 1] << 8) | buffer[position + 2]
            if length > FRAME_SIZE:
                raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes (max {FRAME_SIZE})")
            if end - position - 9 < length:
                break
            kind = buffer[position + 3]
            flags = buffer[position + 4]
            stream_id = int.from_bytes(buffer[position + 5 : position + 9], "big") & 0x7FFFFFFF
            payload = bytes(buffer[position + 9 : position + 9 + length])
            position += 9 + length
            if self._headers is not None and kind != CONTINUATION:
                raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted")
            if kind == DATA:
                self._data(stream_id, flags, payload, events)
            elif kind == HEADERS:
                self._headers_frame(stream_id, flags, payload, events)
            elif kind == CONTINUATION:
                self._continuation(stream_id, flags, payload, events)
            elif kind == SETTINGS:
                self._settings(stream_id, flags, payload, events)
            elif kind == WINDOW_UPDATE:
                self._window_update(stream_id, payload, events)
            elif kind == PING:
                if stream_id or length != 8:
                    raise ConnectionError_(
                        FRAME_SIZE_ERROR if length != 8 else PROTOCOL_ERROR, "malformed PING"
                    )
                if not flags & ACK:
                    self.out.append(frame(PING, ACK, 0, payload))
            elif kind == RST_STREAM:
                if not stream_id or length != 4:
                    raise ConnectionError_(
                        FRAME_SIZE_ERROR if length != 4 else PROTOCOL_ERROR, "malformed RST_STREAM"
                    )
                if stream_id > self.last_stream_id:
                    raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
                if self.streams.pop(stream_id, None) is not None:
                    events.append((EV_RESET, stream_id, int.from_bytes(payload, "big")))
            elif kind == PRIORITY:
                if not stream_id or length != 5:
                    raise ConnectionError_(PROTOCOL_ERROR, "malformed PRIORITY")
            elif kind == GOAWAY:
                if stream_id or length < 8:
                    raise ConnectionError_(PROTOCOL_ERROR, "malformed GOAWAY")
                last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                events.append((EV_GOAWAY, last, int.from_bytes(payload[4:8], "big")))
            elif kind == PUSH_PROMISE:
                raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
            # other types: ignored (RFC 9113 5.5)
        del buffer[:position]
        return events

    def _data(self, stream_id: int, flags: int, payload: bytes, events: list[Any]) -> None:
        if not stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        # The connection's window comes back at once: each stream's bounds what is held.
        if self.recv_window < self._recv_grant // 2:
            grant = self._recv_grant - self.recv_window
            self.recv_window = self._recv_grant
            self.out.append(frame(WINDOW_UPDATE, 0, 0, grant.to_bytes(4, "big")))
        if flags & PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA padding longer than the frame")
            payload = payload[1 : size - payload[0]]
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            if stream is not None:
                self.streams.pop(stream_id, None)
                self.out.append(frame(RST_STREAM, 0, stream_id, STREAM_CLOSED.to_bytes(4, "big")))
                events.append((EV_RESET, stream_id, STREAM_CLOSED))
            return  # a stream this side ended or reset: late data is dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            self.reset(stream_id, FLOW_CONTROL_ERROR)
            events.append((EV_RESET, stream_id, FLOW_CONTROL_ERROR))
            return
        end = bool(flags & END_STREAM)
        if end:
            stream.remote_closed = True
            if stream.local_closed:
                del self.streams[stream_id]
        events.append((EV_DATA, stream_id, payload, end, size))

    def _headers_frame(self, stream_id: int, flags: int, payload: bytes, events: list[Any]) -> None:
        if not stream_id or not stream_id & 1:
            raise ConnectionError_(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS padding longer than the frame")
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS priority cut short")
            payload = payload[5:]
        self._headers_stream = stream_id
        self._headers_end_stream = bool(flags & END_STREAM)
        if flags & END_HEADERS:
            self._header_block(payload, events)
        else:
            self._headers = bytearray(payload)

    def _continuation(self, stream_id: int, flags: int, payload: bytes, events: list[Any]) -> None:
        if self._headers is None or stream_id != self._headers_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        self._headers += payload
        if len(self._headers) > self.max_header_list_size + 1024:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            block = bytes(self._headers)
            self._headers = None
            self._header_block(block, events)

    def _header_block(self, block: bytes, events: list[Any]) -> None:
        stream_id = self._headers_stream
        # Decoded whatever becomes of the stream: the HPACK table must stay in step.
        headers = self.decoder.decode(block, raw=True)
        end = self._headers_end_stream
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers of a request (gRPC clients send none): must end it
            if stream.remote_closed or not end:
                raise ConnectionError_(PROTOCOL_ERROR, "HEADERS inside a request's body")
            stream.remote_closed = True
            if stream.local_closed:
                del self.streams[stream_id]
            events.append((EV_DATA, stream_id, b"", True, 0))
            return
        if stream_id <= self.last_stream_id:
            raise ConnectionError_(STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        self.last_stream_id = stream_id
        if len(self.streams) >= self.max_concurrent_streams or self.goaway_sent:
            self.out.append(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        stream = _Stream(self.peer_initial_window, self.initial_window)
        stream.remote_closed = end
        self.streams[stream_id] = stream
        events.append((EV_REQUEST, stream_id, headers, end))

    def _settings(self, stream_id: int, flags: int, payload: bytes, events: list[Any]) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key = int.from_bytes(payload[offset : offset + 2], "big")
            value = int.from_bytes(payload[offset + 2 : offset + 6], "big")
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream's window overflowed")
                events.append((EV_WINDOW, 0))
            elif key == S_MAX_FRAME_SIZE:
                if not FRAME_SIZE <= value <= 2**24 - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            # HEADER_TABLE_SIZE: this side's encoder keeps no table; the rest only bound the client.
        self.out.append(frame(SETTINGS, ACK, 0))

    def _window_update(self, stream_id: int, payload: bytes, events: list[Any]) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "the connection's window overflowed")
            events.append((EV_WINDOW, 0))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if not increment or stream.send_window + increment > MAX_WINDOW:
            self.reset(stream_id, PROTOCOL_ERROR if not increment else FLOW_CONTROL_ERROR)
            events.append((EV_RESET, stream_id, FLOW_CONTROL_ERROR))
            return
        stream.send_window += increment
        events.append((EV_WINDOW, stream_id))
