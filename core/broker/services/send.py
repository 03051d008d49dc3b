"""Sends from plain values: single, batch and reply messages, and a consumer's send-back.

A send goes through three steps, each one call for the transport:

1. :meth:`SendService.prepare` (or :meth:`~SendService.prepare_batch`,
   :meth:`~SendService.prepare_reply`) does everything before the store, synchronously: topic
   checks, retry routing, the ``tidemq_before_send`` hook and the transaction/delay/timer rewrite.  It
   gives a :class:`~tidemq.broker.services.put.Send` to store, or the :class:`Outcome` that ends
   the send here (a refusal).
2. :meth:`SendService.put` stores the sends of one read, one put per topic, queue and transaction
   type (:meth:`~SendService.put_one` a lone send).
3. :meth:`SendService.settled` fills a send's outcome when its put and replicas are done already
   (async flush: nearly every send) without a coroutine; otherwise :meth:`SendService.settle`
   awaits them.  Either way ``tidemq_after_send`` is called and the send carries its ``status``,
   ``msg_id``, ``queue_offset``, ``remark`` and ``epoch``.

One service call per request (or per read for :meth:`~SendService.put`), never per message: the
messages flow as the list of :class:`~tidemq.message.MessageInner` the put takes.  This is also
the seam of a compiled request lane (a store capability decoding SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE headers and bodies without Python objects per field): it hands the same plain
values, or the messages it built, to steps 1 and 2 and reads the same outcome.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Mapping

from tidemq.address import split_address
from tidemq.broker.context import BrokerContext
from tidemq.broker.dedup import MAX_KEY_LENGTH, UNIQ_KEY, Duplicate, Sent, content_key
from tidemq.broker.dedup_table import batch_keys, hashes_of
from tidemq.broker.headers import (
    DEFAULT_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    dlq_topic,
    retry_topic,
)
from tidemq.broker.services.put import (
    GROUP_MAX_BYTES,
    PutGroup,
    Send,
    settle,
    settled,
    settled_many,
    store_group,
    store_groups,
)
from tidemq.broker.services.status import DONE, Outcome, Status
from tidemq.broker.timer import TIMER_OUT_MS, TimerRefused
from tidemq.broker.topics import TopicConfig
from tidemq.broker.transaction import is_half_request
from tidemq.errors import CorruptDataError
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_TYPE_MASK,
    BatchLimitError,
    MessageInner,
    Prop,
    decode_batch_messages,
    decode_message,
    string_to_properties,
)
from tidemq.names import check_group_name, check_topic_name
from tidemq.observe import SendContext
from tidemq.perm import PERM_READ, PERM_WRITE, is_writeable
from tidemq.plugins import Listeners
from tidemq.topic_attributes import message_type_of, topic_message_type, type_conflict
from tidemq.transport import Connection

# A private generator: the process's global `random` state stays the application's.
_random = random.Random()

log = logging.getLogger(__name__)

_CLUSTER = Prop.CLUSTER
#: Topic names known to pass the name rules; a pure function of the name, so cached (bounded).
_NAME_CACHE_MAX = 4096

__all__ = ["SendService", "Send"]


def born_host(peer: Connection) -> tuple[str, int]:
    """The producer's address as BORNHOST, parsed once per connection (the same for every send)."""
    state = peer.context
    host = state.born_host
    if host is None:
        host = state.born_host = parse_host(peer.remote_address)
    return host


def parse_host(address: str) -> tuple[str, int]:
    """A peer's ``host:port`` as BORNHOST; ``("127.0.0.1", 0)`` when it is not one."""
    try:
        host, port = split_address(address or "")
    except ValueError:
        return "127.0.0.1", 0
    return host or "127.0.0.1", port


