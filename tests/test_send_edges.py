"""Two edges of SEND_MESSAGE that the broader send tests do not pin, driven over the wire.

* A message sent straight to ``%RETRY%<group>`` goes to the group's DLQ once its ``reconsumeTimes``
  reaches the limit (the request's ``maxReconsumeTimes``, else the group's), not one retry later.
* A topic name the send path refuses (too long) is refused before anything is created: it never
  reaches the topic table, ``config/topics.json`` or the NameServer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.broker import Broker
from tidemq.config import NamesrvSettings, compose, parse_config
from tidemq.message import properties_to_string
from tidemq.namesrv import NameServer
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(60)

GROUP = "Workers"
RETRY, DLQ = f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"


@contextlib.asynccontextmanager
async def cluster(tmp: Path, **settings: Any) -> AsyncIterator[tuple[Any, str, str]]:
    """A NameServer and a broker registered with it: (client, broker address, namesrv address)."""
    transport = get_plugin_manager().create("transport", "tcp")
    ns = NameServer(NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp / "namesrv")), transport)
    await ns.start()
    cfg = parse_config(
        {
            "broker": {
                "listen": "127.0.0.1:0",
                "namesrv": [ns.address],
                "data_dir": str(tmp / "broker"),
                "register_interval_s": 0.2,
                **settings,
            }
        }
    )
    broker = Broker(compose(cfg))
    await broker.start()
    client = transport.client()
    try:
        yield client, broker.address, ns.address
    finally:
        await client.close()
        await broker.stop()
        await ns.stop()


async def call(client: Any, addr: str, code: int, fields: dict[str, Any], body: bytes | None = None) -> Any:
    return await client.invoke(addr, RemotingCommand.request(code, fields, body), 5.0)


def send_fields(topic: str, reconsume_times: int = 0, max_reconsume: int | None = None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_string({"TAGS": "t"}),
        "reconsumeTimes": reconsume_times,
        "unitMode": False,
    }
    if max_reconsume is not None:
        fields["maxReconsumeTimes"] = max_reconsume
    return fields


async def queued(client: Any, addr: str, topic: str) -> int:
    """Messages in queue 0 of ``topic`` (GET_MAX_OFFSET; 0 when the topic does not exist)."""
    resp = await call(client, addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else 0


@pytest.mark.parametrize(
    ("reconsume_times", "max_reconsume", "to_dlq"),
    [
        (0, 0, True),  # maxReconsumeTimes 0: no retry at all (only its absence means the group's)
        (1, 2, False),
        (2, 2, True),  # the limit itself: dead
        (3, 2, True),
        (15, None, False),  # without maxReconsumeTimes the group's limit (16 by default) applies
        (16, None, True),
    ],
)
def test_a_send_to_the_retry_topic_goes_to_the_dlq_once_its_retries_are_used_up(
    tmp_path: Path, reconsume_times: int, max_reconsume: int | None, to_dlq: bool
) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (client, broker, _):
            fields = send_fields(RETRY, reconsume_times, max_reconsume)
            resp = await call(client, broker, RequestCode.SEND_MESSAGE, fields, b"job")
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert (await queued(client, broker, DLQ), await queued(client, broker, RETRY)) == (
                (1, 0) if to_dlq else (0, 1)
            )
            if to_dlq:  # as RocketMQ makes it: one queue, written to and never delivered
                resp = await call(client, broker, RequestCode.GET_ALL_TOPIC_CONFIG, {})
                dlq = orjson.loads(resp.body)["topicConfigTable"][DLQ]
                assert (dlq["readQueueNums"], dlq["writeQueueNums"], dlq["perm"]) == (1, 1, 2)

    asyncio.run(main())


def test_a_topic_name_too_long_is_refused_and_never_created_saved_or_registered(tmp_path: Path) -> None:
    long_topic = "T" * 200  # over 127 characters; the topic table alone would take up to 255

    async def topic_table(client: Any, broker: str) -> dict[str, Any]:
        resp = await call(client, broker, RequestCode.GET_ALL_TOPIC_CONFIG, {})
        return dict(orjson.loads(resp.body)["topicConfigTable"])

    async def registered(client: Any, ns: str) -> set[str]:
        resp = await call(client, ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})
        return set(orjson.loads(resp.body)["topicList"])

    async def main() -> None:
        async with cluster(tmp_path) as (client, broker, ns):
            refused = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields(long_topic), b"x")
            assert refused.code != ResponseCode.SUCCESS
            assert "127" in refused.remark, refused.remark  # says why, in one line
            # A good topic created after it: once the NameServer knows it, it saw the whole table.
            ok = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("After"), b"y")
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            deadline = time.monotonic() + 10
            while "After" not in await registered(client, ns) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            topics = await registered(client, ns)
            assert "After" in topics and long_topic not in topics
            table = await topic_table(client, broker)
            assert "After" in table and long_topic not in table
        saved = (tmp_path / "broker" / "config" / "topics.json").read_text()
        assert '"After"' in saved and long_topic not in saved

    asyncio.run(main())
