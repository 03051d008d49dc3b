"""One TCP connection (:class:`Connection`): frames in and out, requests served, bad bytes met.

Built on :class:`asyncio.Protocol` (no streams) for speed.  Each connection decodes frames with
the sans-IO :class:`~tidemq.remoting.FrameDecoder`, matches responses to requests by opaque, and
runs every incoming request as its own task so a slow handler (a held long-polling pull) never
blocks the others on the same connection.  A :class:`~tidemq.transport.BatchedRequestHandler`
(``handle_many``) gets the requests of one read together (the broker stores a read's sends with one append) and answers each on its own.

Bad bytes are met deliberately.  A header whose opaque is known is answered with SYSTEM_ERROR and
the connection kept; a header that cannot be read at all, or a broken frame, closes the connection
with one WARNING line, after the requests read before it were answered (RocketMQ's NettyDecoder
closes the channel on every decoding failure).  Partial frames of all connections of one server
share a memory budget (``max_buffered_bytes``, kept by the owner: :class:`TcpServer`).

A send decoded and run eagerly up to its wait for a sync flush round is *parked* on the round's
future (:meth:`Connection._park`), not given a Task: the round's sends are resumed in one callback
per connection and their answers leave in one write.

The write side (one writev per loop turn, a lane's answers at once) is :mod:`.outbound`; a request
run eagerly and finished outside a Task, :func:`tidemq.resume_eager`; bad headers' log lines and answers,
:mod:`.bad_input`.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from tidemq import resume_eager
from tidemq.remoting import (
    FrameDecoder,
    FrameError,
    HeaderError,
    ProtocolError,
    RemotingCommand,
    RemotingError,
    RemotingSendError,
    RemotingTimeoutError,
    ResponseCode,
    encode,
)
from tidemq.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode
from tidemq.remoting.command import next_opaque
from tidemq.transport import BatchedRequestHandler, ConnectionState
from tidemq_transport_tcp.bad_input import bad_header_reply, log_bad_header
from tidemq_transport_tcp.options import TcpOptions
from tidemq_transport_tcp.outbound import Outbound

if TYPE_CHECKING:
    from tidemq_transport_tcp.transport import TcpClient, TcpServer

log = logging.getLogger(__name__)

#: A connection closed for bad input gets this long to answer the requests read before the bad bytes
#: and to flush its answers; then it is aborted (a peer that does not read must not keep it open).
CLOSE_GRACE_S = 5.0
#: Server side: commands of one read served in one loop turn; the rest wait for the next turns.
BURST = 64
#: A read may carry this much past the frame it completes; uvloop and asyncio read at most 256 KiB.
_READ_SLACK = 512 * 1024

Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
#: ``handler.handle_many(conn, requests)`` of a :class:`~tidemq.transport.BatchedRequestHandler`:
#: the requests of one read at once, one awaitable (or response) per request in order, each served
#: as the handler's own result would be.  What the application does with them is its business (the
#: broker coalesces sends into one store append).
#: ``handler.serve_read(conn, data, max_frame)`` of a :class:`~tidemq.transport.ReadLaneHandler`
#: (looked up once per connection).
#: Requests whose first wait (a sync flush round: every send of the round waits on one future) is
#: *parked* on that future instead of a Task each: see :meth:`Connection._park`.
PARKED_CODES = frozenset(
    (int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_MESSAGE_V2), int(RequestCode.SEND_BATCH_MESSAGE))
)
_Future = asyncio.Future

ReadLane = Callable[["Connection", bytes, int], "tuple[int, Any] | None"]
ManyHandler = Callable[["Connection", list[RemotingCommand]], "list[Awaitable[RemotingCommand | None]]"]


class Connection(asyncio.Protocol):
    """One TCP connection, server or client side; both sides may send requests."""

    def __init__(
        self, owner: TcpServer | TcpClient, handler: Handler | None, options: TcpOptions, server_side: bool
    ):
        self._owner = owner
        self._handler = handler
        # Checked once per connection, not per read.
        self._handle_many: ManyHandler | None = (
            handler.handle_many if isinstance(handler, BatchedRequestHandler) else None
        )
        self._options = options
        self.server_side = server_side
        # The handler's request lane (the broker's compiled send lane), offered each read's bytes first.
        # (getattr, not isinstance: a handler's unset slot passes a runtime Protocol check.)
        self._read_lane: ReadLane | None = (
            getattr(handler, "serve_read", None) if server_side and options.read_lane else None
        )
        self._decoder = FrameDecoder(options.max_frame_size)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Requests a read lane took and answers later (:meth:`answer_later`): in flight like tasks.
        self._later = 0
        self._later_done: asyncio.Future[None] | None = None  # set once _later is 0 (stop() waits)
        #: Requests run eagerly up to a wait on one of these futures, resumed together when it is
        #: done (:meth:`_park`); counted in ``_later``.
        self._parked: dict[asyncio.Future[Any], list[Any]] = {}
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._close_callbacks: list[Callable[[Connection], Any]] = []
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._reading_paused_by_us = False
        #: Set while reading is held for the connection's round (:meth:`_hold_for_round`): the
        #: bound's timer; None once the round answered or the bound passed.
        self._round_hold: asyncio.TimerHandle | None = None
        self._hold_s = options.hold_reading_max_us / 1e6
        #: A hold reached its bound, and the connection's sends are not all answered yet.
        self._hold_spent = False
        #: Holds that reached ``hold_reading_max_us`` before their round answered.
        self.holds_expired = 0
        self._draining = False
        self._last_activity = self._loop.time()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._out = Outbound(self._loop, options)
        self._held = 0  # partial-frame bytes counted against the server's budget
        self._partial_since = 0.0  # when this connection last completed a frame while holding a partial one
        self._closing = False  # closing for bad input: reads stopped, answering what was read
        self._grace_handle: asyncio.TimerHandle | None = None
        self._backlog: collections.deque[RemotingCommand] = collections.deque()  # decoded, not yet served
        self._bad_headers = 0
        self.lost: asyncio.Future[None] = self._loop.create_future()
        self.remote_address = ""
        self.local_address = ""
        #: The application's per-connection state (the broker's born host and watched flag).
        self.context = ConnectionState()

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.remote_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.local_address = f"{sock[0]}:{sock[1]}" if sock else "?"
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]  # a WriteTransport here
            high=self._options.write_high_water, low=self._options.write_low_water
        )
        self._out.attach(self._transport, self._options.sendfile)  # type: ignore[arg-type]
        self._owner._connection_made(self)
        idle = self._options.idle_timeout_s
        if self.server_side and idle > 0:
            self._idle_handle = self._loop.call_later(idle, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_activity = self._loop.time()
        lane = self._read_lane
        if (
            lane is not None
            and not self._backlog
            and not self._draining
            and not self._closing
            and type(data) is bytes
        ):
            decoder = self._decoder
            if decoder._buf:  # ``_buf``, not ``buffered``: see _feed
                if decoder.error_pending:
                    self._feed(data)
                    return
                # A frame begun in an earlier read: the lane goes on from its start (one copy).
                data = b"".join((decoder.take_buffered(), data))
            rest = self._serve_read(lane, data)
            if not rest:
                if self._held:
                    self._account_buffer(True)  # the partial frame held before is served
                return
            self._feed(rest)
            return
        self._feed(data)

    def _serve_read(self, lane: ReadLane, data: bytes) -> bytes | memoryview:
        """The read's leading frames the lane serves, answered in order; what is left to decode
        (a view: the decoder copies only what it keeps)."""
        try:
            taken = lane(self, data, self._decoder.max_frame_size)
        except Exception:  # a lane bug: the read is decoded and served the usual way
            log.exception("request lane failed on a read from %s; serving it decoded", self.remote_address)
            return data
        if taken is None:
            return data
        end, answer = taken
        if type(answer) is bytes:  # _write_frames, inlined (once per read)
            transport = self._transport
            if not self._closed and transport is not None and not transport.is_closing():
                self._out.write_frames(answer)
        elif type(answer) is int:  # answered later, with answer_later (a sync flush round)
            self._later += answer
            if self.server_side:
                # A read of several sends (a pipelining sender): more arrive during the round.
                # After the hold's bound, a read of one while others wait too: read again as
                # they trickle in, the rest of the round cost a read each.
                if (
                    answer > 1 or (self._hold_spent and self._later > answer)
                ) and self._options.hold_reading_for_round:
                    self._hold_for_round()
                elif len(self._tasks) + self._later >= self._options.max_in_flight:
                    self._pause_reading()
        else:
            for cmd, work in answer:
                self._on_request(cmd, work)
        return memoryview(data)[end:] if end < len(data) else b""

    def answer_later(self, answer: Any, count: int) -> None:
        """:meth:`tidemq.transport.AnswersLater.answer_later`: ``count`` requests a read lane took
        and answered with ``count``, answered now (frames written, or per request served as
        ``_serve_read`` serves them, even while draining: they were taken before)."""
        self._later -= count
        if type(answer) is bytes:
            self._write_frames(answer)
        elif not self._closed:
            for cmd, work in answer:
                self._on_request(cmd, work, True)
        else:
            for _cmd, work in answer:
                if inspect.iscoroutine(work):
                    work.close()
        self._answered_later()

    def _hold_for_round(self) -> None:
        """Read nothing more until this connection's held sends are answered (``_later`` back at
        0), for at most ``hold_reading_max_us``: then the other requests behind them (a pull, a
        heartbeat on a client's one connection) are read even if the round hangs."""
        self._pause_reading()
        if self._round_hold is None and self._reading_paused_by_us:
            self._round_hold = self._loop.call_later(self._hold_s, self._hold_expired)

    def _hold_expired(self) -> None:
        """The round outlasted ``hold_reading_max_us``: read again (its sends still wait for it)."""
        self._round_hold = None
        self._hold_spent = True
        self.holds_expired += 1
        self._maybe_resume_reading()

    def _answered_later(self) -> None:
        """``_later`` went down: wake ``stop()``'s wait at 0, close or read again as due."""
        if self._later <= 0:
            self._later = 0
            self._hold_spent = False
            hold = self._round_hold
            if hold is not None:
                self._round_hold = None
                hold.cancel()
            done = self._later_done
            if done is not None:
                self._later_done = None
                if not done.done():
                    done.set_result(None)
        if self._closing:
            if not self._tasks and not self._later:
                self.close()
        elif self._reading_paused_by_us:
            self._maybe_resume_reading()

    def _answers_later(self) -> asyncio.Future[None] | None:
        """A future set once every request answered later is answered (None: none is waited for)."""
        if not self._later:
            return None
        if self._later_done is None:
            self._later_done = self._loop.create_future()
        return self._later_done

    def _feed(self, data: bytes | memoryview) -> None:
        decoder = self._decoder
        while True:
            try:
                commands = decoder.feed(data)
            except HeaderError as exc:
                if not self._on_header_error(exc):
                    return
                data = b""
                continue
            except FrameError as exc:
                # The stream cannot be resynchronised; the good frames before the break were handed
                # over (and are being answered) on the previous turn of this loop.
                self._close_after_answers(str(exc))
                return
            if len(commands) > BURST and self.server_side:
                # A pipelined burst (2 000 heartbeats in one write) is served BURST commands per
                # loop turn, reads paused meanwhile: other connections' requests interleave instead
                # of waiting behind the whole burst.  What follows a bad frame waits for the backlog.
                self._backlog.extend(commands)
                self._pause_reading()
                self._drain_backlog()
                break
            self._dispatch(commands)
            if not decoder.error_pending:
                break
            data = b""
        # Partial frames count against the server's budget.  Whole frames in one read (the common
        # case) skip this; ``_buf`` and not the ``buffered`` property: the call cost ~2% of such a read.
        if self._held or decoder._buf:
            self._account_buffer(bool(commands))

    def _dispatch(self, commands: list[RemotingCommand]) -> None:
        """Responses complete their waiting calls; requests are served (one loop per read: hot)."""
        many = self._handle_many
        works = self._many(many, commands) if many is not None and len(commands) > 1 else None
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                fut = self._pending.pop(cmd.opaque, None)
                if fut is None:
                    log.debug("response %r from %s matches no request (timed out?)", cmd, self.remote_address)
                elif not fut.done():
                    fut.set_result(cmd)
            elif works is None:
                self._on_request(cmd)
            else:
                self._on_request(cmd, next(works))

    def _many(self, many: ManyHandler, commands: list[RemotingCommand]) -> Iterator[Any] | None:
        """What ``handle_many`` gives for each request of one read; None to serve them one by one."""
        requests = [cmd for cmd in commands if not cmd.flag & FLAG_RESPONSE]
        if len(requests) < 2 or self._draining:
            return None
        try:
            works = many(self, requests)
        except Exception:
            log.exception("handle_many failed; serving %d requests one by one", len(requests))
            return None
        if len(works) == len(requests):
            return iter(works)
        log.error(
            "handle_many answered %d of %d requests; serving them one by one", len(works), len(requests)
        )
        for work in works:  # a handler bug: no request is left unanswered
            if inspect.iscoroutine(work):
                work.close()
        return None

    def _drain_backlog(self) -> None:
        """Serve up to BURST commands of the backlog; come back on the next loop turn for more."""
        backlog = self._backlog
        if self._closed:
            backlog.clear()
            return
        self._dispatch([backlog.popleft() for _ in range(min(BURST, len(backlog)))])
        if backlog:
            self._loop.call_soon(self._drain_backlog)
            return
        if self._closing:
            return
        if self._decoder.error_pending:
            self._feed(b"")  # the frames behind a bad header, or the error itself
        self._maybe_resume_reading()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def pause_writing(self) -> None:
        self._write_paused = True
        # The peer is not reading what we send: stop reading what it sends (server side only:
        # a client must keep reading the responses it waits for).
        if self.server_side:
            self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._maybe_resume_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _pause_reading(self) -> None:
        if not self._reading_paused_by_us and self._transport is not None and not self._closed:
            self._reading_paused_by_us = True
            try:
                self._transport.pause_reading()
            except RuntimeError:  # already closing
                pass

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused_by_us
            and not self._write_paused
            and not self._draining
            and not self._closing
            and not self._backlog
            and not self._closed
            and len(self._tasks) + self._later <= self._options.max_in_flight // 2
            and self._round_hold is None
            and self._transport is not None
        ):
            self._reading_paused_by_us = False
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        if self._round_hold is not None:
            self._round_hold.cancel()
            self._round_hold = None
        if self._grace_handle is not None:
            self._grace_handle.cancel()
        self._decoder.close("connection closed")  # the Connection object may outlive its socket
        self._release_buffer()
        reason = f": {exc}" if exc else ""
        for opaque, fut in self._pending.items():
            if not fut.done():
                fut.set_exception(
                    RemotingSendError(
                        f"connection {self.remote_address} closed before response {opaque}{reason}"
                    )
                )
        self._pending.clear()
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(RemotingSendError(f"connection {self.remote_address} closed{reason}"))
        self._owner._connection_lost(self)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("close callback %r failed for %s", cb, self.remote_address)
        if not self.lost.done():
            self.lost.set_result(None)

    # ------------------------------------------------------------------ public API
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests received on this connection whose handler has not finished."""
        return len(self._tasks) + self._later

    def add_close_callback(self, fn: Callable[[Connection], Any]) -> None:
        """Call ``fn(conn)`` once when the connection closes (soon, if it already has)."""
        if self._closed:
            self._loop.call_soon(fn, self)
        else:
            self._close_callbacks.append(fn)

    def close(self) -> None:
        """Close after flushing what is already written."""
        if self._transport is not None and not self._transport.is_closing():
            self._out.flush()
            self._transport.close()

    def abort(self) -> None:
        """Close now, dropping unsent data."""
        if self._transport is not None:
            self._transport.abort()

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``request`` and wait up to ``timeout`` seconds for its response."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise RemotingSendError(f"connection {self.remote_address} is closed")
        if self._write_paused:
            await self._wait_drain()
        opaque = request.opaque
        if opaque in self._pending:  # the same command object sent twice: give it a new id
            request.opaque = opaque = next_opaque()
        fut: asyncio.Future[RemotingCommand] = self._loop.create_future()
        self._pending[opaque] = fut
        try:
            self._write(request)
        except RemotingSendError:
            self._pending.pop(opaque, None)
            raise
        except ProtocolError as exc:
            self._pending.pop(opaque, None)
            raise RemotingSendError(f"cannot encode request {request.code}: {exc}") from exc
        handle = self._loop.call_later(timeout, _expire, fut, request.code, self.remote_address, timeout)
        try:
            return await fut
        finally:
            handle.cancel()
            self._pending.pop(opaque, None)

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send ``request`` marked oneway; no response is expected."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise RemotingSendError(f"connection {self.remote_address} is closed")
        request.flag |= FLAG_ONEWAY
        if self._write_paused:
            await self._wait_drain()
        try:
            self._write(request)
        except ProtocolError as exc:
            raise RemotingSendError(f"cannot encode request {request.code}: {exc}") from exc

    def send_response(self, response: RemotingCommand) -> None:
        """Write a response outside the handler's return path (a held pull answered later)."""
        response.flag |= FLAG_RESPONSE
        if not self._closed:
            try:
                self._write(response)
            except RemotingSendError:
                log.debug("late response dropped: %s closed", self.remote_address)
            except ProtocolError as exc:  # as in _serve: an unencodable response becomes SYSTEM_ERROR
                log.error("cannot send late response %s to %s: %s", response.opaque, self.remote_address, exc)
                error = RemotingCommand(
                    code=ResponseCode.SYSTEM_ERROR,
                    opaque=response.opaque,
                    flag=FLAG_RESPONSE,
                    remark=f"cannot encode response: {exc}",
                    serialize_type=response.serialize_type,
                )
                try:
                    self._write(error)
                except (RemotingSendError, ProtocolError):
                    pass

    # ------------------------------------------------------------------ internals
    def _write(self, cmd: RemotingCommand) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise RemotingSendError(f"connection {self.remote_address} is closed")
        self._out.write(encode(cmd))

    def _write_frames(self, frames: bytes) -> None:
        """Whole encoded frames (a lane's answers), written as ``_write`` writes a command's."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._closed:
            return
        self._out.write_frames(frames)

    async def _wait_drain(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(fut)
        await fut

    def _on_request(self, cmd: RemotingCommand, work: Any = None, taken: bool = False) -> None:
        """Serve ``cmd``: with the handler, or by awaiting ``work`` (what ``handle_many`` gave for it);
        ``taken``: it was taken before a drain began (answered, not refused)."""
        if self._draining and not taken:
            if inspect.iscoroutine(work):
                work.close()
            if not cmd.flag & FLAG_ONEWAY and not self._closed:
                try:
                    self._write(cmd.reply(ResponseCode.SYSTEM_BUSY, remark="server is shutting down"))
                except (RemotingSendError, ProtocolError):
                    pass
            return
        coro = self._serve(cmd, work)
        # Eager only while the peer reads what we write: otherwise a Task, which max_in_flight counts.
        if self._options.eager_requests and not self._write_paused:
            # Run the handler right here up to its first real wait: most requests (a send with
            # async flush, a pull that finds messages) finish without one, and skip a Task.
            try:
                yielded = coro.send(None)
            except StopIteration:
                return
            except BaseException:  # _serve answers handler errors itself; this is a bug in it
                log.exception("request %s from %s failed", cmd.code, self.remote_address)
                return
            if cmd.code in PARKED_CODES and self._park(coro, yielded):
                return
            task = self._loop.create_task(resume_eager(coro, yielded))
        else:
            task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if self.server_side and len(self._tasks) + self._later >= self._options.max_in_flight:
            self._pause_reading()

    def _park(self, coro: Any, yielded: Any) -> bool:
        """Keep a send's ``_serve`` coroutine, run eagerly up to its wait on ``yielded``, until that
        future is done, instead of a Task: the sends a sync flush round makes durable all wait on
        its one future, and :meth:`_resume_parked` resumes this connection's in one callback, in
        the order they came, their answers leaving in one write (:class:`Outbound`).  The
        coroutines are the ones a Task would run (the send hooks see each send as before); False
        (a Task then) for a wait on anything else than a pending future of this loop."""
        if type(yielded) is not _Future or yielded.get_loop() is not self._loop or yielded.done():
            return False
        parked = self._parked
        waiting = parked.get(yielded)
        if waiting is None:
            waiting = parked[yielded] = []
            yielded.add_done_callback(self._resume_parked)
        # As a Task does before it waits: the future is shared (see SharedCompletion.wait).
        yielded._asyncio_future_blocking = False
        waiting.append(coro)
        self._later += 1
        if self.server_side and len(self._tasks) + self._later >= self._options.max_in_flight:
            self._pause_reading()
        return True

    def _resume_parked(self, fut: asyncio.Future[Any]) -> None:
        """``fut`` is done: step each coroutine parked on it (each reads the future's result
        itself, as under a Task); one that waits again, or whose wait was cancelled (the shared
        future of a cancelled waiter: it waits on a fresh one), goes on in a Task."""
        waiting = self._parked.pop(fut, None)
        if not waiting:
            return
        cancelled = fut.cancelled()
        for coro in waiting:
            if cancelled:
                yielded: Any = fut
            else:
                try:
                    yielded = coro.send(None)
                except StopIteration:
                    continue
                except BaseException:  # _serve answers handler errors itself; this is a bug in it
                    log.exception("a send from %s failed", self.remote_address)
                    continue
                if self._park(coro, yielded):
                    self._later -= 1  # counted once by the new wait
                    continue
            task = self._loop.create_task(resume_eager(coro, yielded))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
        self._later -= len(waiting)
        self._answered_later()

    def _cancel_parked(self) -> None:
        """``stop()``'s drain ran out: cancel the parked coroutines as it cancels tasks (each gets
        ``CancelledError`` at its wait; one that goes on waiting goes on in a Task)."""
        parked, self._parked = self._parked, {}
        count = 0
        for fut, waiting in parked.items():
            fut.remove_done_callback(self._resume_parked)
            count += len(waiting)
            for coro in waiting:
                try:
                    yielded = coro.throw(asyncio.CancelledError())
                except (StopIteration, asyncio.CancelledError):
                    continue
                except BaseException:
                    log.exception("a send from %s failed", self.remote_address)
                    continue
                task = self._loop.create_task(resume_eager(coro, yielded))
                self._tasks.add(task)
                task.add_done_callback(self._task_done)
        if count:
            self._later -= count
            self._answered_later()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._closing:
            if not self._tasks and not self._later:
                self.close()  # every request read before the bad bytes is answered
        elif self._reading_paused_by_us:
            self._maybe_resume_reading()

    async def _serve(self, cmd: RemotingCommand, work: Any = None) -> None:
        handler = self._handler
        response: RemotingCommand | None
        if handler is None and work is None:
            response = cmd.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark=f"request code {cmd.code} not supported"
            )
        else:
            try:
                result = handler(self, cmd) if work is None else work  # type: ignore[misc]  # checked above
                # Sync handlers work too: they return the response (or None) itself.
                response = result if result is None or isinstance(result, RemotingCommand) else await result
            except Exception as exc:
                log.exception("handler failed on request code %s from %s", cmd.code, self.remote_address)
                response = cmd.reply(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
        if response is None or cmd.flag & FLAG_ONEWAY or self._closed:
            return
        try:
            response.opaque = cmd.opaque
            response.flag |= FLAG_RESPONSE
            self._write(response)
        except RemotingSendError:
            log.debug("response to request code %s dropped: %s closed", cmd.code, self.remote_address)
        except Exception as exc:  # a bad response object must not kill the connection
            log.error("cannot send response to request code %s: %s", cmd.code, exc)
            try:
                self._write(cmd.reply(ResponseCode.SYSTEM_ERROR, remark=f"cannot encode response: {exc}"))
            except RemotingSendError:
                pass
            except Exception as err:  # not even the echoed opaque encodes: the peer cannot be answered
                self._close_after_answers(f"cannot answer request code {cmd.code}: {err}")

    def _on_header_error(self, exc: HeaderError) -> bool:
        """Answer (or drop) one command whose header is bad; False when the connection closes instead.

        Deliberately laxer than RocketMQ, whose NettyDecoder closes the channel on any decoding
        failure: the stream is still in sync, so a command whose opaque could be read is answered with
        SYSTEM_ERROR and the connection kept.  A header that yields no opaque cannot be answered, and a
        peer that sends one does not speak the protocol: that connection is closed, after the
        commands before it (already handed over) are answered.
        """
        if exc.opaque is None:
            self._close_after_answers(f"undecodable command header: {exc}")
            return False
        self._bad_headers += 1
        log_bad_header(self._bad_headers, self.remote_address, exc)
        flag = exc.flag or 0
        if flag & FLAG_RESPONSE:
            fut = self._pending.pop(exc.opaque, None)
            if fut is not None and not fut.done():
                fut.set_exception(RemotingError(f"undecodable response from {self.remote_address}: {exc}"))
            return True
        if flag & FLAG_ONEWAY or self._closed:
            return True
        reply = bad_header_reply(exc, exc.opaque)
        try:
            self._write(reply)
        except RemotingSendError:
            pass
        except ProtocolError as err:  # the codec range-checks what it decodes: this should not happen
            self._close_after_answers(f"cannot answer a bad header: {err}")
            return False
        return True

    def _close_after_answers(self, reason: str) -> None:
        """Close for bad input, with one WARNING line: stop reading, answer what was read, then close.

        Requests handed over before the bad bytes still get their answers (their handlers may be
        running); the connection is aborted if that takes over ``CLOSE_GRACE_S``.
        """
        if self._closing or self._closed:
            return
        self._closing = True
        log.warning("closing connection %s: %s", self.remote_address, reason)
        self._decoder.close(reason)  # later reads (none should come) fail fast, the buffer is freed
        self._release_buffer()
        self._pause_reading()
        self._grace_handle = self._loop.call_later(CLOSE_GRACE_S, self.abort)
        if not self._tasks and not self._later:
            self.close()

    def _account_buffer(self, progressed: bool) -> None:
        held = self._decoder.held
        if held and (progressed or not self._held):
            self._partial_since = self._last_activity  # a new partial frame began in this read
        delta = held - self._held
        if delta:
            self._held = held
            self._owner._buffer_changed(delta)

    def _release_buffer(self) -> None:
        if self._held:
            held, self._held = self._held, 0
            self._owner._buffer_changed(-held)

    def _check_idle(self) -> None:
        self._idle_handle = None
        if self._closed:
            return
        idle = self._options.idle_timeout_s
        elapsed = self._loop.time() - max(self._last_activity, self._out.last_write)
        if elapsed >= idle and not self._tasks and not self._later and not self._pending:
            log.info("closing connection %s: idle for %.1fs", self.remote_address, elapsed)
            self.close()
            return
        self._idle_handle = self._loop.call_later(max(idle - elapsed, idle / 10), self._check_idle)

    def _begin_drain(self) -> None:
        self._draining = True
        self._pause_reading()

    def __repr__(self) -> str:
        side = "server" if self.server_side else "client"
        return f"<Connection {side} {self.local_address}<->{self.remote_address}{' closed' if self._closed else ''}>"


def _expire(fut: asyncio.Future[RemotingCommand], code: int, address: str, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(
            RemotingTimeoutError(f"no response to request code {code} from {address} within {timeout}s")
        )
