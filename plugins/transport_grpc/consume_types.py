"""The seam between the v5 consumer RPCs and the brokers: :class:`ConsumeBackend` and its values.

The RPC layer (:mod:`.consume`) validates requests, converts messages and writes the answers; a
backend does the consumption itself: pop with invisibility, ack, change invisibility, forward to
the dead-letter queue, the queues a client is assigned and the recall of a timer message.  Its
values are plain (:class:`Delivered`, :class:`Assigned`, the :class:`ReceiptHandle` string) and its
refusals :class:`ConsumeRefused` with an ``apache.rocketmq.v2.Code`` name.  Two implementations
fit it: :class:`~.consume_backend.BrokerConsumeBackend` inside a broker's process (RocketMQ 5's
local mode, over the services layer) and a remoting-backed one for a ``tidemq proxy`` in front of
broker groups (POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, CONSUMER_SEND_MSG_BACK,
RECALL_MESSAGE); :func:`refused` maps a broker's response code to the v5 code for both.

The receipt handle is RocketMQ 5's (``ReceiptHandle``): the broker's POP ack handle
(``extraInfo``) followed by the message's commit-log offset, space separated::

    ckQueueOffset popTime invisibleTime reviveQid retry brokerName queueId queueOffset commitLogOffset

``retry`` is ``0`` for the topic itself, ``1``/``2`` for the group's V1/V2 retry topic.  The
broker keeps no table of handles: one that names no message in flight for the group (forged,
acknowledged, expired, another group's) is refused by the POP engine's lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from tidemq.message import MessageExt
from tidemq.remoting.codes import ResponseCode
from tidemq.transport import Connection

#: RocketMQ 5 response codes that are not in 4.x's ResponseCode.
_INVALID_PARAMETER = 29
_POLLING_FULL = 209
_POLLING_TIMEOUT = 210

#: A broker's response code -> the apache.rocketmq.v2.Code name RocketMQ's proxy answers with.
_CODES = {
    ResponseCode.SUCCESS: "OK",
    ResponseCode.SYSTEM_ERROR: "INTERNAL_SERVER_ERROR",
    ResponseCode.SYSTEM_BUSY: "TOO_MANY_REQUESTS",
    _POLLING_FULL: "TOO_MANY_REQUESTS",
    _POLLING_TIMEOUT: "MESSAGE_NOT_FOUND",
    ResponseCode.PULL_NOT_FOUND: "MESSAGE_NOT_FOUND",
    ResponseCode.NO_PERMISSION: "FORBIDDEN",
    ResponseCode.TOPIC_NOT_EXIST: "TOPIC_NOT_FOUND",
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: "CONSUMER_GROUP_NOT_FOUND",
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: "ILLEGAL_FILTER_EXPRESSION",
    ResponseCode.SLAVE_NOT_AVAILABLE: "HA_NOT_AVAILABLE",
    ResponseCode.ILLEGAL_OPERATION: "BAD_REQUEST",
    _INVALID_PARAMETER: "BAD_REQUEST",
}


class ConsumeRefused(Exception):
    """A refusal: ``code`` is an ``apache.rocketmq.v2.Code`` name, ``message`` the client's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def refused(response_code: int, remark: str, *, handle: bool = False) -> ConsumeRefused:
    """A broker's refusal as the v5 client gets it.  For an operation on a receipt handle
    (``handle``), a message no longer in flight (NO_MESSAGE: acknowledged, expired and redelivered,
    never popped, another group's) and a handle the broker cannot parse are INVALID_RECEIPT_HANDLE,
    the code on which the v5 clients stop retrying."""
    if handle and response_code in (ResponseCode.NO_MESSAGE, _INVALID_PARAMETER):
        return ConsumeRefused("INVALID_RECEIPT_HANDLE", remark)
    return ConsumeRefused(_CODES.get(response_code, "INTERNAL_SERVER_ERROR"), remark)


@attrs.frozen
class Delivered:
    """One received message and what the client needs to settle it."""

    message: MessageExt
    #: The topic the client receives from (messages coming back from the retry topic carry it).
    topic: str
    receipt_handle: str
    #: 1 for a first delivery; RocketMQ's reconsume times + 1 (FIFO: the queue's attempt count + 1).
    delivery_attempt: int
    invisible_ms: int


@attrs.frozen
class Assigned:
    """A queue a consumer receives from: ``queue_id`` -1 is every readable queue of the broker."""

    broker_name: str
    queue_id: int
    perm: int


