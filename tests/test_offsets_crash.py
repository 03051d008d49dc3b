"""Committed consumer offsets survive a SIGKILL: the broker writes them every persist interval.

A clean stop writes every offset, so restart tests that stop the broker cleanly cannot tell whether
the periodic write happens at all; only a killed broker shows it (consumers would re-read all).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import wait_for

from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

INTERVAL_S = 0.2
TOPIC, GROUP = "Durable", "Keepers"


def invoke(addr: str, code: int, fields: dict[str, Any], body: bytes | None = None) -> RemotingCommand:
    async def go() -> RemotingCommand:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            return await client.invoke(addr, RemotingCommand.request(code, fields, body), 5.0)
        finally:
            await client.close()

    return asyncio.run(go())


def committed(data: Path) -> dict[str, Any]:
    """``config/consumerOffset.json`` as RocketMQ's tools read it (empty before the first write)."""
    path = data / "config" / "consumerOffset.json"
    return dict(orjson.loads(path.read_bytes())["offsetTable"]) if path.exists() else {}


def test_a_sigkilled_broker_keeps_offsets_committed_one_persist_interval_earlier(
    spawn: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = []\ndata_dir = "{data}"\n'
        f"consumer_offset_flush_s = {INTERVAL_S}\n"
    )
    broker = spawn("broker", "-c", str(config))
    (addr,) = broker.addresses.values()
    create = {"topic": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    assert invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, create).code == ResponseCode.SUCCESS
    for queue_id, offset in ((0, 5), (1, 3)):
        fields = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "commitOffset": offset}
        assert invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET, fields).code == ResponseCode.SUCCESS
    # Within a few intervals (the machine may be busy) the running broker has written them.
    key = f"{TOPIC}@{GROUP}"
    assert wait_for(lambda: committed(data).get(key) == {"0": 5, "1": 3}, 10), committed(data)
    broker.stop(signal.SIGKILL)
    assert (data / "abort").exists()  # it died without its clean-stop write

    again = spawn("broker", "-c", str(config))
    (addr,) = again.addresses.values()
    for queue_id, offset in ((0, 5), (1, 3)):
        fields = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id}
        resp = invoke(addr, RequestCode.QUERY_CONSUMER_OFFSET, fields)
        assert (resp.code, resp.ext_fields.get("offset")) == (ResponseCode.SUCCESS, str(offset)), resp.remark


@pytest.mark.parametrize(
    ("topic", "group"),
    [("Durable", "bad/group"), ("Durable", "G" * 300), ("bad topic", "Keepers"), ("T" * 300, "Keepers")],
)
def test_a_commit_under_an_invalid_name_is_refused_and_never_saved(
    tmp_path: Path, topic: str, group: str
) -> None:
    """UPDATE_CONSUMER_OFFSET names the file's keys: a bad topic or group is refused, every time."""
    from test_send_edges import cluster

    async def main() -> None:
        async with cluster(tmp_path) as (client, broker, _):
            for _ in range(2):  # the first commit of a key and any later one
                fields = {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 7}
                resp = await client.invoke(
                    broker, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields), 5.0
                )
                assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark, resp.remark
        assert committed(tmp_path / "broker") == {}

    asyncio.run(main())


def test_a_stored_offset_under_an_invalid_name_is_skipped_and_the_rest_load(tmp_path: Path) -> None:
    """A consumerOffset.json edited by hand (or by an old tool): an entry whose topic or group is
    invalid is ignored with a log line; every other group's progress still loads."""
    from test_send_edges import cluster

    config = tmp_path / "broker" / "config"
    config.mkdir(parents=True)
    table = {
        "../etc@Keepers": {"0": 9},  # an invalid topic, valid group
        "Durable@bad/group": {"0": 8},  # a valid topic, invalid group
        "Durable@Keepers": {"0": 5, "1": 3},
        "Other@Keepers": {"0": 4},
    }
    (config / "consumerOffset.json").write_bytes(orjson.dumps({"offsetTable": table}))

    async def query(client: Any, broker: str, topic: str, group: str, queue_id: int) -> str | None:
        fields = {"consumerGroup": group, "topic": topic, "queueId": queue_id}
        resp = await client.invoke(
            broker, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, fields), 5.0
        )
        return resp.ext_fields.get("offset") if resp.code == ResponseCode.SUCCESS else None

    async def main() -> None:
        async with cluster(tmp_path) as (client, broker, _):
            got = [
                await query(client, broker, "Durable", "Keepers", 0),
                await query(client, broker, "Durable", "Keepers", 1),
                await query(client, broker, "Other", "Keepers", 0),
            ]
            assert got == ["5", "3", "4"]
        saved = committed(tmp_path / "broker")
        assert saved == {"Durable@Keepers": {"0": 5, "1": 3}, "Other@Keepers": {"0": 4}}

    asyncio.run(main())
