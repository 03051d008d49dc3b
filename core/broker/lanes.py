"""The broker's end of the request lanes (issue 38): when a store's lane serves a read's sends.

A store may offer a :class:`~tidemq.store.SendLane` (:func:`tidemq.store.send_lane`); the mmap
store offers the compiled one.  :class:`SendLaneEntry` takes it for SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE only where
nobody could see a difference from the Python handler (:class:`~tidemq.broker.processors.send.
SendHandler`, which stays the reference and serves everything else):

* the codes' handler is the built-in send handler, none wrapped by a plugin (decided at start);
* no plugin listens to ``tidemq_before_send``/``tidemq_after_send`` (trace, audit: checked per run);
* the access check is done (the broker runs it before, as for the handler);
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
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from tidemq.broker.headers import DEFAULT_TOPIC, RETRY_GROUP_TOPIC_PREFIX
from tidemq.broker.processors.send import SendHandler, send_response
from tidemq.broker.services.put import Send
from tidemq.broker.services.send import SendService, born_host
from tidemq.context import BrokerContext
from tidemq.names import check_topic_name
from tidemq.perm import is_writeable
from tidemq.plugins import Listeners
from tidemq.remoting.command import RemotingCommand
from tidemq.store import SendLane, send_lane
from tidemq.transport import Connection

#: Topic names known to pass the name rules (a pure function of the name; bounded).
_NAME_CACHE_MAX = 4096


class SendLaneEntry:
    """The store's send lane as the broker takes it (see the module docstring for when)."""

    __slots__ = (
        "_broker",
        "_listened",
        "_prepare",
        "_service",
        "_topics",
        "_valid",
        "description",
        "handler",
        "window_declined",
    )

    def __init__(self, broker: BrokerContext, handler: SendHandler, lane: SendLane) -> None:
        self._broker = broker
        self.handler = handler
        self._service: SendService = handler.service
        hooks = broker.hooks
        self._listened = Listeners(hooks.tidemq_before_send, hooks.tidemq_after_send)
        self._prepare = lane.prepare_sends
        self._topics = broker.topics
        self._valid: set[str] = set()
        self.description = lane.description
        #: Runs the lane prepared but left to the handler for the duplicate window (a resend).
        self.window_declined = 0

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
        settled = service.settled
        return [
            send_response(request, send) if settled(send) else self._later(request, send)
            for request, send in zip(requests, sends, strict=True)
        ]

    def windowed(self, sends: list[Send]) -> bool:
        """The duplicate window (issue 37) over a run's prepared sends, as the handler's
        ``SendService.prepare``/``prepare_batch`` use it: False (the handler takes the run, and
        nothing was recorded) when a send is a resend the window holds or repeats a key of the
        run; else every send with usable keys is recorded, pending until stored."""
        return self._broker.dedup.admit_run(sends, self._topics.get)  # one compiled call per run

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


def send_lane_entry(broker: BrokerContext, handlers: list[Any]) -> SendLaneEntry | None:
    """The send lane when every send code's handler is the built-in one (one object) and the
    store offers a lane."""
    handler = handlers[0]
    if type(handler) is not SendHandler or any(h is not handler for h in handlers):
        return None  # a plugin's wrapper, or another handler: never the lane
    lane = send_lane(broker.store)
    return SendLaneEntry(broker, handler, lane) if lane is not None else None
