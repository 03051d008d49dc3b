"""Broker statistics (BrokerStats) and the monitoring / queue-inspection request codes, in process.

Bodies are checked against RocketMQ 4.9's shapes: BrokerStatsData, ConsumeStatsList, GroupList,
ProducerConnection, ProducerTableInfo, QueryConsumeQueueResponseBody, QueryConsumeTimeSpanBody,
and the MessageQueue-keyed TopicStatsTable / ConsumeStats as fastjson writes them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_broker_processors import call, create_topic, pull_fields, running, send_fields

from tidemq import __version__, mqjson
from tidemq.broker.stats import BrokerStats
from tidemq.message import java_string_hash
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.timeout(60)


#: Runtime-info keys rocketmq-exporter reads with Long.parseLong (model/BrokerRuntimeStats.java).
EXPORTER_LONGS = """msgPutTotalTodayNow sendThreadPoolQueueHeadWaitTimeMills queryThreadPoolQueueHeadWaitTimeMills
msgGetTotalTodayNow queryThreadPoolQueueSize bootTimestamp msgPutTotalYesterdayMorning msgGetTotalYesterdayMorning
pullThreadPoolQueueSize commitLogMinOffset pullThreadPoolQueueHeadWaitTimeMills dispatchMaxBuffer
pageCacheLockTimeMills commitLogMaxOffset getMessageEntireTimeMax msgPutTotalTodayMorning putMessageTimesTotal
msgGetTotalTodayMorning sendThreadPoolQueueSize startAcceptSendRequestTimeStamp putMessageEntireTimeMax
earliestMessageTimeStamp remainTransientStoreBufferNumbs queryThreadPoolQueueCapacity dispatchBehindBytes
putMessageSizeTotal sendThreadPoolQueueCapacity pullThreadPoolQueueCapacity""".split()


# ---------------------------------------------------------------------- BrokerStats alone
def test_counters_and_windows() -> None:
    stats = BrokerStats(cluster="C")
    stats.on_put("T", 3, 300)
    stats.on_put("T", 1, 100)
    stats.on_get("G", "T", 2, 200)
    assert (stats.put_count, stats.put_bytes, stats.get_count, stats.get_bytes) == (4, 400, 2, 200)
    snaps = stats.snapshots("TOPIC_PUT_NUMS", "T")
    assert snaps is not None
    minute = snaps["minute"]
    # The first window starts with RocketMQ's zero sample one period (10 s) before the item's birth.
    assert minute.sum == 4 and minute.avgpt == 2.0 and 0.3 < minute.tps <= 0.4
    assert stats.snapshots("TOPIC_PUT_SIZE", "T")["hour"].sum == 400  # type: ignore[index]
    assert stats.snapshots("GROUP_GET_NUMS", "T@G")["day"].sum == 2  # type: ignore[index]
    broker_minute = stats.snapshots("BROKER_PUT_NUMS", "C")["minute"]  # type: ignore[index]
    assert broker_minute.sum == 4 and broker_minute.avgpt == 0.0
    assert stats.snapshots("BROKER_PUT_NUMS", "other") is None
    assert stats.snapshots("TOPIC_PUT_NUMS", "absent") is None
    assert stats.snapshots("NO_SUCH_STATS", "T") is None
    # A window runs from its oldest sample to now: puts after a sample still count.
    stats.sample("minute")
    stats.on_put("T", 5, 50)
    after = stats.snapshots("TOPIC_PUT_NUMS", "T")
    assert after is not None and after["minute"].sum == 9 and after["minute"].avgpt == 3.0
    assert stats.group_get_tps("G", "T") > 0 and stats.group_get_tps("G", "other") == 0.0


def test_minute_window_keeps_seven_samples() -> None:
    stats = BrokerStats()
    now = int(time.time() * 1000)
    stats.on_put("T", 1, 1)
    for i in range(10):  # one put per 10-second sample
        stats.sample("minute", now + i * 10_000)
        stats.on_put("T", 1, 1)
    counter = stats.topic_puts["T"]
    assert len(counter.samples["minute"]) == 7
    snap = counter.snapshot("minute", False, now + 100_000)
    # The oldest kept sample is the 4th one (3 samples dropped): puts after it are the window's sum.
    assert snap.sum == 7


def test_broker_tps_and_day_marks() -> None:
    stats = BrokerStats()
    start = int(time.time() * 1000)
    for second in range(120):
        stats.on_put("T", 10, 10)  # 10 messages per second
        stats.sample_second(start + second * 1000)
    t10, t60, t600 = (float(x) for x in stats.broker_tps(1, now_ms=start + 120_000).split())
    assert t10 == pytest.approx(10.0, rel=0.15) and t60 == pytest.approx(10.0, rel=0.05)
    assert t600 == pytest.approx(10.0, rel=0.05)  # the samples there are: 120 s of them
    assert stats.broker_tps(2, now_ms=start + 120_000) == "0.00 0.00 0.00"
    stats.on_get("G", "T", 0, 0)  # a pull that found nothing: a miss, no group item
    assert stats.get_misses == 1 and stats.get_count == 0 and not stats.group_gets
    # Midnight: today's morning mark becomes yesterday's, the total becomes today's.
    stats._day = "1999-12-31"
    stats.sample_second()
    assert (stats.put_total_yesterday_morning, stats.put_total_today_morning) == (0, 1200)
    stats.on_put("T", 5, 5)
    stats._day = "1999-12-31"
    stats.sample_second()
    assert (stats.put_total_yesterday_morning, stats.put_total_today_morning) == (1200, 1205)


# ---------------------------------------------------------------------- the request codes
def _heartbeat(producer_group: str, client_id: str) -> bytes:
    return orjson.dumps(
        {
            "clientID": client_id,
            "producerDataSet": [{"groupName": producer_group}],
            "consumerDataSet": [],
        }
    )


async def _fill(client: Any, broker: Any) -> None:
    """Topic Stats (2 queues): 3 messages in queue 1, group SG pulled 2 of them and committed 2."""
    await create_topic(client, broker, "Stats", queues=2)
    for tag in ("a", "b", "c"):
        resp = await call(
            client, broker, RequestCode.SEND_MESSAGE, send_fields("Stats", 1, {"TAGS": tag}), b"xy"
        )
        assert resp.code == ResponseCode.SUCCESS
    pulled = await call(
        client, broker, RequestCode.PULL_MESSAGE, {**pull_fields("Stats", 1, 0, group="SG"), "maxMsgNums": 2}
    )
    assert pulled.code == ResponseCode.SUCCESS
    await call(
        client,
        broker,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "SG", "topic": "Stats", "queueId": 1, "commitOffset": 2},
    )


def test_monitoring_codes(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix, cluster="CX") as (broker, client):
            await _fill(client, broker)

            # VIEW_BROKER_STATS_DATA (315)
            async def view(name: str, key: str) -> Any:
                return await call(
                    client, broker, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key}
                )

            data = orjson.loads((await view("TOPIC_PUT_NUMS", "Stats")).body)
            assert set(data) == {"statsMinute", "statsHour", "statsDay"}
            assert set(data["statsMinute"]) == {"sum", "tps", "avgpt"}
            assert data["statsMinute"]["sum"] == 3 and data["statsDay"]["sum"] == 3
            assert data["statsMinute"]["tps"] > 0
            size = orjson.loads((await view("TOPIC_PUT_SIZE", "Stats")).body)["statsMinute"]["sum"]
            assert size > 3 * 2  # whole stored messages, not bodies
            got = orjson.loads((await view("GROUP_GET_NUMS", "Stats@SG")).body)
            assert got["statsMinute"]["sum"] == 2 and got["statsMinute"]["avgpt"] == 2.0
            assert orjson.loads((await view("BROKER_PUT_NUMS", "CX")).body)["statsHour"]["sum"] == 3
            missing = await view("TOPIC_PUT_NUMS", "NoSuchTopic")
            assert missing.code == ResponseCode.SYSTEM_ERROR
            assert missing.remark == "The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist"
            no_key = await call(
                client, broker, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS"}
            )
            assert no_key.code != ResponseCode.SUCCESS and "statsKey" in (no_key.remark or "")

            # GET_CONSUME_STATS (208): real consumeTps, map keyed by MessageQueue objects
            resp = await call(client, broker, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "SG"})
            assert resp.body is not None and b'"offsetTable":{{"brokerName":"' in resp.body
            consume = mqjson.loads(resp.body)
            assert consume["consumeTps"] > 0
            table = mqjson.mq_map(consume["offsetTable"])
            assert table[MessageQueue("Stats", broker.settings.name, 1)] == {
                "brokerOffset": 3,
                "consumerOffset": 2,
                "lastTimestamp": broker.store.get_store_time("Stats", 1, 1),
            }
            assert table[MessageQueue("Stats", broker.settings.name, 0)]["consumerOffset"] == 0
            unknown = await call(client, broker, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "Nobody"})
            assert unknown.code == ResponseCode.SUCCESS and mqjson.loads(unknown.body)["offsetTable"] == {}

            # GET_TOPIC_STATS_INFO (202)
            resp = await call(client, broker, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Stats"})
            assert resp.body is not None and resp.body.startswith(b'{"offsetTable":{{"brokerName":"')
            offsets = mqjson.mq_map(mqjson.loads(resp.body)["offsetTable"])
            assert offsets[MessageQueue("Stats", broker.settings.name, 1)]["maxOffset"] == 3
            assert set(offsets[MessageQueue("Stats", broker.settings.name, 0)]) == {
                "lastUpdateTimestamp",
                "maxOffset",
                "minOffset",
            }

            # GET_BROKER_CONSUME_STATS (317)
            resp = await call(client, broker, RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
            body = mqjson.loads(resp.body)
            assert body["brokerAddr"] == broker.address and body["totalDiff"] == 1
            per_group = {g: s for entry in body["consumeStatsList"] for g, s in entry.items()}
            assert "SG" in per_group and len(per_group["SG"]) == 1
            stats = per_group["SG"][0]
            assert set(stats) == {"consumeTps", "offsetTable"} and stats["consumeTps"] > 0
            assert len(mqjson.mq_map(stats["offsetTable"])) == 2
            ordered = mqjson.loads(
                (await call(client, broker, RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "true"})).body
            )
            assert ordered["totalDiff"] == 0  # Stats is not an ordered topic

            # QUERY_TOPIC_CONSUME_BY_WHO (300)
            resp = await call(client, broker, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "Stats"})
            assert orjson.loads(resp.body) == {"groupList": ["SG"]}
            resp = await call(client, broker, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "Other"})
            assert orjson.loads(resp.body) == {"groupList": []}

            # GET_PRODUCER_CONNECTION_LIST (204) and GET_ALL_PRODUCER_INFO (328)
            beat = await call(client, broker, RequestCode.HEART_BEAT, {}, _heartbeat("PG-1", "10.0.0.9@1"))
            assert beat.code == ResponseCode.SUCCESS
            resp = await call(
                client, broker, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG-1"}
            )
            conns = orjson.loads(resp.body)["connectionSet"]
            assert len(conns) == 1 and conns[0]["clientId"] == "10.0.0.9@1"
            assert set(conns[0]) == {"clientId", "clientAddr", "language", "version"}
            absent = await call(
                client, broker, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG-2"}
            )
            assert (
                absent.code == ResponseCode.SYSTEM_ERROR
                and absent.remark == "the producer group[PG-2] not exist"
            )
            resp = await call(client, broker, RequestCode.GET_ALL_PRODUCER_INFO)
            info = orjson.loads(resp.body)["data"]["PG-1"][0]
            assert set(info) == {"clientId", "remoteIP", "language", "version", "lastUpdateTimestamp"}
            assert abs(info["lastUpdateTimestamp"] - time.time() * 1000) < 10_000

            # GET_BROKER_RUNTIME_INFO (28)
            table = orjson.loads((await call(client, broker, RequestCode.GET_BROKER_RUNTIME_INFO)).body)[
                "table"
            ]
            assert table["brokerVersionDesc"] == f"tidemq {__version__}"
            assert table["msgPutTotalTodayNow"] == "3" and table["msgGetTotalTodayNow"] == "2"
            assert table["msgPutTotalTodayMorning"] == "0" and table["msgPutTotalYesterdayMorning"] == "0"
            for key in ("putTps", "getTransferedTps", "getFoundTps"):
                assert len([float(x) for x in table[key].split()]) == 3, key
            assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
            assert int(table["earliestMessageTimeStamp"]) == broker.store.get_store_time("Stats", 1, 0)
            assert table["commitLogDirCapacity"].startswith("Total : ")
            assert all(isinstance(v, str) for v in table.values())
            # rocketmq-exporter's BrokerRuntimeStats parses each of these and fails on a missing one.
            for key in EXPORTER_LONGS:
                int(table[key])
            for key in ("consumeQueueDiskRatio", "commitLogDiskRatio", "putMessageAverageSize"):
                float(table[key])
            float(table["remainHowManyDataToFlush"].split(" ")[0])
            assert int(table["brokerVersion"]) > 0  # Integer.parseInt
            assert table["putMessageDistributeTime"] == "null"  # the exporter's "not measured"
            for key in ("getMissTps", "getTotalTps"):
                assert len(table[key].split()) == 3

    asyncio.run(main())


def test_queue_inspection_codes(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            await _fill(client, broker)
            name = broker.settings.name

            # QUERY_CONSUME_QUEUE (321)
            fields: dict[str, Any] = {"topic": "Stats", "queueId": 1, "index": 1, "count": 5}
            body = orjson.loads((await call(client, broker, RequestCode.QUERY_CONSUME_QUEUE, fields)).body)
            assert (body["minQueueIndex"], body["maxQueueIndex"]) == (0, 3)
            assert "subscriptionData" not in body and "filterData" not in body  # fastjson drops nulls
            rows = body["queueData"]
            assert [r["tagsCode"] for r in rows] == [java_string_hash("b"), java_string_hash("c")]
            assert rows[0]["physicOffset"] == broker.store.get_commit_log_offset("Stats", 1, 1)
            assert rows[1]["physicOffset"] == rows[0]["physicOffset"] + rows[0]["physicSize"]
            assert set(rows[0]) == {"physicOffset", "physicSize", "tagsCode", "eval"}
            with_group = orjson.loads(
                (
                    await call(
                        client, broker, RequestCode.QUERY_CONSUME_QUEUE, {**fields, "consumerGroup": "SG"}
                    )
                ).body
            )
            assert with_group["filterData"] == "SG@Stats is not online!"
            outside = await call(client, broker, RequestCode.QUERY_CONSUME_QUEUE, {**fields, "index": 3})
            assert outside.code == ResponseCode.SUCCESS and not outside.body
            assert outside.remark == "Index 3 of 1@Stats is not exist!"
            absent = await call(client, broker, RequestCode.QUERY_CONSUME_QUEUE, {**fields, "queueId": 7})
            assert absent.code == ResponseCode.SYSTEM_ERROR and absent.remark == "7@Stats is not exist!"
            no_index = await call(
                client, broker, RequestCode.QUERY_CONSUME_QUEUE, {"topic": "Stats", "queueId": 1}
            )
            assert no_index.code != ResponseCode.SUCCESS and "index" in (no_index.remark or "")

            # QUERY_CONSUME_TIME_SPAN (303)
            resp = await call(
                client, broker, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "Stats", "group": "SG"}
            )
            spans = orjson.loads(resp.body)["consumeTimeSpanSet"]
            assert [s["messageQueue"] for s in spans] == [
                {"brokerName": name, "queueId": 0, "topic": "Stats"},
                {"brokerName": name, "queueId": 1, "topic": "Stats"},
            ]
            q1 = spans[1]
            store_time = [broker.store.get_store_time("Stats", 1, i) for i in range(3)]
            assert (q1["minTimeStamp"], q1["maxTimeStamp"], q1["consumeTimeStamp"]) == (
                store_time[0],
                store_time[2],
                store_time[1],
            )
            assert 0 <= q1["delayTime"] < 60_000 and spans[0]["delayTime"] == 0
            missing = await call(
                client, broker, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "Nope", "group": "SG"}
            )
            assert missing.code == ResponseCode.TOPIC_NOT_EXIST

    asyncio.run(main())


def test_deleting_a_topic_drops_its_figures(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    """DELETE_TOPIC_IN_BROKER forgets the topic's counters (RocketMQ's onTopicDeleted): a topic
    created and deleted in a loop must not grow the broker's tables for ever."""

    async def main() -> None:
        async with running(tmp_path, plugin_matrix, cluster="CX") as (broker, client):
            await _fill(client, broker)
            stats = broker.stats
            assert "Stats" in stats.topic_puts and "Stats@SG" in stats.group_gets
            assert any(key[1] == "Stats" for key in stats.commit_times)
            for round_ in range(3):
                deleted = await call(client, broker, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Stats"})
                assert deleted.code == ResponseCode.SUCCESS
                assert "Stats" not in stats.topic_puts and "Stats@SG" not in stats.group_gets
                assert not any(key[1] == "Stats" for key in stats.commit_times)
                missing = await call(
                    client,
                    broker,
                    RequestCode.VIEW_BROKER_STATS_DATA,
                    {"statsName": "TOPIC_PUT_NUMS", "statsKey": "Stats"},
                )
                assert missing.code == ResponseCode.SYSTEM_ERROR
                if round_ < 2:
                    await _fill(client, broker)
            assert len(stats.topic_puts) == len([t for t in stats.topic_puts if t != "Stats"])
            # The broker-wide totals keep counting what was stored (RocketMQ's BROKER_PUT_NUMS does too).
            assert stats.put_count == 9

    asyncio.run(main())
