"""Requests and output helpers shared by the statistics, queue and message commands
(:mod:`tidemq.admin.stats`, :mod:`tidemq.admin.messages`) and the first commands
(:mod:`tidemq.admin.commands`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import click

from tidemq import mqjson
from tidemq.admin._common import PRODUCER_GROUP
from tidemq.client.admin import AdminClient, AdminError
from tidemq.client.route import TopicRoute
from tidemq.message import MessageExt, Prop, iter_messages, properties_to_string
from tidemq.remoting.codes import RequestCode, ResponseCode

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
PULL_OK = (
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.PULL_OFFSET_MOVED,
)


def readable(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """An answer in a shape the command cannot read (a field missing, not a number...) becomes one
    ``AdminError`` line instead of a traceback."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            await fn(*args, **kwargs)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise AdminError(f"cannot read the broker's answer ({type(exc).__name__}: {exc})") from None

    return wrapper


# ---------------------------------------------------------------------- shared requests
def json_body(body: bytes | None, what: str) -> Any:
    """A response body as JSON (fastjson's quirks accepted); an unreadable one is an AdminError."""
    try:
        data = mqjson.loads(body or b"{}")
    except mqjson.MQJsonError as exc:
        raise AdminError(f"cannot read the {what} answer: {exc}") from None
    if not isinstance(data, dict):
        raise AdminError(f"cannot read the {what} answer: not a JSON object")
    return data


async def runtime_info(client: AdminClient, addr: str) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO's table of one broker."""
    resp = await client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    table = json_body(resp.body, "GET_BROKER_RUNTIME_INFO").get("table")
    if not isinstance(table, dict):
        raise AdminError(f"{addr} answered GET_BROKER_RUNTIME_INFO without a table")
    return {str(k): str(v) for k, v in table.items()}


async def stats_data(client: AdminClient, addr: str, name: str, key: str) -> dict[str, Any] | None:
    """VIEW_BROKER_STATS_DATA (BrokerStatsData), None when the broker has no such item."""
    resp = await client.call(
        addr,
        RequestCode.VIEW_BROKER_STATS_DATA,
        {"statsName": name, "statsKey": key},
        ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR),
    )
    if resp.code != ResponseCode.SUCCESS:
        return None
    return json_body(resp.body, "VIEW_BROKER_STATS_DATA")


def sum_24h(data: dict[str, Any]) -> int:
    """StatsAllSubCommand.compute24HourSum: the day's sum, else the hour's, else the minute's."""
    for window in ("statsDay", "statsHour", "statsMinute"):
        total = int((data.get(window) or {}).get("sum", 0))
        if total:
            return total
    return 0


async def consumers_of(client: AdminClient, addr: str, topic: str) -> list[str]:
    """QUERY_TOPIC_CONSUME_BY_WHO on one broker."""
    resp = await client.call(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic})
    return [str(g) for g in json_body(resp.body, "QUERY_TOPIC_CONSUME_BY_WHO").get("groupList") or []]


async def consume_stats_rows(client: AdminClient, addr: str, group: str, topic: str) -> list[dict[str, Any]]:
    """GET_CONSUME_STATS of ``group`` (on ``topic`` only when given) from one broker, as rows."""
    fields = {"consumerGroup": group, **({"topic": topic} if topic else {})}
    resp = await client.call(addr, RequestCode.GET_CONSUME_STATS, fields)
    return mq_rows(json_body(resp.body, "GET_CONSUME_STATS").get("offsetTable"), "GET_CONSUME_STATS")