class SendService:
    """Stores what producers send (RocketMQ's SendMessageProcessor, without the wire)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._valid_topics: set[str] = set()
        hooks = broker.hooks
        self._listened = Listeners(hooks.tidemq_before_send, hooks.tidemq_after_send)
        self.settled = functools.partial(settled, broker)

    # ------------------------------------------------------------------ checks
    def check_topic(
        self, topic: str, default_topic: str, default_queue_nums: int, queue_id: int, sys_flag: int
    ) -> TopicConfig | Outcome:
        """The topic config to write to, or the refusal (msgCheck of RocketMQ)."""
        b = self.broker
        if not b.is_master:
            # Controller mode: the epoch this replica follows, as on every send answer.
            role_aware = b.role_aware
            return Outcome(
                Status.SERVICE_NOT_AVAILABLE,
                f"the broker[{b.settings.name}] is a slave and takes no messages",
                role_aware.current_epoch() if role_aware is not None else None,
            )
        if topic not in self._valid_topics:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):  # %RETRY%<group>: the group's rules apply
                problem = check_group_name(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
            else:
                problem = check_topic_name(topic)
            if problem:
                return Outcome(Status.SYSTEM_ERROR, problem)
            if len(self._valid_topics) >= _NAME_CACHE_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if topic == DEFAULT_TOPIC:
            return Outcome(Status.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words.")
        cfg = b.topics.get(topic)
        if cfg is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                group_cfg = b.groups.find_or_create(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
                if group_cfg is not None:
                    cfg = b.topics.create_in_send_back(
                        topic, group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE, sys_flag
                    )
            else:
                cfg = b.topics.create_in_send(
                    topic, default_topic or DEFAULT_TOPIC, default_queue_nums, sys_flag
                )
        if cfg is None:
            return Outcome(Status.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not is_writeable(cfg.perm):
            return Outcome(
                Status.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden (perm {cfg.perm})"
            )
        if queue_id >= cfg.queue_count:
            return Outcome(
                Status.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic {topic} has {cfg.write_queue_nums} write queues",
            )
        return cfg

    def check_message_type(self, cfg: TopicConfig, properties: Mapping[str, str]) -> Outcome | None:
        """RocketMQ 5's topic message type check (its proxy's ``enableTopicMessageTypeCheck``): a
        message of a type the topic's ``message.type`` does not take is MESSAGE_ILLEGAL; retry
        and dead-letter topics are not checked.  The gRPC transport calls it; 4.x remoting sends
        are not checked, as a RocketMQ 5 broker does not check them (docs/grpc.md)."""
        if cfg.topic_name.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
            return None
        problem = type_conflict(topic_message_type(cfg.attributes), message_type_of(properties))
        return None if problem is None else Outcome(Status.MESSAGE_ILLEGAL, problem)

    # ------------------------------------------------------------------ step 1: prepare
    def prepare(
        self,
        peer: Connection,
        producer_group: str,
        topic: str,
        queue_id: int,
        sys_flag: int,
        default_topic: str,
        default_queue_nums: int,
        properties: str,
        reconsume_times: int,
        max_reconsume_times: int,
        flag: int,
        born_timestamp: int,
        body: bytes,
    ) -> Send | Outcome:
        """One message: the send to store, or the refusal that ends it here."""
        b = self.broker
        cfg = self.check_topic(topic, default_topic, default_queue_nums, queue_id, sys_flag)
        if type(cfg) is Outcome:  # not isinstance: a builtin call less per send
            return cfg
        if queue_id < 0:
            queue_id = _random.randrange(max(cfg.write_queue_nums, 1))  # type: ignore[union-attr]
        props = string_to_properties(properties)
        # The duplicate window (issue 37): a resend of a message stored within it is answered so.
        window = b.dedup
        seconds, content = window.topic_settings(topic, cfg)
        if seconds > 0:
            key = content_key(flag, body, props) if content else props.get(UNIQ_KEY)
            if key and len(key) <= MAX_KEY_LENGTH:
                first = window.check(topic, key)
                if first is not None:
                    pos = first.position(key)
                    if content or window.same_body(first, pos, body, b.store):
                        window.count_dropped(topic, 1)
                        dup = MessageInner(topic, body, queue_id, flag, props, sys_flag, born_timestamp)
                        return self._duplicate(producer_group, [dup], False, [(first, pos)])
            else:
                seconds = 0.0  # no usable key: stored as it is
        producer_topic = topic
        # As RocketMQ 4.6+: a stored message names its cluster (a request's responder replies to
        # <CLUSTER>_REPLY_TOPIC through it).
        props[_CLUSTER] = b.settings.cluster
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            routed = self._route_retry(topic, queue_id, reconsume_times, max_reconsume_times, props)
            if isinstance(routed, Outcome):
                return routed
            topic, queue_id = routed
        msg = MessageInner(
            topic,
            body,
            queue_id,
            flag,
            props,
            sys_flag,
            born_timestamp,
            born_host(peer),
            b.store_host,
            reconsume_times,
        )
        send = self._hooked(peer, producer_group, [msg], False, len(body))
        if type(send) is Send:
            try:  # a timer (TIMER_* properties) parks it in rmq_sys_wheel_timer; a half's is checked
                b.timers.rewrite(msg)
            except TimerRefused as exc:
                return Outcome(Status(exc.code), exc.remark)
            if TIMER_OUT_MS in props:  # a parked timer message: its answer carries the recall handle
                send.recall_handle = b.timers.recall_handle(msg)
            # A transaction's half message goes to RMQ_SYS_TRANS_HALF_TOPIC, a delayed one to
            # SCHEDULE_TOPIC_XXXX: after the hooks, so they judge the topic the producer named.
            if is_half_request(props, sys_flag):
                b.transactions.to_half(msg)
            elif Prop.DELAY_TIME_LEVEL in props:  # what rewrite acts on
                b.schedule.rewrite(msg)
            if seconds > 0:
                send.dedup = window.record(producer_topic, hashes_of([key]), send, seconds)
        return send

    def _duplicate(
        self, producer_group: str, msgs: list[MessageInner], batch: bool, refs: list[tuple[Sent, int]]
    ) -> Send:
        """A send answered from the window: never put; settled from its first copies."""
        send = Send(producer_group, msgs, batch, None, msgs[0].queue_id, 0)
        send.dedup = Duplicate(refs)
        return send

    def _route_retry(
        self, topic: str, queue_id: int, reconsume_times: int, max_reconsume: int, properties: dict[str, str]
    ) -> tuple[str, int] | Outcome:
        """A message re-sent to a retry topic goes to the DLQ once it used up its retries."""
        b = self.broker
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None:
            return Outcome(Status.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        limit = max_reconsume if max_reconsume >= 0 else group_cfg.retry_max_times
        if reconsume_times >= limit:
            dlq = dlq_topic(group)
            b.topics.create_in_send_back(dlq, 1, PERM_WRITE)
            properties.pop(Prop.DELAY_TIME_LEVEL, None)
            return dlq, 0
        return topic, queue_id

    def prepare_batch(
        self,
        peer: Connection,
        producer_group: str,
        topic: str,
        queue_id: int,
        sys_flag: int,
        default_topic: str,
        default_queue_nums: int,
        reconsume_times: int,
        born_timestamp: int,
        body: bytes,
    ) -> Send | Outcome:
        """A batch body's messages (SEND_BATCH_MESSAGE), stored by one put."""
        b = self.broker
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return Outcome(Status.MESSAGE_ILLEGAL, "batch request does not support retry group " + topic)
        cfg = self.check_topic(topic, default_topic, default_queue_nums, queue_id, sys_flag)
        if isinstance(cfg, Outcome):
            return cfg
        if queue_id < 0:
            queue_id = _random.randrange(max(cfg.write_queue_nums, 1))
        try:
            msgs = decode_batch_messages(
                body,
                b.settings.max_batch_messages,
                topic,
                queue_id,
                sys_flag,
                born_timestamp,
                born_host(peer),
                b.store_host,
                reconsume_times,
            )
        except BatchLimitError as exc:
            return Outcome(Status.MESSAGE_ILLEGAL, f"{exc} (max_batch_messages)")
        except CorruptDataError as exc:
            return Outcome(Status.MESSAGE_ILLEGAL, f"malformed batch body: {exc}")
        if not msgs:
            return Outcome(Status.MESSAGE_ILLEGAL, "the batch holds no message")
        # The duplicate window (issue 37): each message on its own key, when every one has one.
        window = b.dedup
        seconds, content = window.topic_settings(topic, cfg)
        keys: list[str] | None = None
        hashes = None
        if seconds > 0:
            if content:
                keys = [content_key(m.flag, m.body, m.properties) for m in msgs]
                if len(set(keys)) != len(keys):
                    keys = None  # twice the same content in one batch: stored as it is
                else:
                    hashes = hashes_of(keys)
            else:  # keys, their hashes and any repeat, in one pass (compiled when built)
                found = batch_keys(msgs, UNIQ_KEY, MAX_KEY_LENGTH)
                if found is not None:  # else a message without a usable key: stored as it is
                    keys, hashes, repeated = found
                    if repeated >= 0:
                        return Outcome(Status.MESSAGE_ILLEGAL, _repeated_key(keys))
            if (
                keys is not None
                and hashes is not None
                and (hits := window.check_many(topic, hashes)) is not None
                and any(h is not None for h in hits)
            ):
                if not content:  # a key reused for another body is not a resend
                    for i, h in enumerate(hits):
                        if h is not None and not window.same_body(
                            h, h.position(keys[i]), msgs[i].body, b.store
                        ):
                            hits[i] = None
                if any(h is not None for h in hits):
                    dropped = sum(h is not None for h in hits)
                    window.count_dropped(topic, dropped)
                    if dropped == len(keys):
                        refs = [(h, h.position(k)) for h, k in zip(hits, keys, strict=True) if h is not None]
                        return self._duplicate(producer_group, msgs, True, refs)
                    # Some were stored before: only the others are stored (and answered).
                    msgs = [m for m, h in zip(msgs, hits, strict=True) if h is None]
                    keys = [k for k, h in zip(keys, hits, strict=True) if h is None]
                    hashes = hashes_of(keys)
        send = self._hooked(peer, producer_group, msgs, True, len(body))
        if type(send) is Send:
            try:  # a timer on any message parks the batch in rmq_sys_wheel_timer, each until its time
                b.timers.rewrite_batch(msgs)
            except TimerRefused as exc:
                return Outcome(Status(exc.code), exc.remark)
            if keys is not None:
                send.dedup = window.record(
                    topic, hashes if hashes is not None else hashes_of(keys), send, seconds
                )
        return send

    def prepare_reply(
        self,
        peer: Connection,
        producer_group: str,
        topic: str,
        queue_id: int,
        sys_flag: int,
        default_topic: str,
        default_queue_nums: int,
        properties: str,
        reconsume_times: int,
        flag: int,
        born_timestamp: int,
        body: bytes,
    ) -> Send | Outcome:
        """A responder's reply (SEND_REPLY_MESSAGE): checked and hooked as a send, to store or push."""
        b = self.broker
        if not body:
            return Outcome(Status.MESSAGE_ILLEGAL, "the reply has no body")
        if len(body) > b.settings.max_message_size:
            return Outcome(
                Status.MESSAGE_ILLEGAL,
                f"the reply body is {len(body)} bytes, over max_message_size {b.settings.max_message_size}",
            )
        cfg = self.check_topic(topic, default_topic, default_queue_nums, queue_id, sys_flag)
        if isinstance(cfg, Outcome):
            return cfg
        if queue_id < 0:
            queue_id = _random.randrange(max(cfg.write_queue_nums, 1))
        msg = MessageInner(
            topic,
            bytes(body),
            queue_id,
            flag,
            string_to_properties(properties),
            sys_flag,
            born_timestamp,
            born_host(peer),
            b.store_host,
            reconsume_times,
        )
        send = self._hooked(peer, producer_group, [msg], False, len(body))
        if type(send) is Send:
            try:  # a stored reply with a timer waits in rmq_sys_wheel_timer (the push goes now)
                b.timers.rewrite(msg)
            except TimerRefused as exc:
                return Outcome(Status(exc.code), exc.remark)
        return send

    def _hooked(
        self, peer: Connection, group: str, msgs: list[MessageInner], batch: bool, nbytes: int
    ) -> Send | Outcome:
        """``tidemq_before_send`` for one send: the send, or the refusal of its veto."""
        b = self.broker
        first = msgs[0]
        hooks = b.hooks
        # A context and two hook calls per send cost ~5 % of a send: build them only when a plugin
        # listens (checked per send, so a plugin registered at run time is seen at once).
        ctx: SendContext | None = None
        if self._listened():
            ctx = SendContext(
                producer_group=group,
                topic=first.topic,
                queue_id=first.queue_id,
                properties=first.properties,
                body_size=sum(len(m.body) for m in msgs),
                client_address=peer.remote_address,
                broker_address=b.address,
            )
            if batch:
                ctx.extra["batch_size"] = len(msgs)
            veto = hooks.tidemq_before_send(context=ctx)
            if veto is not None:
                ctx.status = "NO_PERMISSION"
                hooks.tidemq_after_send(context=ctx)
                return Outcome(Status.NO_PERMISSION, str(veto))
        return Send(group, msgs, batch, ctx, first.queue_id, nbytes)

    # ------------------------------------------------------------------ step 2: put
    def put(self, sends: list[Send]) -> None:
        """Store the sends of one read: grouped per (topic, queue, transaction type) of their final
        destination, in order, one put per group (cut at :data:`GROUP_MAX_BYTES`: a group cut is
        put before the others, in the order cut); a batch send's messages stay together, in its
        place among them.  The puts go to the store in one call where it offers that
        (:func:`~tidemq.broker.services.put.store_groups`)."""
        groups: dict[tuple[str, int, int], PutGroup] = {}
        full: list[PutGroup] = []  # groups cut at GROUP_MAX_BYTES, put first, in the order cut
        for send in sends:
            if type(send.dedup) is Duplicate:  # answered from the window, not stored
                continue
            first = send.msgs[0]
            key = (first.topic, first.queue_id, first.sys_flag & TRANSACTION_TYPE_MASK)
            group = groups.get(key)
            if group is None:
                group = groups[key] = PutGroup()
            group.add(send)
            group.nbytes += send.nbytes
            if group.nbytes >= GROUP_MAX_BYTES:
                del groups[key]
                full.append(group)
        if full:
            full.extend(groups.values())
            store_groups(self.broker, full)
        elif groups:
            store_groups(self.broker, list(groups.values()))

    def put_one(self, send: Send) -> None:
        """Store one send on its own."""
        if type(send.dedup) is Duplicate:  # answered from the window, not stored
            return
        group = PutGroup()
        group.add(send)
        store_group(self.broker, group)

    # ------------------------------------------------------------------ step 3: outcome
    #: ``settled(send)``: whether ``send``'s outcome is known now (then filled in: its put and
    #: replicas are done already, async flush: nearly every send), without a coroutine; False:
    #: :meth:`settle` it.  Bound in ``__init__``: one call per send, no wrapper.
    settled: Callable[[Send], bool]

    def settled_many(self, sends: list[Send], done: list[bool]) -> None:
        """:attr:`settled` of each send whose ``done`` is False, ``done`` set to its answer; each
        put's outcome asked once (the sends of one request share a few puts)."""
        settled_many(self.broker, sends, done)

    async def settle(self, send: Send) -> Send:
        """Wait for ``send``'s put and replicas; ``send``, its outcome filled in."""
        await settle(self.broker, send)
        return send

    # ------------------------------------------------------------------ send back
    async def send_back(
        self, group: str, offset: int, delay_level: int, max_reconsume_times: int, origin_msg_id: str
    ) -> Outcome:
        """A consumer failed the message at commit-log ``offset``: store a copy in %RETRY%group (or
        %DLQ%group when its retries are used up; CONSUMER_SEND_MSG_BACK).

        The copy carries the DELAY property with a level that grows with each retry, as RocketMQ
        does; the schedule service delivers it when that level's delay has passed.
        """
        b = self.broker
        problem = check_group_name(group)
        if problem:  # the group names the retry and dead-letter topics (and their directories)
            return Outcome(Status.SYSTEM_ERROR, problem)
        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None:
            return Outcome(Status.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        if group_cfg.retry_queue_nums <= 0:
            return DONE
        raw = b.store.look_message_by_offset(offset)
        if raw is None:
            return Outcome(Status.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        try:
            ext = decode_message(raw)
        except CorruptDataError as exc:
            return Outcome(Status.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}")
        props = dict(ext.properties)
        props.setdefault(Prop.RETRY_TOPIC, ext.topic)
        props.pop(Prop.WAIT_STORE_MSG_OK, None)
        max_reconsume = max_reconsume_times
        if max_reconsume < 0:
            max_reconsume = group_cfg.retry_max_times
        if ext.reconsume_times >= max_reconsume or delay_level < 0:
            topic = dlq_topic(group)
            b.topics.create_in_send_back(topic, 1, PERM_WRITE)
            queue_id = 0
            props.pop(Prop.DELAY_TIME_LEVEL, None)
        else:
            topic = retry_topic(group)
            cfg = b.topics.create_in_send_back(topic, group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE)
            queue_id = _random.randrange(max(cfg.write_queue_nums, 1))
            if delay_level == 0:
                delay_level = 3 + ext.reconsume_times
            props[Prop.DELAY_TIME_LEVEL] = str(delay_level)
        props.setdefault(Prop.ORIGIN_MESSAGE_ID, origin_msg_id or ext.uniq_key or ext.msg_id)
        msg = MessageInner(
            topic=topic,
            body=ext.body,
            queue_id=queue_id,
            flag=ext.flag,
            properties=props,
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=ext.born_host,
            store_host=b.store_host,
            reconsume_times=ext.reconsume_times + 1,
        )
        b.schedule.rewrite(msg)  # retries wait in the delay levels (issue 10)
        result = await resolved(b.store.put_message(msg))
        if not result.ok:
            return Outcome(Status.SYSTEM_ERROR, f"{result.status.value} {result.error}".strip())
        b.stats.on_put(msg.topic, 1, result.wrote_bytes)
        # The retry or dead-letter topic it created is on disk before the answer (a SIGKILL).
        problem = await b.topics.written(topic) if b.topics.unwritten else None
        return DONE if problem is None else Outcome(Status.FLUSH_DISK_TIMEOUT, problem)


def _repeated_key(keys: list[str]) -> str:
    """MESSAGE_ILLEGAL's remark for a batch that gives two messages one UNIQ_KEY."""
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            return (
                f"the batch repeats UNIQ_KEY {key[:64]!r} at messages {seen[key]} and {i}: each message "
                "of a batch needs its own key (the duplicate window keys on it)"
            )
        seen[key] = i
    return "the batch repeats a UNIQ_KEY"
