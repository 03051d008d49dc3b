"""A master_slave slave copies its master's metadata (RocketMQ's SlaveSynchronize), in-process.

A NameServer, a master and a slave on loopback in one event loop.  The slave is told nothing about
its master: it learns the addresses from the NameServer's answer to its registration.  The broker
hands the replication its metadata sink and client (``MetadataFollower.follow_metadata``); no
plugin hook is involved.  ``metadata_sync_s`` is long on purpose: the first copy must follow the
registration at once, not a sync period later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.broker import Broker
from tidemq.config import NamesrvSettings, compose, parse_config
from tidemq.namesrv import NameServer
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.replication import MetadataFollower

pytestmark = pytest.mark.timeout(90)

#: Far longer than the test waits: only a round started by learning the master passes.
SYNC_S = 120.0


def broker_config(tmp_path: Path, name: str, namesrv: str, **broker: Any) -> dict[str, Any]:
    return {
        "broker": {
            "name": "broker-meta",
            "listen": "127.0.0.1:0",
            "namesrv": [namesrv],
            "data_dir": str(tmp_path / name),
            **broker,
        },
        "plugins": {"replication": "master_slave"},
        "store": {"mmap": {"commitlog_file_size": 1 << 20}},
        "replication": {"master_slave": {"metadata_sync_s": SYNC_S, "group_sync_s": SYNC_S}},
    }


async def eventually(check: Callable[[], Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return bool(await check())


def test_slave_copies_topics_offsets_and_groups_from_the_master_it_learns(tmp_path: Path) -> None:
    async def main() -> None:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp_path / "namesrv")),
            get_plugin_manager().create("transport", "tcp"),
        )
        await ns.start()
        client = get_plugin_manager().create("transport", "tcp").client()
        master = Broker(compose(parse_config(broker_config(tmp_path, "master", str(ns.address)))))
        slave = Broker(
            compose(parse_config(broker_config(tmp_path, "slave", str(ns.address), id=1, role="SLAVE")))
        )

        async def call(broker: Broker, code: int, fields: Any = None, body: Any = None) -> RemotingCommand:
            return await client.invoke(broker.address, RemotingCommand.request(code, fields or {}, body), 5.0)

        try:
            await master.start()
            assert isinstance(master.replication, MetadataFollower)
            assert master.replication.slave_sync is None  # a master copies nothing
            topic = {"topic": "MetaTopic", "readQueueNums": "3", "writeQueueNums": "3", "perm": "6"}
            offset = {"consumerGroup": "cg-meta", "topic": "MetaTopic", "queueId": "2", "commitOffset": "42"}
            group = orjson.dumps({"groupName": "cg-meta", "retryMaxTimes": 7})
            for code, fields, body in (
                (RequestCode.UPDATE_AND_CREATE_TOPIC, topic, None),
                (RequestCode.UPDATE_CONSUMER_OFFSET, offset, None),
                (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, group),
            ):
                resp = await call(master, code, fields, body)
                assert resp.code == ResponseCode.SUCCESS, resp.remark

            await slave.start()

            async def copied() -> bool:
                topics = orjson.loads((await call(slave, RequestCode.GET_ALL_TOPIC_CONFIG)).body)
                offsets = orjson.loads((await call(slave, RequestCode.GET_ALL_CONSUMER_OFFSET)).body)
                groups = orjson.loads((await call(slave, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
                cfg = topics["topicConfigTable"].get("MetaTopic")
                grp = groups["subscriptionGroupTable"].get("cg-meta")
                return (
                    cfg is not None
                    and cfg["readQueueNums"] == 3
                    and offsets["offsetTable"].get("MetaTopic@cg-meta", {}).get("2") == 42
                    and grp is not None
                    and grp["retryMaxTimes"] == 7
                )

            assert await eventually(copied, 15), "the slave did not copy its master's metadata"
        finally:
            await slave.stop()
            await master.stop()
            await client.close()
            await ns.stop()
        # shutdown() stopped the copy: no sync task outlives the broker.
        await asyncio.sleep(0)
        assert slave.replication.slave_sync is None  # type: ignore[attr-defined]
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "tidemq-slave-sync" and not t.done()]

    asyncio.run(main())
