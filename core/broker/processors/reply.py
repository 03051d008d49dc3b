"""SEND_REPLY_MESSAGE and SEND_REPLY_MESSAGE_V2 (RocketMQ 4.6+'s ReplyMessageProcessor).

A responder sends its reply with one of the two codes (V2 with the short header names of
SEND_MESSAGE_V2).  The broker finds the requester's connection by the reply's ``REPLY_TO_CLIENT``
property among the connected producers (the requester heartbeats as a producer), pushes the reply
to it with PUSH_REPLY_MESSAGE_TO_CLIENT (326) and, when ``store_reply_message_enable`` is on,
also stores it in its topic (``<cluster>_REPLY_TOPIC``).

The answer to the responder follows RocketMQ: SUCCESS when the push succeeded (message id ``0``
unless the reply was also stored), SYSTEM_ERROR with a remark naming the requester when it could
not be pushed (requester gone, no ``REPLY_TO_CLIENT``, push failed); the reply is stored either way
when storing is on.  The reply goes through the send processor's topic checks, the send hooks and
the put statistics like any send.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tidemq.broker.clients import ClientChannel
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import DEFAULT_TOPIC, HeaderFieldError, field_int, field_str
from tidemq.broker.processors.answers import answer
from tidemq.broker.processors.send import send_fields
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.put import STORED, Send
from tidemq.broker.services.send import SendService, born_host
from tidemq.broker.services.status import Outcome
from tidemq.message import MessageInner, Prop, properties_to_string
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)

_WHAT = "SEND_REPLY_MESSAGE"
#: How long the push to the requester may take (RocketMQ's callClient waits 10 s; a responder's
#: own send times out after 3 s by default, so waiting longer helps nobody).
PUSH_TIMEOUT_S = 3.0
#: A requester that cannot be reached is logged at most this often (with a count in between):
#: a requester gone while responders still answer it must not flood the log.
LOG_EVERY_S = 10.0


class ReplyProcessor:
    """Pushes replies to their requesters and stores them (see the module docstring)."""

    def __init__(self, broker: BrokerContext, sends: SendService) -> None:
        self.broker = broker
        self.sends = sends  # its topic checks and send hooks, shared with SEND_MESSAGE
        #: client id -> (producer group, channel) found last time: a lookup is a scan otherwise.
        self._channels: dict[str, tuple[str, ClientChannel]] = {}
        #: Replies answered "requester not found / push failed", and replies pushed.
        self.not_delivered = 0
        self.pushed = 0
        self._suppressed = 0
        self._logged_at = 0.0

    # ------------------------------------------------------------------ requester lookup
    def find_channel(self, client_id: str) -> ClientChannel | None:
        """The open connection of producer client ``client_id`` (ProducerManager.findChannel)."""
        producers = self.broker.producers
        cached = self._channels.get(client_id)
        if cached is not None:
            group, ch = cached
            if not ch.conn.closed and producers.groups.get(group, {}).get((ch.conn, ch.client_id)) is ch:
                return ch
            del self._channels[client_id]
        for group, channels in producers.groups.items():
            for ch in channels.values():
                if ch.client_id == client_id and not ch.conn.closed:
                    if len(self._channels) >= 65536:
                        self._channels.clear()
                    self._channels[client_id] = (group, ch)
                    return ch
        return None

    def _warn(self, text: str) -> None:
        """Log a failed push, at most once per :data:`LOG_EVERY_S`."""
        self.not_delivered += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more like it since the last report)" if self._suppressed else ""
        self._logged_at, self._suppressed = now, 0
        log.warning("%s%s", text, more)

    # ------------------------------------------------------------------ 324 / 325
    async def send_reply(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            prepared = self._prepare(conn, request)
        except HeaderFieldError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        if isinstance(prepared, RemotingCommand):
            return prepared
        send, fields = prepared
        msg = send.msgs[0]
        stored: Send | None
        if self.broker.settings.store_reply_message_enable:
            # Stored while the push runs: both happen whatever the other's outcome.
            self.sends.put_one(send)
            pushed, remark = await self._push(conn, msg, fields)
            if not self.sends.settled(send):
                await self.sends.settle(send)
            stored = send
        else:
            pushed, remark = await self._push(conn, msg, fields)
            stored = None
            if send.ctx is not None:  # the hooks see every reply, stored or not
                send.ctx.status = "SUCCESS" if pushed else "SYSTEM_ERROR"
                self.broker.hooks.tidemq_after_send(context=send.ctx)
        return self._answer(request, msg, pushed, remark, stored)

    def _prepare(
        self, conn: Connection, request: RemotingCommand
    ) -> tuple[Send, dict[str, Any]] | RemotingCommand:
        """The header read and checked, the reply to store: as SEND_MESSAGE checks a send."""
        fields, keys = send_fields(request)
        get = fields.get
        group = field_str(get(keys[1]), "producerGroup", _WHAT)
        topic = field_str(get(keys[2]), "topic", _WHAT)
        queue_id = field_int(get(keys[3]), "queueId", _WHAT)
        sys_flag = field_int(get(keys[4]), "sysFlag", _WHAT)
        default_topic = field_str(get(keys[5]), "defaultTopic", _WHAT, DEFAULT_TOPIC)
        default_queues = field_int(get(keys[6]), "defaultTopicQueueNums", _WHAT, 4)
        props_text = field_str(get(keys[7]), "properties", _WHAT, "")
        reconsume_times = field_int(get(keys[8]), "reconsumeTimes", _WHAT, 0)
        flag = field_int(get(keys[10]), "flag", _WHAT)
        born_ts = field_int(get(keys[11]), "bornTimestamp", _WHAT)
        send = self.sends.prepare_reply(
            conn,
            group,
            topic,
            queue_id,
            sys_flag,
            default_topic,
            default_queues,
            props_text,
            reconsume_times,
            flag,
            born_ts,
            request.payload() or b"",
        )
        if isinstance(send, Outcome):
            return answer(request, send)
        push_fields = {
            "producerGroup": group,
            "topic": topic,
            "defaultTopic": default_topic,
            "defaultTopicQueueNums": str(default_queues),
            "queueId": str(field_int(get(keys[3]), "queueId", _WHAT)),  # as the responder asked
            "sysFlag": str(sys_flag),
            "bornTimestamp": str(born_ts),
            "flag": str(flag),
            "reconsumeTimes": str(reconsume_times),
            "unitMode": "false",
        }
        return send, push_fields

    async def _push(self, conn: Connection, msg: MessageInner, fields: dict[str, Any]) -> tuple[bool, str]:
        """PUSH_REPLY_MESSAGE_TO_CLIENT to the requester: (pushed, remark when not)."""
        sender = msg.properties.get(Prop.REPLY_TO_CLIENT)
        if sender is None:
            remark = f"reply message properties[{Prop.REPLY_TO_CLIENT}] is null"
            self._warn(remark)
            return False, remark
        ch = self.find_channel(sender)
        if ch is None:
            remark = f"push reply message fail, channel of <{sender}> not found."
            self._warn(remark)
            return False, remark
        props = dict(msg.properties)
        props[Prop.PUSH_REPLY_TIME] = str(int(time.time() * 1000))
        host, port = born_host(conn)
        store_host, store_port = self.broker.store_host
        header = {
            **fields,
            "properties": properties_to_string(props),
            "bornHost": f"{host}:{port}",
            "storeHost": f"{store_host}:{store_port}",
            "storeTimestamp": str(int(time.time() * 1000)),
        }
        push = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, header, msg.body)
        try:
            response = await ch.conn.invoke(push, PUSH_TIMEOUT_S)
        except Exception as exc:  # the requester went away during the push, or is stuck
            remark = f"push reply message to {sender} fail."
            self._warn(f"{remark} {type(exc).__name__}: {exc}")
            return False, remark
        if response.code != ResponseCode.SUCCESS:
            remark = f"push reply message to {sender} fail."
            self._warn(f"{remark} The requester answered {response.code}: {response.remark}")
            return False, remark
        self.pushed += 1
        return True, ""

    def _answer(
        self,
        request: RemotingCommand,
        msg: MessageInner,
        pushed: bool,
        remark: str,
        stored: Send | None,
    ) -> RemotingCommand:
        """The push decides the code; a stored reply's id and offset go in the header."""
        header = {
            "msgId": "0",
            "queueId": str(msg.queue_id),
            "queueOffset": "0",
            "MSG_REGION": msg.properties.get(Prop.MSG_REGION, "DefaultRegion"),
            "TRACE_ON": msg.properties.get(Prop.TRACE_SWITCH, "true"),
        }
        stored_ok = stored is not None and stored.status in STORED
        if stored is not None and stored_ok:
            header["msgId"] = stored.msg_id
            header["queueOffset"] = str(stored.queue_offset)
        elif stored is not None:
            log.debug("reply to %s not stored: %s %s", msg.topic, stored.status, stored.remark)
        if not pushed:
            return request.reply_with(ResponseCode.SYSTEM_ERROR, remark, header if stored_ok else {})
        return request.reply_with(ResponseCode.SUCCESS, None, header)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    p = ReplyProcessor(register.context, services.send)
    register.add(RequestCode.SEND_REPLY_MESSAGE, p.send_reply)
    register.add(RequestCode.SEND_REPLY_MESSAGE_V2, p.send_reply)