def mq_rows(table: Any, what: str) -> list[dict[str, Any]]:
    """A MessageQueue-keyed table as rows (each value with its queue's topic, brokerName and
    queueId), in queue order; an unreadable one is an AdminError."""
    try:
        entries = sorted(mqjson.mq_map(table).items())
    except mqjson.MQJsonError as exc:
        raise AdminError(f"cannot read the {what} answer: {exc}") from None
    rows = []
    for mq, value in entries:
        if not isinstance(value, dict):
            raise AdminError(f"cannot read the {what} answer: the entry of {mq} is not an object")
        rows.append({**value, "topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id})
    return rows


async def pull(
    client: AdminClient, addr: str, topic: str, queue_id: int, offset: int, count: int, sub: str, group: str
) -> tuple[int, int, list[MessageExt]]:
    """One PULL_MESSAGE that commits nothing and does not wait: (code, next offset, messages)."""
    fields = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": count,
        "sysFlag": 4,  # subscription carried in the request, no suspend, no commit
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": sub,
        "subVersion": 0,
        "expressionType": "TAG",
    }
    resp = await client.call(addr, RequestCode.PULL_MESSAGE, fields, ok=PULL_OK)
    next_offset = int(resp.ext_fields.get("nextBeginOffset", offset))
    msgs = list(iter_messages(resp.payload())) if resp.code == ResponseCode.SUCCESS else []
    return resp.code, next_offset, msgs


async def queue_offset(
    client: AdminClient, addr: str, topic: str, queue_id: int, code: int, **extra: Any
) -> int:
    """GET_MIN_OFFSET / GET_MAX_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP of one queue."""
    resp = await client.call(addr, code, {"topic": topic, "queueId": queue_id, **extra})
    try:
        return int(resp.ext_fields.get("offset", 0))
    except ValueError:
        raise AdminError(f"{addr} answered {RequestCode(code).name} with a bad offset") from None


def parse_timestamp(value: str) -> int:
    """mqadmin's timestampFormat: ms since the epoch, or ``yyyy-MM-dd#HH:mm:ss:SSS`` local time."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return int(datetime.strptime(value, "%Y-%m-%d#%H:%M:%S:%f").timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither ms since the epoch nor yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None


def decode_text(body: bytes, charset: str) -> str:
    try:
        return body.decode(charset, "replace")
    except LookupError:
        raise AdminError(f"unknown charset {charset!r}") from None


def null_text(value: Any) -> str:
    """A value as Java's string concatenation prints it (null for None)."""
    return "null" if value is None else str(value)


def msg_text(m: MessageExt) -> str:
    """A short MessageExt description (Java prints its toString)."""
    return (
        f"MessageExt [topic={m.topic}, queueId={m.queue_id}, queueOffset={m.queue_offset}, "
        f"storeTimestamp={m.store_timestamp}, bornTimestamp={m.born_timestamp}, tags={m.tags or ''}, "
        f"keys={' '.join(m.keys)}, reconsumeTimes={m.reconsume_times}, properties={m.properties}]"
    )


async def master_of(client: AdminClient, route: TopicRoute, broker_name: str) -> str:
    addr = route.addresses().get(broker_name)
    if addr is None:
        raise AdminError(
            f"broker {broker_name!r} serves no queue of topic {route.topic!r} (or has no master)"
        )
    return addr


async def queue_range(
    client: AdminClient, addr: str, topic: str, queue_id: int, begin_ts: str | None, end_ts: str | None
) -> tuple[int, int]:
    """The queue offsets a begin/end timestamp pair selects (min and max offsets without them)."""
    lo = await queue_offset(client, addr, topic, queue_id, RequestCode.GET_MIN_OFFSET)
    hi = await queue_offset(client, addr, topic, queue_id, RequestCode.GET_MAX_OFFSET)
    if begin_ts:
        lo = await queue_offset(
            client,
            addr,
            topic,
            queue_id,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            timestamp=parse_timestamp(begin_ts),
        )
    if end_ts:
        hi = await queue_offset(
            client,
            addr,
            topic,
            queue_id,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            timestamp=parse_timestamp(end_ts),
        )
    return lo, hi


async def send_probe(
    client: AdminClient, addr: str, topic: str, queue_id: int, body: bytes
) -> tuple[str, str, int]:
    """SEND_MESSAGE_V2 of one message to one queue: (unique id, offset id, queue offset)."""
    from tidemq.client.message import new_message_id

    uniq = new_message_id()
    fields = {
        "a": PRODUCER_GROUP,
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": queue_id,
        "f": 0,
        "g": int(time.time() * 1000),
        "h": 0,
        "i": properties_to_string({Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq, Prop.WAIT_STORE_MSG_OK: "true"}),
        "j": 0,
        "k": False,
    }
    resp = await client.call(addr, RequestCode.SEND_MESSAGE_V2, fields, body)
    return uniq, resp.ext_fields.get("msgId", ""), int(resp.ext_fields.get("queueOffset", -1))


def writable_queues(route: TopicRoute, broker_names: Iterable[str] | None = None) -> list[tuple[str, int]]:
    names = set(broker_names) if broker_names is not None else None
    return [
        (q.broker_name, q.queue_id)
        for q in route.publish_queues(route.topic)
        if names is None or q.broker_name in names
    ]
