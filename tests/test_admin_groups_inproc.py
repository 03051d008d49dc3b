"""The slice's request codes on in-process brokers: a slave refuses group changes, the memory
store answers the store maintenance codes, and persisted broker-config overrides apply at start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_broker_processors import call, running

from tidemq.remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.timeout(60)

MEMORY = {"store": "memory", "flush": "async", "index": "hash"}


def test_slave_refuses_group_changes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path / "s", {}, id=1, role="SLAVE") as (broker, client):
            body = orjson.dumps({"groupName": "G"})
            for code, fields, payload in (
                (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body),
                (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "G"}, None),
            ):
                resp = await call(client, broker, code, fields, payload)
                assert resp.code == ResponseCode.SYSTEM_ERROR
                assert resp.remark == (
                    "Can't modify topic or subscription group from slave broker, please execute it from master broker."
                )
            assert broker.groups.get("G") is None

    asyncio.run(main())


def test_memory_store_answers_maintenance_codes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path / "m", MEMORY) as (broker, client):
            for code in (
                RequestCode.DELETE_EXPIRED_COMMITLOG,
                RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
                RequestCode.CLEAN_UNUSED_TOPIC,
            ):
                resp = await call(client, broker, code)
                assert resp.code == ResponseCode.SUCCESS, (code, resp.remark)
            listed = orjson.loads(
                (await call(client, broker, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)).body
            )
            assert {broker.settings.name, broker.settings.cluster} <= set(listed["topicList"])

    asyncio.run(main())


def test_runtime_overrides_apply_at_start_and_bad_ones_are_skipped(tmp_path: Path) -> None:
    data = tmp_path / "o"
    (data / "config").mkdir(parents=True)
    (data / "config" / "broker.runtime.properties").write_text(
        "# written by UPDATE_BROKER_CONFIG\nclusterTopicEnable=false\nautoCreateTopicEnable=false\n"
        "shortPollingTimeMills=250\nbrokerName=renamed\nslaveReadEnable=perhaps\n"
    )

    async def main() -> dict[str, Any]:
        async with running(data, {}) as (broker, client):
            assert broker.settings.short_polling_ms == 250
            assert broker.settings.name != "renamed" and broker.settings.slave_read_enable is False
            assert broker.topics.get("TBW102") is None  # auto-creation off: no template
            cluster = broker.topics.get(broker.settings.cluster)
            assert cluster is not None and cluster.perm == 1  # PERM_INHERIT alone
            resp = await call(client, broker, RequestCode.GET_BROKER_CONFIG)
            return dict(line.split("=", 1) for line in resp.body.decode().splitlines())

    props = asyncio.run(main())
    assert props["shortPollingTimeMills"] == "250" and props["clusterTopicEnable"] == "false"


def test_a_group_deleted_on_the_master_leaves_the_slave(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path / "sync", {}) as (broker, _client):
            sink = broker.metadata_sink
            sink.apply_subscription_groups({"subscriptionGroupTable": {"a": {}, "b": {"retryMaxTimes": 2}}})
            assert set(broker.groups.all()) == {"a", "b"}
            sink.apply_subscription_groups({"subscriptionGroupTable": {"b": {"retryMaxTimes": 2}}})
            assert set(broker.groups.all()) == {"b"}

    asyncio.run(main())
