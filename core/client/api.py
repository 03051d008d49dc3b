"""Requests a client makes to NameServers and brokers (RocketMQ's MQClientAPIImpl).

Each method builds one RemotingCommand with RocketMQ 4.x header field names, sends it through
the transport client and turns the response into Python values or a :class:`BrokerError`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from tidemq.client.errors import BrokerError, ClientError
from tidemq.client.message import PullResult, PullStatus, queue_from_json, queue_to_json
from tidemq.client.route import TopicRoute, loads_lenient
from tidemq.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, Prop, iter_messages
from tidemq.queues import BoundaryType, MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand, stringify_fields
from tidemq.remoting.errors import RemotingError

log = logging.getLogger(__name__)

# PullSysFlag bits.
PULL_FLAG_COMMIT_OFFSET = 1 << 0
PULL_FLAG_SUSPEND = 1 << 1
PULL_FLAG_SUBSCRIPTION = 1 << 2
PULL_FLAG_CLASS_FILTER = 1 << 3
#: In a properties string, what marks a reply (MSG_TYPE=reply, MixAll.REPLY_MESSAGE_FLAG).
_REPLY_MARK = f"{PROPERTY_SEPARATOR}{Prop.MESSAGE_TYPE}{NAME_VALUE_SEPARATOR}reply{PROPERTY_SEPARATOR}"


def _check(resp: RemotingCommand, addr: str, ok: Iterable[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
    if resp.code not in tuple(ok):
        raise BrokerError(resp.code, resp.remark, addr)
    return resp


def _int(resp: RemotingCommand, key: str, default: int = 0) -> int:
    value = (resp.ext_fields or {}).get(key)
    return int(value) if value not in (None, "") else default


class ClientAPI:
    """Typed calls over a transport client; ``timeout`` in seconds."""

    def __init__(self, remoting: Any, namesrv: Sequence[str], timeout: float = 3.0) -> None:
        if not namesrv:
            raise ClientError("no NameServer address given (namesrv='host:port;host:port')")
        self.remoting = remoting
        self.namesrv = list(namesrv)
        self.timeout = timeout
        self._ns_turn = itertools.count()

    async def invoke(
        self, addr: str, request: RemotingCommand, timeout: float | None = None
    ) -> RemotingCommand:
        return await self.remoting.invoke(addr, request, self.timeout if timeout is None else timeout)

    # ------------------------------------------------------------------ NameServer
    async def get_route(self, topic: str, timeout: float | None = None) -> TopicRoute | None:
        """The topic's route, or None when no NameServer knows it."""
        start = next(self._ns_turn)
        last: Exception | None = None
        for i in range(len(self.namesrv)):
            addr = self.namesrv[(start + i) % len(self.namesrv)]
            req = RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, stringify_fields({"topic": topic})
            )
            try:
                resp = await self.invoke(addr, req, timeout)
            except RemotingError as exc:
                log.warning("NameServer %s unreachable: %s", addr, exc)
                last = exc
                continue
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            _check(resp, addr)
            if not resp.body:
                return None
            return TopicRoute.from_json(topic, resp.body)
        raise ClientError(f"no NameServer answered for topic {topic!r}: {last}")

    # ------------------------------------------------------------------ producing
    async def send(
        self,
        addr: str,
        header: Mapping[str, Any],
        body: bytes,
        *,
        batch: bool = False,
        oneway: bool = False,
        timeout: float | None = None,
    ) -> RemotingCommand | None:
        """SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE with the short V2 header field names."""
        v2 = {
            "a": header["producerGroup"],
            "b": header["topic"],
            "c": header.get("defaultTopic", "TBW102"),
            "d": header.get("defaultTopicQueueNums", 4),
            "e": header["queueId"],
            "f": header.get("sysFlag", 0),
            "g": header["bornTimestamp"],
            "h": header.get("flag", 0),
            "i": header.get("properties", ""),
            "j": header.get("reconsumeTimes", 0),
            "k": header.get("unitMode", False),
            "l": header.get("maxReconsumeTimes"),
            "m": batch,
        }
        if batch:
            code = RequestCode.SEND_BATCH_MESSAGE
        elif _REPLY_MARK in v2["i"] or v2["i"].startswith(_REPLY_MARK[1:]):
            # A reply (MSG_TYPE=reply) goes with the code RocketMQ's client sends it with.
            code = RequestCode.SEND_REPLY_MESSAGE_V2
        else:
            code = RequestCode.SEND_MESSAGE_V2
        req = RemotingCommand.request(code, stringify_fields(v2), body)
        if oneway:
            req.mark_oneway()
            await self.remoting.invoke_oneway(addr, req)
            return None
        return await self.invoke(addr, req, timeout)

    async def heartbeat(self, addr: str, data: Mapping[str, Any]) -> None:
        req = RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(data))
        _check(await self.invoke(addr, req), addr)

    async def unregister_client(
        self, addr: str, client_id: str, producer_group: str = "", consumer_group: str = ""
    ) -> None:
        fields = stringify_fields(
            {
                "clientID": client_id,
                "producerGroup": producer_group or None,
                "consumerGroup": consumer_group or None,
            }
        )
        req = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, fields)
        _check(await self.invoke(addr, req), addr)

    # ------------------------------------------------------------------ consuming
    async def pull(
        self,
        addr: str,
        *,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        sys_flag: int,
        commit_offset: int,
        suspend_ms: int,
        subscription: str,
        sub_version: int,
        expression_type: str,
        timeout: float,
    ) -> PullResult:
        fields = stringify_fields(
            {
                "consumerGroup": group,
                "topic": mq.topic,
                "queueId": mq.queue_id,
                "queueOffset": offset,
                "maxMsgNums": max_nums,
                "sysFlag": sys_flag,
                "commitOffset": commit_offset,
                "suspendTimeoutMillis": suspend_ms,
                "subscription": subscription,
                "subVersion": sub_version,
                "expressionType": expression_type,
            }
        )
        resp = await self.invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, fields), timeout)
        statuses: dict[int, PullStatus] = {
            ResponseCode.SUCCESS: PullStatus.FOUND,
            ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
            ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
            ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
        }
        status = statuses.get(resp.code)
        if status is None:
            raise BrokerError(resp.code, resp.remark, addr)
        payload = resp.payload() if status is PullStatus.FOUND else b""
        messages = list(iter_messages(payload)) if payload else []
        return PullResult(
            status=status,
            next_begin_offset=_int(resp, "nextBeginOffset", offset),
            min_offset=_int(resp, "minOffset"),
            max_offset=_int(resp, "maxOffset"),
            messages=messages,
            suggest_broker_id=_int(resp, "suggestWhichBrokerId"),
        )

    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue) -> int:
        """The committed offset, or -1 when the group never committed one for the queue."""
        fields = stringify_fields({"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id})
        resp = await self.invoke(addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, fields))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        return _int(_check(resp, addr), "offset", -1)

    async def update_consumer_offset(self, addr: str, group: str, mq: MessageQueue, offset: int) -> None:
        fields = stringify_fields(
            {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": offset}
        )
        _check(
            await self.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields)), addr
        )

    async def _queue_offset(self, code: int, addr: str, mq: MessageQueue, **extra: Any) -> int:
        fields = stringify_fields({"topic": mq.topic, "queueId": mq.queue_id, **extra})
        return _int(_check(await self.invoke(addr, RemotingCommand.request(code, fields)), addr), "offset")

    async def get_max_offset(self, addr: str, mq: MessageQueue) -> int:
        return await self._queue_offset(RequestCode.GET_MAX_OFFSET, addr, mq)

    async def get_min_offset(self, addr: str, mq: MessageQueue) -> int:
        return await self._queue_offset(RequestCode.GET_MIN_OFFSET, addr, mq)

    async def search_offset(
        self, addr: str, mq: MessageQueue, timestamp_ms: int, boundary_type: BoundaryType = BoundaryType.LOWER
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the queue offset of ``mq`` at ``timestamp_ms``; of several
        messages stored at that time, the first (LOWER) or the last (UPPER).  The field is sent
        as Java's ``DefaultMQAdminExt.searchOffset`` sends it; a broker before RocketMQ 5 ignores it
        (LOWER)."""
        return await self._queue_offset(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            addr,
            mq,
            timestamp=timestamp_ms,
            boundaryType=BoundaryType(boundary_type).value,
        )

    async def get_consumer_ids(self, addr: str, group: str) -> list[str]:
        req = RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, stringify_fields({"consumerGroup": group})
        )
        resp = await self.invoke(addr, req)
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            raise BrokerError(resp.code, resp.remark, addr)
        return [str(c) for c in loads_lenient(resp.body).get("consumerIdList") or []]

    async def send_back(
        self,
        addr: str,
        *,
        group: str,
        commit_log_offset: int,
        delay_level: int,
        origin_msg_id: str,
        origin_topic: str,
        max_reconsume_times: int,
    ) -> None:
        fields = stringify_fields(
            {
                "offset": commit_log_offset,
                "group": group,
                "delayLevel": delay_level,
                "originMsgId": origin_msg_id,
                "originTopic": origin_topic,
                "unitMode": False,
                "maxReconsumeTimes": max_reconsume_times,
            }
        )
        _check(
            await self.invoke(addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, fields)), addr
        )

    async def lock_batch(
        self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue]
    ) -> set[MessageQueue]:
        body = orjson.dumps(
            {"consumerGroup": group, "clientId": client_id, "mqSet": [queue_to_json(q) for q in mqs]}
        )
        resp = _check(
            await self.invoke(addr, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, {}, body)), addr
        )
        data = loads_lenient(resp.body) if resp.body else {}
        return {queue_from_json(q) for q in data.get("lockOKMQSet") or []}

    async def unlock_batch(self, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue]) -> None:
        body = orjson.dumps(
            {"consumerGroup": group, "clientId": client_id, "mqSet": [queue_to_json(q) for q in mqs]}
        )
        _check(await self.invoke(addr, RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, {}, body)), addr)