class ConsumeBackend(Protocol):
    """The consumption the v5 RPCs ask of the brokers; every method raises :class:`ConsumeRefused`.

    ``group`` and ``topic`` are the names the client gives (the topic it subscribes to, never a
    retry topic); receipt handles are the strings the backend handed out in :class:`Delivered`.
    """

    async def receive(
        self,
        group: str,
        topic: str,
        batch_size: int,
        invisible_ms: int,
        poll_ms: int,
        expression_type: str,
        expression: str,
        fifo: bool,
        closed: Callable[[], bool],
    ) -> list[Delivered]:
        """Up to ``batch_size`` messages, invisible to the group for ``invisible_ms``; waits up to
        ``poll_ms`` for one (an empty list: none came); ``closed()`` ends the wait early."""
        ...

    async def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """The message is consumed: it is not delivered again."""
        ...

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Make the message visible again ``invisible_ms`` from now; its new receipt handle (the
        old one is spent)."""
        ...

    async def forward_to_dlq(
        self, group: str, topic: str, receipt_handle: str, message_id: str, max_attempts: int
    ) -> None:
        """Put the message in ``%DLQ%<group>`` and take it out of delivery."""
        ...

    async def query_assignment(self, topic: str, group: str, client_id: str) -> list[Assigned]:
        """The queues ``client_id`` of ``group`` receives ``topic`` from."""
        ...

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a timer message not yet delivered; the id of the message recalled."""
        ...

    async def group_policy(self, group: str) -> GroupPolicy:
        """The group's FIFO flag and delivery attempts (created as a 4.x heartbeat creates it)."""
        ...

    async def register_consumer(
        self,
        peer: Connection,
        client_id: str,
        language: str,
        group: str,
        subscriptions: list[Subscribed],
        consume_type: str = "CONSUME_PASSIVELY",
    ) -> None:
        """``client_id`` consumes for ``group`` over ``peer`` (its Telemetry stream), so the
        group's connections and progress show it; called again on each heartbeat.  It is dropped
        when ``peer`` closes.  ``consume_type``: CONSUME_ACTIVELY for a SimpleConsumer, else
        CONSUME_PASSIVELY (as RocketMQ 5's proxy registers them)."""
        ...


_RETRY_PREFIX = "%RETRY%"


def retry_topic(topic: str, group: str, mark: str) -> str:
    """The stored topic a handle's ``retry`` item names (RocketMQ's KeyBuilder)."""
    if mark == "0":
        return topic
    if mark == "1":
        return f"{_RETRY_PREFIX}{group}_{topic}"
    if mark == "2":
        return f"{_RETRY_PREFIX}{group}+{topic}"
    raise ConsumeRefused(
        "INVALID_RECEIPT_HANDLE", f"the receipt handle's retry item {mark!r} is not 0, 1 or 2"
    )


@attrs.frozen
class ReceiptHandle:
    """One message's receipt handle, parsed."""

    start: int
    pop_time: int
    invisible_ms: int
    revive_qid: int
    retry: str
    broker_name: str
    queue_id: int
    offset: int
    commit_log_offset: int

    @property
    def deadline_ms(self) -> int:
        """When the message becomes visible again (the handle expires)."""
        return self.pop_time + self.invisible_ms

    def extra_info(self) -> str:
        """The broker's POP ack handle (ACK_MESSAGE's and CHANGE_MESSAGE_INVISIBLETIME's extraInfo)."""
        return (
            f"{self.start} {self.pop_time} {self.invisible_ms} {self.revive_qid} {self.retry} "
            f"{self.broker_name} {self.queue_id} {self.offset}"
        )

    def encode(self) -> str:
        text = f"{self.extra_info()} {self.commit_log_offset}"
        _remember(text, self)  # its settle (an ack) finds it parsed
        return text

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """The handle's fields; INVALID_RECEIPT_HANDLE (:class:`ConsumeRefused`) when it is not one."""
        parts = text.split(" ")
        if len(parts) != 9 or len(text) > 512:
            raise ConsumeRefused("INVALID_RECEIPT_HANDLE", f"receipt handle {text[:80]!r} is not valid")
        try:
            numbers = [int(parts[i]) for i in (0, 1, 2, 3, 6, 7, 8)]
        except ValueError:
            raise ConsumeRefused(
                "INVALID_RECEIPT_HANDLE", f"receipt handle {text[:80]!r} holds a non-number"
            ) from None
        if parts[4] not in ("0", "1", "2") or not parts[5] or min(numbers) < 0:
            raise ConsumeRefused("INVALID_RECEIPT_HANDLE", f"receipt handle {text[:80]!r} is not valid")
        start, pop_time, invisible, rqid, qid, offset, cl_offset = numbers
        return cls(start, pop_time, invisible, rqid, parts[4], parts[5], qid, offset, cl_offset)


#: Handles encoded or decoded lately, by their text: a settle parses its handle twice (its expiry
#: checked by the RPC, its fields read by the backend), and a handle this process handed out is
#: found without parsing at all.  Handles are values; the table is bounded (cleared when full).
_HANDLES: dict[str, ReceiptHandle] = {}
_HANDLES_KEPT = 4096


def _remember(text: str, handle: ReceiptHandle) -> None:
    if len(_HANDLES) >= _HANDLES_KEPT:
        _HANDLES.clear()
    _HANDLES[text] = handle


def decode_receipt_handle(text: str) -> ReceiptHandle:
    """:meth:`ReceiptHandle.decode`, remembering the latest handles."""
    handle = _HANDLES.get(text)
    if handle is None:
        handle = ReceiptHandle.decode(text)
        _remember(text, handle)
    return handle


@attrs.frozen
class GroupPolicy:
    """How a consumer group consumes, as the v5 clients are told in their settings."""

    #: Messages of one message group in order (the group's ``consumeMessageOrderly``).
    fifo: bool
    #: Deliveries before a message goes to ``%DLQ%<group>`` (the group's ``retryMaxTimes`` + 1).
    max_attempts: int


@attrs.frozen
class Subscribed:
    """One topic a v5 consumer subscribes to: ``expression_type`` is ``TAG`` or ``SQL92``."""

    topic: str
    expression_type: str
    expression: str
