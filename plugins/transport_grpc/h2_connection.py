"""One client connection of the native gRPC server (:mod:`.h2_server`): an :class:`asyncio.Protocol`
feeding the sans-IO frame layer (:mod:`.h2_frames`), which turns requests into calls (:mod:`.h2_call`)
run by the server's handlers, and their answers, as the client's flow-control window lets them, into
frames written once per read or loop turn.

Bounds: a message larger than ``max_message_bytes`` is RESOURCE_EXHAUSTED; a connection has at
most ``max_concurrent_streams`` streams (HTTP/2 SETTINGS; more are refused with RST_STREAM), the
server ``max_concurrent_calls`` calls (more: RESOURCE_EXHAUSTED); a stream's request data is
acknowledged (HTTP/2 flow control) only as its handler reads it, and responses wait for the
client's window, so a client that does not read makes its streams wait, never the broker's memory
grow.  A frame that breaks the protocol ends its connection with GOAWAY; the process stays up.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import zlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from tidemq import resume_eager

from .h2_call import Call, Deserialize, NoRequest
from .h2_context import AbortError, CallContext, parse_timeout, status_of
from .h2_frames import (
    EV_DATA,
    EV_GOAWAY,
    EV_REQUEST,
    EV_RESET,
    EV_WINDOW,
    NO_ERROR,
    RESPONSE_HEADERS,
    ConnectionError_,
    ServerConnection,
    literal,
)

if TYPE_CHECKING:
    from .h2_server import H2GrpcServer

log = logging.getLogger(__name__)

#: Flow-control window granted to each stream and to the connection (bytes).
WINDOW = 256 * 1024
_GRPC_CONTENT = b"application/grpc"
_OK_TRAILERS = status_of(grpc.StatusCode.OK, "")


class Http2Protocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.loop = server.loop
        self.conn = ServerConnection(
            max_concurrent_streams=server.max_concurrent_streams,
            initial_window=WINDOW,
            max_header_list_size=server.max_header_list_size,
        )
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        #: Streams refused over the call cap whose first message has not arrived yet (see _request).
        self.refused: set[int] = set()
        self.peer = "unknown"
        self.closed = False
        self.paused = False
        self._drain: asyncio.Future[None] | None = None
        #: Streams whose writer waits for the client's flow-control window.
        self._blocked: set[int] = set()
        self._flush_scheduled = False
        #: Calls of this read with a deadline, whose timers are armed at its end.
        self._timed: list[Call] = []

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple) and len(address) >= 2:
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self.server.connections.add(self)
        self._flush()  # this side's SETTINGS

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        # A client that does not read: read nothing more from it either (its PINGs, SETTINGS
        # and calls would each queue more output), until what is queued drains.
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def data_received(self, data: bytes) -> None:
        try:
            self._received(data)
        except Exception:  # a defect here ends this connection, not the broker's loop
            log.exception("gRPC connection from %s failed: closed", self.peer)
            self._close()

    def _received(self, data: bytes) -> None:
        try:
            events = self.conn.receive(data)
        except ConnectionError_ as exc:
            log.info("gRPC client %s broke HTTP/2 (%s): connection closed", self.peer, exc.reason)
            self._flush()  # the GOAWAY
            self._close()
            return
        for event in events:
            kind = event[0]
            if kind == EV_DATA:
                self._data(event[1], event[2], event[3], event[4])
            elif kind == EV_REQUEST:
                self._request(event[1], event[2], event[3])
            elif kind == EV_RESET:
                self.refused.discard(event[1])
                call = self.calls.pop(event[1], None)
                if call is not None:
                    self._cancel(call)
            elif kind == EV_WINDOW:
                self._unblock(event[1])
            elif kind == EV_GOAWAY:
                self.conn.goaway()
                if not self.calls:
                    self._flush()
                    self._close()
                    return
        if self._timed:
            self._arm_deadlines()
        self._flush()

    def _arm_deadlines(self) -> None:
        timed, self._timed = self._timed, []
        now = time.monotonic()
        for call in timed:
            deadline = call.context.deadline
            if not call.closed and deadline is not None:
                call.deadline_timer = self.loop.call_later(deadline - now, self._expired, call)

    # ---------------------------------------------------------------- requests
    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        path = b""
        content_type = b""
        timeout = b""
        encoding = b""
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
        if not content_type.startswith(_GRPC_CONTENT):
            # Not a gRPC request: HTTP's 415, as grpcio answers it.
            self.conn.send_headers(stream_id, literal(8, b"415"), end_stream=True)
            self.conn.reset(stream_id, NO_ERROR)
            return
        server = self.server
        method = path.decode("ascii", "replace")
        context = CallContext(method, self.peer, headers, parse_timeout(timeout))
        if encoding not in (b"", b"identity", b"gzip", b"deflate"):
            self._trailers_only(
                stream_id, grpc.StatusCode.UNIMPLEMENTED, f"grpc-encoding {encoding.decode('latin-1')!r}"
            )
            return
        if server.open_calls >= server.max_concurrent_calls:
            if not end:
                # A client opens a stream with its headers and writes its first message apart:
                # refused before that write arrives, the write fails on the client as grpc's own
                # INTERNAL and hides the status. The refusal waits for the first DATA (the stream
                # stays one of the connection's max_concurrent_streams meanwhile: bounded).
                self.refused.add(stream_id)
                return
            self._refuse(stream_id)
            return
        handler = server.lookup(method, context)
        if handler is None:
            self._trailers_only(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        call = Call(stream_id, handler, context, encoding in (b"gzip", b"deflate"))
        context._call = call
        context._connection = self
        self.calls[stream_id] = call
        server.open_calls += 1
        if context.deadline is not None:
            # Armed once this read's events are done (_received), if the call is still open: a
            # unary call answered right away (an ack) never makes a timer.
            self._timed.append(call)
        if handler.request_streaming:
            call.task = self.loop.create_task(self._run(call))
        if end:
            self._ended(call)
        # a unary request's task starts with the request's last byte (_ended)

    def _refuse(self, stream_id: int) -> None:
        self.refused.discard(stream_id)
        self._trailers_only(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")

    def _data(self, stream_id: int, data: bytes, end: bool, size: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.closed:
            if stream_id in self.refused:
                self._refuse(stream_id)
            return
        call.unacked += size
        buffer = call.buffer
        buffer += data
        limit = self.server.max_message_bytes
        while len(buffer) >= 5:
            length = int.from_bytes(buffer[1:5], "big")
            if length > limit:
                self._fail(
                    call,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {limit})",
                )
                return
            if len(buffer) < 5 + length:
                break
            flag = buffer[0]
            message = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            if flag:
                if not call.compressed:
                    self._fail(call, grpc.StatusCode.INTERNAL, "compressed message without grpc-encoding")
                    return
                try:
                    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib, by the header
                    message = inflater.decompress(message, limit + 1)
                except zlib.error as exc:
                    self._fail(call, grpc.StatusCode.INTERNAL, f"cannot decompress message: {exc}")
                    return
                if len(message) > limit:
                    self._fail(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max")
                    return
            call.messages.append((message, 5 + length))
        if not call.handler.request_streaming:
            if len(call.messages) > 1:
                self._fail(
                    call, grpc.StatusCode.UNIMPLEMENTED, "more than one request message on a unary call"
                )
                return
            # A unary request is bounded by the message limit: its window comes back at once.
            self._ack(call)
        if end:
            self._ended(call)
        else:
            call.wake()

    def _ack(self, call: Call) -> None:
        if call.unacked > 0 and not call.closed:
            self.conn.acknowledge(call.stream_id, call.unacked)
            call.unacked = 0

    def _ended(self, call: Call) -> None:
        call.ended = True
        if call.buffer:
            self._fail(call, grpc.StatusCode.INTERNAL, "the request ended inside a message")
            return
        if call.task is None and not call.closed:
            self._start(call)
        call.wake()

    def _start(self, call: Call) -> None:
        """Run a call whose request is whole: right here, up to the handler's first real wait.
        Most unary calls (an AckMessage, a send whose put is done) answer without one, and then
        skip a Task and a turn of the loop; a call that waits goes on as a Task."""
        coro = self._run(call)
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        call.task = self.loop.create_task(resume_eager(coro, yielded))

    # ---------------------------------------------------------------- the handler's side
    async def _run(self, call: Call) -> None:
        handler = call.handler
        context = call.context
        server = self.server
        code = grpc.StatusCode.OK
        details = ""
        try:
            if handler.request_streaming:
                request: Any = self._requests(call)
            else:
                request = self._unary_request(call)
            if handler.response_streaming:
                behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream
                outcome = behavior(request, context)
                if hasattr(outcome, "__aiter__"):
                    try:
                        async for response in outcome:
                            await self.write(call, response)
                    finally:
                        # A call that ends early (cancelled, the client gone): the handler's own
                        # cleanup (a receive gives back what it did not write) runs now, not
                        # whenever the garbage collector finalizes the generator.
                        await outcome.aclose()
                else:
                    await outcome
            else:
                behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary
                response = await behavior(request, context)
                if response is not None:
                    if context._code is None and self._answer(call, response):
                        return  # answered and finished (open_calls taken back below)
                    await self.write(call, response, last=True)
            if context._code is not None:
                code, details = context._code, context._details or ""
        except AbortError as exc:
            code, details = exc.code, exc.details
        except Deserialize as exc:
            code, details = grpc.StatusCode.INTERNAL, f"Exception deserializing request: {exc}"
        except asyncio.CancelledError:
            if call.closed or self.closed:
                return
            code, details = grpc.StatusCode.CANCELLED, "Cancelled"
        except NoRequest:
            code, details = grpc.StatusCode.UNIMPLEMENTED, "no request message on a unary call"
        except Exception as exc:
            log.exception("gRPC method %s failed", context.method)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        finally:
            server.open_calls -= 1
        self._finish(call, code, details)

    def _unary_request(self, call: Call) -> Any:
        if len(call.messages) != 1:
            raise NoRequest()
        data = call.messages.popleft()[0]
        deserializer = call.handler.request_deserializer
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as exc:
            raise Deserialize(exc) from exc

    async def _requests(self, call: Call) -> AsyncIterator[Any]:
        deserializer = call.handler.request_deserializer
        while True:
            while call.messages:
                data, size = call.messages.popleft()
                if not call.closed:  # the client may send this much more: the handler read it
                    self.conn.acknowledge(call.stream_id, size)
                    call.unacked -= size
                    self._schedule_flush()
                if deserializer is None:
                    yield data
                    continue
                try:
                    request = deserializer(data)
                except Exception as exc:
                    raise Deserialize(exc) from exc
                yield request
            if call.ended or call.closed:
                return
            call.waiter = self.loop.create_future()
            try:
                await call.waiter
            finally:
                call.waiter = None

    async def write(self, call: Call, message: Any, last: bool = False) -> None:
        """One response message, as the client's flow-control window lets it go."""
        if call.closed or self.closed:
            raise asyncio.CancelledError()
        serializer = call.handler.response_serializer
        payload = serializer(message) if serializer is not None else message
        if len(payload) > self.server.max_message_bytes:
            raise AbortError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(payload)} vs. {self.server.max_message_bytes})",
            )
        data = b"\x00" + len(payload).to_bytes(4, "big") + payload
        conn = self.conn
        stream_id = call.stream_id
        if not call.headers_sent:
            call.headers_sent = True
            conn.send_headers(stream_id, RESPONSE_HEADERS)
        while data:
            window = conn.window(stream_id)
            if window <= 0:
                if stream_id not in conn.streams:
                    raise asyncio.CancelledError()
                self._flush()
                self._blocked.add(stream_id)
                call.waiter = self.loop.create_future()
                try:
                    await call.waiter
                finally:
                    call.waiter = None
                    self._blocked.discard(stream_id)
                if call.closed or self.closed:
                    raise asyncio.CancelledError()
                continue
            if window >= len(data):
                conn.send_data(stream_id, data)
                break
            conn.send_data(stream_id, data[:window])
            data = data[window:]
        if self.paused:
            self._flush()
            if self._drain is None:
                self._drain = self.loop.create_future()
            await self._drain
        elif not last:
            self._schedule_flush()

    def _answer(self, call: Call, message: Any) -> bool:
        """A unary call's answer and OK status as one output (what :meth:`write` and
        :meth:`_finish` do, in one frame append), when nothing else is in the way; False when the
        general path must take it (not sent)."""
        if call.closed or self.closed or self.paused or call.headers_sent:
            return False
        serializer = call.handler.response_serializer
        payload = serializer(message) if serializer is not None else message
        limit = self.server.max_message_bytes
        if len(payload) > limit:
            raise AbortError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(payload)} vs. {limit})",
            )
        data = b"\x00" + len(payload).to_bytes(4, "big") + payload
        conn = self.conn
        if not conn.send_unary(call.stream_id, RESPONSE_HEADERS, data, _OK_TRAILERS):
            return False
        call.headers_sent = True
        call.closed = True
        if call.deadline_timer is not None:
            call.deadline_timer.cancel()
        self.calls.pop(call.stream_id, None)
        if not call.ended:  # the client still sends: it has its answer, the rest is not read
            conn.reset(call.stream_id, NO_ERROR)
        self._flush()
        if conn.goaway_sent and not self.calls:
            self._close()
        return True

    def _finish(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        if call.closed or self.closed:
            return
        call.closed = True
        if call.deadline_timer is not None:
            call.deadline_timer.cancel()
        self.calls.pop(call.stream_id, None)
        trailers = status_of(code, details)
        conn = self.conn
        if call.headers_sent:
            conn.send_headers(call.stream_id, trailers, end_stream=True)
        else:
            conn.send_headers(call.stream_id, RESPONSE_HEADERS + trailers, end_stream=True)
        if not call.ended:  # the client still sends: it has its answer, the rest is not read
            conn.reset(call.stream_id, NO_ERROR)
        self._flush()
        if conn.goaway_sent and not self.calls:
            self._close()

    def _fail(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        """A request the server cannot take: the status now, the handler (if running) cancelled."""
        task = call.task
        if task is not None:
            call.task = None
            task.cancel()  # its _run takes the open call back, and finds the call closed
        else:
            self.server.open_calls -= 1
        self._finish(call, code, details)

    def _expired(self, call: Call) -> None:
        call.deadline_timer = None
        if call.closed:
            return
        call.context._expired = True
        self._fail(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _cancel(self, call: Call) -> None:
        if call.closed:
            return
        call.closed = True
        call.context._cancelled = True
        if call.deadline_timer is not None:
            call.deadline_timer.cancel()
        if call.task is not None:
            call.task.cancel()
        else:
            self.server.open_calls -= 1
        call.wake()

    def _trailers_only(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        self.conn.send_headers(stream_id, RESPONSE_HEADERS + status_of(code, details), end_stream=True)
        self.conn.reset(stream_id, NO_ERROR)

    # ---------------------------------------------------------------- output
    def _unblock(self, stream_id: int) -> None:
        if stream_id:
            call = self.calls.get(stream_id)
            if call is not None:
                call.wake()
            return
        for blocked in list(self._blocked):
            call = self.calls.get(blocked)
            if call is not None:
                call.wake()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def goaway(self) -> None:
        """No new streams (the server stops): GOAWAY with the last stream taken."""
        if self.closed:
            return
        self.conn.goaway()
        self._flush()
        if not self.calls:
            self._close()
