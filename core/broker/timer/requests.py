"""The timer's requests: GET_TIMER_CHECK_POINT (60), GET_TIMER_METRICS (61), RECALL_MESSAGE (370)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from tidemq.broker.timer.checkpoint import TimerCheckpoint
from tidemq.broker.timer.parking import TimerParking
from tidemq.broker.timer.properties import TIMER_DEL_UNIQKEY, TIMER_TOPIC, TimerRefused
from tidemq.broker.timer.recall import RECALL_TAG, decode_handle, delete_key
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.futures import resolved
from tidemq.message import MessageInner, Prop
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

#: GET_TIMER_CHECK_POINT's body: TimerCheckpoint.encode, seven big-endian longs.
_CHECKPOINT = struct.Struct(">7q")


class TimerRequests:
    """Serves the three timer requests from the schedule, the put side and the checkpoint."""

    def __init__(
        self,
        broker: BrokerContext,
        schedule: TimerSchedule,
        parking: TimerParking,
        checkpoint: Callable[[], TimerCheckpoint | None],
    ) -> None:
        self.broker = broker
        self.schedule = schedule
        self.parking = parking
        self._checkpoint = checkpoint

    async def get_timer_check_point(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """GET_TIMER_CHECK_POINT (60): RocketMQ's 56-byte TimerCheckpoint encoding (seven longs)."""
        cp = self._checkpoint()
        if cp is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, "The checkpoint is null")
        body = _CHECKPOINT.pack(
            cp.last_read_time_ms,
            cp.last_timer_log_flush_pos,
            cp.last_timer_queue_offset,
            cp.last_timer_queue_offset,  # masterTimerQueueOffset: this broker's own
            0,  # dataVersion.stateVersion
            now_ms(),  # dataVersion.timestamp
            self.schedule.checkpoints_written,  # dataVersion.counter
        )
        return request.reply(ResponseCode.SUCCESS, body=body)

    async def get_timer_metrics(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """GET_TIMER_METRICS (61): RocketMQ's TimerMetricsSerializeWrapper (timing count per topic)."""
        now = now_ms()
        body = {
            "dataVersion": {
                "counter": self.schedule.checkpoints_written,
                "stateVersion": 0,
                "timestamp": now,
            },
            "timingCount": {
                topic: {"count": n, "timeStamp": now} for topic, n in sorted(self.schedule.timing.items())
            },
        }
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))

    async def recall_message(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """RECALL_MESSAGE (370, RocketMQ 5.5): park a delete marker due with the message it names.

        Answers as RocketMQ's RecallMessageProcessor: ILLEGAL_OPERATION for a bad handle, another
        topic or broker, or a time already passed (the message was delivered); SUCCESS otherwise,
        also for a message already recalled or never sent (the marker then cancels nothing).
        """
        b = self.broker
        s = self.schedule
        fields = request.ext_fields or {}
        topic = str(fields.get("topic", ""))
        if not b.is_master:
            return request.reply(
                ResponseCode.SLAVE_NOT_AVAILABLE, "recall failed, broker service not available"
            )
        if b.topics.get(topic) is None:
            return request.reply(ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist")
        try:
            handle = decode_handle(str(fields.get("recallHandle", "")))
        except ValueError as exc:
            return request.reply(ResponseCode.ILLEGAL_OPERATION, str(exc))
        if handle.topic != topic:
            return request.reply(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker_name != b.settings.name:
            return request.reply(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available"
            )
        try:
            left = int(handle.timestamp) - now_ms()
        except ValueError:
            left = -1
        due_tick = int(handle.timestamp) // s.precision_ms if left > 0 else 0
        if left <= 0 or left >= s.max_delay_sec * 1000 or due_tick <= s.claimed_tick:
            # Its tick is being (or was) delivered: too late, as for a time already passed.
            return request.reply(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        now = now_ms()
        marker = MessageInner(
            topic=topic,
            body=b"0",
            queue_id=0,
            properties={
                Prop.TAGS: RECALL_TAG,
                TIMER_DEL_UNIQKEY: delete_key(topic, handle.message_id),
                Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: handle.message_id,
                "TIMER_DELIVER_MS": handle.timestamp,
                Prop.PRODUCER_GROUP: str(fields.get("producerGroup", "")),
            },
            born_timestamp=now,
            born_host=b.store_host,
            store_host=b.store_host,
        )
        try:
            parked = self.parking.rewrite(marker)
        except TimerRefused:
            parked = False
        if not parked:
            return request.reply(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        s.recalls_in_flight += 1
        try:
            result = await resolved(b.store.put_message(marker))
            if not result.ok:
                return request.reply(ResponseCode.SYSTEM_ERROR, "recall failed, execute error")
            # Answer once the marker is in the wheel: a recall answered SUCCESS cancels for sure.
            deadline = time.monotonic() + 2 * s.precision_ms / 1000
            while s.queue_offset <= result.queue_offset and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        finally:
            s.recalls_in_flight -= 1
        b.stats.on_put(TIMER_TOPIC, 1, result.wrote_bytes)
        return request.reply_with(ResponseCode.SUCCESS, None, {"msgId": handle.message_id})
