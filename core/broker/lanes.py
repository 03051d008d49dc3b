"""The broker's end of the request lanes (issue 38): when a store's lane serves a read's sends.

A store may offer a :class:`~tidemq.store.SendLane` (:func:`tidemq.store.send_lane`); the mmap
store offers the compiled one.  :class:`SendLaneEntry` takes it for SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE only where
nobody could see a difference from the Python handler (:class:`~tidemq.broker.processors.send.
SendHandler`, which stays the reference and serves everything else):

* the codes' handler is the built-in send handler, none wrapped by a plugin (decided at start);
* no plugin listens to ``tidemq_before_send``/``tidemq_after_send`` (trace, audit: checked per run);
* the access check is done: the broker runs it before, as for the handler; on the read's bytes
  (:meth:`SendLaneEntry.serve_read`) by the access validator's lane check (:class:`LaneAccess`),
  per frame: a read with a frame it does not admit is decoded whole and goes the Python way,
  whose ``validate`` decides and answers;
* the broker is a master, and the topic is known, writable, a valid name, neither the default
  nor a retry topic;
* no send of the run is a resend the duplicate window holds, nor repeats a key of the run
  (:meth:`SendLaneEntry.windowed`: the window's keys are checked and recorded as the handler
  does, and a run with a hit goes to the handler, which answers resends);
* the lane's own checks (see :mod:`tidemq._native._send_lane`): plain header values, a queue
  id in range, no transaction, delay or timer property, a batch body its decoder takes.

A run the lane declines goes whole to the Python handler.  What the lane gives is stored and
answered by the same ``SendService.put``/``settled`` and ``send_response`` as the handler's sends:
equal answers and records by construction (the differential tests check it).

When the store's lane also has the wire ends (:class:`~tidemq.store.SendFrameLane`),
:meth:`SendLaneEntry.serve_read` serves a read from its bytes (the transport offers them before
decoding): the compiled code splits the leading send frames and reads their headers, and writes
the settled sends' answers as bytes equal to ``send_response``'s encoding; no command object is
made per request (``docs/request-lanes.md``).

Under sync flush a read's sends are not settled when it is served: they wait for their group
commit round.  When all of them wait on one round of this loop (one
:class:`~tidemq.futures.SharedCompletion`), the read is *held*: the transport is told how many
requests are answered later, and the round's callback answers every read held for it in one pass
(:meth:`SendLaneEntry._answer_round`): the sends settled, each connection's answers written by the
compiled encoder in one call and one write.  No task, coroutine or command object per send
(``docs/flush.md``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from asyncio import _get_running_loop as running_loop
from collections.abc import Awaitable, Callable
from typing import Any, cast

from tidemq.acl import LaneAccessCheck, lane_access_check
from tidemq.broker.headers import DEFAULT_TOPIC, RETRY_GROUP_TOPIC_PREFIX
from tidemq.broker.processors.send import SendHandler, send_response
from tidemq.broker.services.put import Send, settled_many
from tidemq.broker.services.send import SendService, born_host
from tidemq.context import BrokerContext
from tidemq.extensions import DISABLE_VARIABLE, compiled_twin
from tidemq.futures import SharedCompletion
from tidemq.message import Prop
from tidemq.names import check_topic_name
from tidemq.perm import is_writeable
from tidemq.plugins import Listeners
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import SendFrameLane, SendLane, send_lane
from tidemq.transport import AnswersLater, Connection

log = logging.getLogger(__name__)

_REAL_TOPIC = Prop.REAL_TOPIC
#: ``put_sends(service, sends)``: :meth:`SendService.put` compiled (the same groups and puts), or
#: None: the method.
_put_sends: Callable[[SendService, list[Send]], None] | None = getattr(
    compiled_twin("tidemq._native._send_lane"), "put_sends", None
)
#: Topic names known to pass the name rules (a pure function of the name; bounded).
_NAME_CACHE_MAX = 4096


class SendLaneEntry:
    """The store's send lane as the broker takes it (see the module docstring for when)."""

    __slots__ = (
        "_answer",
        "_broker",
        "_command_of",
        "_failed",
        "_access",
        "_listened",
        "_prepare",
        "_prepare_frames",
        "_round",
        "_round_reads",
        "_take",
        "_service",
        "_topics",
        "_topics_get",
        "_valid",
        "description",
        "handler",
        "held_reads",
        "rounds_answered",
        "window_declined",
    )

    def __init__(self, broker: BrokerContext, handler: SendHandler, lane: SendLane, failed: Failed) -> None:
        self._broker = broker
        #: ``failed(conn, request, exc)``: the broker's answer to a request whose handling raised.
        self._failed = failed
        self.handler = handler
        self._service: SendService = handler.service
        hooks = broker.hooks
        self._listened = Listeners(hooks.tidemq_before_send, hooks.tidemq_after_send)
        self._prepare = lane.prepare_sends
        #: The wire ends (a :class:`~tidemq.store.SendFrameLane`): :meth:`serve_read`.
        self._take: Callable[[bytes, int], tuple[list[Any], int]] | None = None
        self._prepare_frames: Callable[..., list[Send] | None] | None = None
        self._answer: Callable[[list[Any], list[Send]], bytes | None] | None = None
        self._command_of: Callable[[Any], RemotingCommand] | None = None
        if isinstance(lane, SendFrameLane):
            self._take = lane.take_frames
            self._prepare_frames = lane.prepare_frames
            self._answer = lane.answer_frames
            self._command_of = lane.command_of
        self._topics = broker.topics
        #: Bound once, not per read: the topic lookup the duplicate window takes (windowed).
        self._topics_get = broker.topics.get
        #: The access validator's check of a frame (None: access control off, or no lane check).
        self._access: LaneAccess | None = lane_access(broker.acl)
        self._valid: set[str] = set()
        self.description = lane.description
        #: Runs the lane prepared but left to the handler for the duplicate window (a resend).
        self.window_declined = 0
        #: The flush round reads are held for now, and those reads (see :meth:`_answer_round`).
        self._round: SharedCompletion | None = None
        self._round_reads: list[_Held] = []
        #: Reads held for a flush round, and rounds answered (their ratio: reads per round).
        self.held_reads = 0
        self.rounds_answered = 0

    def serve(
        self, conn: Connection, requests: list[RemotingCommand]
    ) -> list[RemotingCommand | Awaitable[RemotingCommand | None]] | None:
        """Per request, in order, its response or an awaitable of it; None when the lane does not
        take the run (the Python handler serves it then)."""
        broker = self._broker
        if self._listened() or not broker.is_master:
            return None
        settings = broker.settings
        sends = self._prepare(
            requests,
            self._writable_queues,
            settings.cluster,
            settings.max_batch_messages,
            born_host(conn),
            broker.store_host,
        )
        if sends is None:
            return None
        if not self.windowed(sends):
            self.window_declined += 1
            return None
        service = self._service
        service.put(sends)
        done = [False] * len(sends)
        settled_many(service.broker, sends, done)  # each put's futures asked once
        return [
            send_response(request, send) if ready else self._later(request, send)
            for request, send, ready in zip(requests, sends, done, strict=True)
        ]

    @property
    def reads(self) -> bool:
        """Whether the lane also serves a read's bytes (:meth:`serve_read`)."""
        return self._take is not None

    def serve_read(self, conn: Connection, data: bytes, max_frame: int) -> tuple[int, Any] | None:
        """:meth:`tidemq.transport.ReadLaneHandler.serve_read`: the leading send frames of a read
        served from its bytes (frames split and headers read, sends prepared, responses written by
        the store's compiled lane; windowed, put and settled here as in :meth:`serve`); None when
        the lane takes none of them (the transport decodes the read for the Python path then).
        """
        take = self._take
        broker = self._broker
        if take is None or self._listened() or not broker.is_master:
            return None
        access = self._access
        if access is None and broker.acl is not None:
            return None  # a validator without a lane check: every request goes the Python way
        frames, end = take(data, max_frame)
        if not frames:
            return None
        if access is not None and not access.admits_all(frames, conn.remote_address):
            return None  # decoded: validate decides each request the check did not admit
        settings = broker.settings
        host = conn.context.born_host  # born_host(conn) without the call, once it is parsed
        sends = self._prepare_frames(  # type: ignore[misc]
            frames,
            self._writable_queues,
            settings.cluster,
            settings.max_batch_messages,
            host if host is not None else born_host(conn),
            broker.store_host,
        )
        command_of = self._command_of
        if sends is None:
            return end, self._by_handler(conn, [command_of(frame) for frame in frames])  # type: ignore[misc]
        if not self.windowed(sends):
            self.window_declined += 1
            return end, self._by_handler(conn, [command_of(frame) for frame in frames])  # type: ignore[misc]
        service = self._service
        try:
            if _put_sends is not None:
                _put_sends(service, sends)
            else:
                service.put(sends)
            done = [False] * len(sends)
            settled_many(service.broker, sends, done)  # each put's futures asked once
            if all(done):
                answer = self._answer(frames, sends)  # type: ignore[misc]
                if answer is not None:
                    return end, answer
            else:
                completion = self._round_of(sends, done)
                if completion is not None and _answers_later(conn):
                    self._hold(completion, cast(AnswersLater, conn), frames, sends, done)
                    return end, len(frames)
            works: list[tuple[RemotingCommand, Any]] = []
            for frame, send, ready in zip(frames, sends, done, strict=True):
                request = command_of(frame)  # type: ignore[misc]
                works.append((request, send_response(request, send) if ready else self._later(request, send)))
        except Exception as exc:  # as serve's caller does: each request is answered with it
            log.error("sends from %s failed", conn.remote_address, exc_info=exc)
            remark = f"{type(exc).__name__}: {exc}"
            requests = [command_of(frame) for frame in frames]  # type: ignore[misc]
            return end, [(r, r.reply(ResponseCode.SYSTEM_ERROR, remark)) for r in requests]
        return end, works

    def _by_handler(
        self, conn: Connection, requests: list[RemotingCommand]
    ) -> list[tuple[RemotingCommand, Any]]:
        """Frames the lane read but does not serve, served by the Python handler as the broker
        serves them decoded (:meth:`Broker.handle` alone, ``many`` for a run; its error mapping)."""
        failed = self._failed
        if len(requests) == 1:
            request = requests[0]
            return [(request, self._alone(conn, request))]

        def fail(request: RemotingCommand, exc: Exception) -> RemotingCommand:
            return failed(conn, request, exc)

        try:
            works = list(self.handler.many(conn, requests, fail))
            if len(works) != len(requests):
                raise RuntimeError(f"{self.handler!r} answered {len(works)} of {len(requests)} requests")
        except Exception as exc:  # as the broker's coalesced runs: each is answered with it
            return [(request, failed(conn, request, exc)) for request in requests]
        return list(zip(requests, works, strict=True))

    async def _alone(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            return await self.handler(conn, request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._failed(conn, request, exc)

    def windowed(self, sends: list[Send]) -> bool:
        """The duplicate window (issue 37) over a run's prepared sends, as the handler's
        ``SendService.prepare``/``prepare_batch`` use it: False (the handler takes the run, and
        nothing was recorded) when a send is a resend the window holds or repeats a key of the
        run; else every send with usable keys is recorded, pending until stored."""
        return self._broker.dedup.admit_run(sends, self._topics_get)  # one compiled call per run

    def _round_of(self, sends: list[Send], done: list[bool]) -> SharedCompletion | None:
        """The one flush round of this loop every unsettled send of a read waits for, not complete
        yet; None when they wait for anything else too (the read is answered per request then)."""
        topics = self._broker.topics
        if topics.unwritten:  # a topic created on first use is waited for (settle), unless written
            names: set[str] = set()
            for send in sends:
                first = send.msgs[0]
                names.add(first.topic)
                real = first.properties.get(_REAL_TOPIC)
                if real:
                    names.add(real)
            if topics.when_written(*names) is not None:
                return None
        completion: SharedCompletion | None = None
        for send, ready in zip(sends, done, strict=True):
            if ready:
                continue
            group = send.group
            if group is None:  # a duplicate waiting for its first copy
                return None
            waits = getattr(group.future, "completion", None)
            if waits is None or (completion is not None and waits is not completion):
                return None
            completion = waits
        if completion is None or completion.done or completion.loop is not running_loop():
            return None
        return completion

    def _hold(
        self,
        completion: SharedCompletion,
        conn: AnswersLater,
        frames: list[Any],
        sends: list[Send],
        done: list[bool],
    ) -> None:
        """Answer the read with its round: one callback per round for all the reads held for it."""
        reads = self._round_reads
        if completion is not self._round:
            self._round = completion
            reads = self._round_reads = []
            completion.call_when_done(self._answer_round, reads)
        reads.append((conn, frames, sends, done))
        self.held_reads += 1

    def _answer_round(self, reads: list[_Held]) -> None:
        """On the loop, once the round is durable (or timed out): every read held for it answered,
        each connection's settled reads with one compiled call and one write."""
        self.rounds_answered += 1
        if self._round_reads is reads:
            self._round = None
            self._round_reads = []
        broker = self._service.broker
        # Per connection, the frames and sends of its reads, in order, when every send settled.
        ready: dict[AnswersLater, tuple[list[Any], list[Send]]] = {}
        for conn, frames, sends, done in reads:
            try:
                settled_many(broker, sends, done)
            except Exception as exc:
                self._answer_failed(conn, frames, exc)
                continue
            if all(done):
                both = ready.get(conn)
                if both is None:
                    ready[conn] = (frames, sends)
                else:  # a second read of the connection in this round: one answer for both
                    ready[conn] = (both[0] + frames, both[1] + sends)
                continue
            # A send waits for more than the flush (its replicas): answered per request.
            self._answer_each(conn, frames, sends, done)
        answer = self._answer
        for conn, (frames, sends) in ready.items():
            try:
                frames_out = answer(frames, sends)  # type: ignore[misc]
            except Exception as exc:
                self._answer_failed(conn, frames, exc)
                continue
            if frames_out is not None:
                conn.answer_later(frames_out, len(frames))
            else:  # a send this lane does not write (a recall handle, a remark it refuses)
                self._answer_each(conn, frames, sends, [True] * len(sends))

    def _answer_each(
        self, conn: AnswersLater, frames: list[Any], sends: list[Send], done: list[bool]
    ) -> None:
        """A held read answered per request: ``send_response`` for the settled, a wait for the rest."""
        command_of = self._command_of
        try:
            works: list[tuple[RemotingCommand, Any]] = []
            for frame, send, ready in zip(frames, sends, done, strict=True):
                request = command_of(frame)  # type: ignore[misc]
                works.append((request, send_response(request, send) if ready else self._later(request, send)))
        except Exception as exc:
            for _request, work in works:
                if asyncio.iscoroutine(work):
                    work.close()
            self._answer_failed(conn, frames, exc)
            return
        conn.answer_later(works, len(frames))

    def _answer_failed(self, conn: AnswersLater, frames: list[Any], exc: Exception) -> None:
        """A held read whose answering raised: each request answered SYSTEM_ERROR (as serve_read)."""
        log.error("sends from %s failed", getattr(conn, "remote_address", "?"), exc_info=exc)
        remark = f"{type(exc).__name__}: {exc}"
        requests = [self._command_of(frame) for frame in frames]  # type: ignore[misc]
        conn.answer_later([(r, r.reply(ResponseCode.SYSTEM_ERROR, remark)) for r in requests], len(frames))

    async def _later(self, request: RemotingCommand, send: Send) -> RemotingCommand:
        await self._service.settle(send)
        return send_response(request, send)

    def _writable_queues(self, topic: str) -> int:
        """The topic's queue count when a send to it needs no check beyond its queue id, else -1."""
        cfg = self._topics.get(topic)
        if (
            cfg is None
            or not is_writeable(cfg.perm)
            or topic == DEFAULT_TOPIC
            or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        ):
            return -1
        valid = self._valid
        if topic not in valid:
            if check_topic_name(topic):
                return -1
            if len(valid) >= _NAME_CACHE_MAX:
                valid.clear()
            valid.add(topic)
        return cfg.queue_count


#: Requests the access validator's lane check admitted where they were (``admitted``), and those
#: it left to the Python way's ``validate`` (``to_python``: refusals and any doubt).
acl_counters = {"admitted": 0, "to_python": 0}


class LaneAccess:
    """The access validator's :class:`~tidemq.acl.LaneAccessCheck` as the broker takes it: the
    check per request, counted (:data:`acl_counters`), failing closed (a check that raises leaves
    the request to ``validate``)."""

    __slots__ = ("_admits", "description")

    def __init__(self, check: LaneAccessCheck) -> None:
        self._admits = check.admits
        self.description = check.description

    def admits(self, code: int, ext_fields: Any, body: bytes | None, remote_addr: str) -> bool:
        """Whether the validator would allow the request (True: no ``validate`` needed)."""
        try:
            ok = self._admits(code, ext_fields or {}, body, remote_addr)
        except Exception:
            log.exception("the access validator's lane check failed; the request goes to validate")
            ok = False
        acl_counters["admitted" if ok else "to_python"] += 1
        return ok

    def admits_all(self, frames: list[Any], remote_addr: str) -> bool:
        """Whether the check admits every frame of a read (the frame lane's ``(code, .., ext_fields,
        body, ..)`` tuples).  False at the first it does not: the whole read then goes the Python
        way, as it did before (its admitted sends still put together, refusals answered in place)."""
        admits = self._admits
        try:
            for frame in frames:
                if not admits(frame[0], frame[6] or {}, frame[7], remote_addr):
                    return False  # counted where the Python way asks again, per request
        except Exception:
            log.exception("the access validator's lane check failed; the read goes to validate")
            return False
        acl_counters["admitted"] += len(frames)
        return True


def lane_access(validator: object) -> LaneAccess | None:
    """The broker's access validator's lane check, or None: access control off, a validator that
    offers none, or ``TIDEMQ_NO_EXTENSIONS`` (every request then goes to ``validate``, the reference)."""
    if validator is None or os.environ.get(DISABLE_VARIABLE, "") not in ("", "0"):
        return None
    check = lane_access_check(validator)
    return LaneAccess(check) if check is not None else None


#: ``failed(conn, request, exc)``: :meth:`Broker.failed`, the broker's one error mapping.
Failed = Callable[[Connection, RemotingCommand, Exception], RemotingCommand]
#: A read held for a flush round: its connection, frames, sends and which sends are settled.
_Held = tuple[AnswersLater, list[Any], list[Send], list[bool]]

#: Per connection type: does it take answers later (:class:`AnswersLater`)?  Asked once per type,
#: not per read (a runtime Protocol check costs microseconds).
_ANSWERS_LATER: dict[type, bool] = {}


def _answers_later(conn: object) -> bool:
    kind = type(conn)
    later = _ANSWERS_LATER.get(kind)
    if later is None:
        later = _ANSWERS_LATER[kind] = isinstance(conn, AnswersLater)
    return later


def send_lane_entry(broker: BrokerContext, handlers: list[Any], failed: Failed) -> SendLaneEntry | None:
    """The send lane when every send code's handler is the built-in one (one object) and the
    store offers a lane."""
    handler = handlers[0]
    if type(handler) is not SendHandler or any(h is not handler for h in handlers):
        return None  # a plugin's wrapper, or another handler: never the lane
    lane = send_lane(broker.store)
    return SendLaneEntry(broker, handler, lane, failed) if lane is not None else None


def lane_counts() -> dict[str, int]:
    """The request lanes' counters in this process, read-only (issue 38; 0 for a lane not built):
    runs of sends the compiled prepare step served or refused to the Python handler, send frames
    the read lane took and reads it answered with compiled bytes, pulls the pull lane served or
    declined, requests the access validator's lane check admitted or left to ``validate``.
    GET_BROKER_RUNTIME_INFO (``lane*``) and the metrics exporter read them."""
    from tidemq.broker.pull_lane import counters as pulls

    try:
        from tidemq._native._frame_lane import frame_counts
        from tidemq._native._send_lane import lane_counts as run_counts
    except ImportError:  # not built
        runs, frames = (0, 0), (0, 0)
    else:
        runs, frames = run_counts(), frame_counts()
    return {
        "send_runs_served": runs[0],
        "send_runs_to_python": runs[1],
        "read_frames_taken": frames[0],
        "read_answers": frames[1],
        "pull_served": pulls["served"],
        "pull_to_python": pulls["declined"],
        "acl_admitted": acl_counters["admitted"],
        "acl_to_python": acl_counters["to_python"],
    }
