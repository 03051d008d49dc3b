"""The NameServer over real TCP: registration, routes, expiry and cleanup."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.config import NamesrvSettings
from tidemq.namesrv import NameServer
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.protocol import (
    ClusterInfo,
    DataVersion,
    KVTable,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
)
from tidemq_transport_tcp import TcpTransport, run

pytestmark = pytest.mark.timeout(60)

RC = RequestCode


def register_cmd(
    name: str = "broker-a",
    addr: str = "127.0.0.1:10911",
    broker_id: int = 0,
    topics: dict[str, int] | None = None,
    version: DataVersion | None = None,
    cluster: str = "DefaultCluster",
    compressed: bool = False,
) -> RemotingCommand:
    table = {t: TopicConfig(t, n, n) for t, n in (topics or {}).items()}
    body = RegisterBrokerBody(TopicConfigSerializeWrapper(table, version or DataVersion(1000, 1)))
    raw = body.encode_compressed() if compressed else body.encode()
    return RemotingCommand.request(
        RC.REGISTER_BROKER,
        {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": cluster,
            "haServerAddr": addr.replace("10911", "10912"),
            "brokerId": broker_id,
            "compressed": compressed,
            "bodyCrc32": zlib.crc32(raw) & 0x7FFFFFFF,
        },
        raw,
    )


def with_namesrv(
    body: Callable[[NameServer, Any, str], Awaitable[None]], tmp_path: Path | None = None, **settings: Any
) -> None:
    async def main() -> None:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp_path or ""), **settings), TcpTransport()
        )
        await ns.start()
        client = TcpTransport().client()
        try:
            await body(ns, client, ns.address)
        finally:
            await client.close()
            await ns.stop()

    run(main())


async def route_of(client: Any, addr: str, topic: str) -> RemotingCommand:
    return await client.invoke(addr, RemotingCommand.request(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 3)


def test_register_then_route_has_the_wire_format_clients_parse() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        resp = await client.invoke(addr, register_cmd(topics={"TopicTest": 8, "TBW102": 4}), 3)
        assert resp.code == ResponseCode.SUCCESS
        route = await route_of(client, addr, "TopicTest")
        assert route.code == ResponseCode.SUCCESS
        raw = orjson.loads(route.body)  # exactly the keys rocketmq-client-cpp reads
        assert raw["queueDatas"] == [
            {"brokerName": "broker-a", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6, "topicSynFlag": 0}
        ]
        assert raw["brokerDatas"] == [
            {"cluster": "DefaultCluster", "brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:10911"}}
        ]
        assert raw["filterServerTable"] == {}
        missing = await route_of(client, addr, "NoSuchTopic")
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST == 17
        assert "NoSuchTopic" in (missing.remark or "")

    with_namesrv(body)


def test_slave_gets_master_ha_address_and_appears_in_route() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        await client.invoke(addr, register_cmd(topics={"T": 4}), 3)
        slave = await client.invoke(
            addr, register_cmd(addr="127.0.0.2:10911", broker_id=1, topics={"T": 4}), 3
        )
        assert slave.ext_fields == {"haServerAddr": "127.0.0.1:10912", "masterAddr": "127.0.0.1:10911"}
        route = TopicRouteData.decode((await route_of(client, addr, "T")).body)
        assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.2:10911"}
        master = await client.invoke(addr, register_cmd(topics={"T": 4}), 3)
        assert "masterAddr" not in master.ext_fields

    with_namesrv(body)


def test_unregister_removes_routes_and_cluster() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        await client.invoke(addr, register_cmd(topics={"T": 4}), 3)
        await client.invoke(
            addr, register_cmd(name="broker-b", addr="127.0.0.3:10911", topics={"T": 2, "U": 1}), 3
        )
        unreg = RemotingCommand.request(
            RC.UNREGISTER_BROKER,
            {
                "brokerName": "broker-a",
                "brokerAddr": "127.0.0.1:10911",
                "clusterName": "DefaultCluster",
                "brokerId": 0,
            },
        )
        assert (await client.invoke(addr, unreg, 3)).code == 0
        route = TopicRouteData.decode((await route_of(client, addr, "T")).body)
        assert [q.broker_name for q in route.queue_datas] == ["broker-b"]
        info = ClusterInfo.decode(
            (await client.invoke(addr, RemotingCommand.request(RC.GET_BROKER_CLUSTER_INFO), 3)).body
        )
        assert set(info.broker_addr_table) == {"broker-b"}
        assert info.cluster_addr_table == {"DefaultCluster": {"broker-b"}}

    with_namesrv(body)


def test_silent_broker_expires_and_its_connection_is_closed() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        broker_conn = TcpTransport().client()
        await broker_conn.invoke(addr, register_cmd(topics={"T": 4}), 3)
        conn = await broker_conn.connection(addr)
        # an active client keeps asking; the broker stays silent
        for _ in range(50):
            await asyncio.sleep(0.1)
            if (await route_of(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST:
                break
        assert (await route_of(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST
        await asyncio.wait_for(conn.lost, 2)  # the NameServer closed the expired broker's channel
        await broker_conn.close()

    with_namesrv(body, broker_expire_s=0.4, scan_interval_s=0.1)


def test_reregistering_keeps_broker_alive() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        for _ in range(15):  # 1.5 s of registrations, longer than the 1 s expiry
            assert (await client.invoke(addr, register_cmd(topics={"T": 4}), 3)).code == 0
            await asyncio.sleep(0.1)
        assert (await route_of(client, addr, "T")).code == 0

    with_namesrv(body, broker_expire_s=1.0, scan_interval_s=0.1)


def test_broker_connection_close_removes_its_routes() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        broker_conn = TcpTransport().client()
        await broker_conn.invoke(addr, register_cmd(topics={"T": 4}), 3)
        assert (await route_of(client, addr, "T")).code == 0
        await broker_conn.close()
        for _ in range(50):
            if (await route_of(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST:
                break
            await asyncio.sleep(0.02)
        assert (await route_of(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST

    with_namesrv(body)


def test_new_data_version_replaces_topics_and_same_version_is_ignored() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        await client.invoke(addr, register_cmd(topics={"A": 4, "B": 4}, version=DataVersion(1, 1)), 3)
        # same data version: the topic table is not re-read (RocketMQ only compares versions)
        await client.invoke(addr, register_cmd(topics={"A": 4}, version=DataVersion(1, 1)), 3)
        assert (await route_of(client, addr, "B")).code == 0
        await client.invoke(addr, register_cmd(topics={"A": 2}, version=DataVersion(2, 2)), 3)
        assert (await route_of(client, addr, "B")).code == ResponseCode.TOPIC_NOT_EXIST
        route = TopicRouteData.decode((await route_of(client, addr, "A")).body)
        assert route.queue_datas[0].write_queue_nums == 2
        dv = RemotingCommand.request(
            RC.QUERY_DATA_VERSION,
            {
                "brokerName": "broker-a",
                "brokerAddr": "127.0.0.1:10911",
                "clusterName": "DefaultCluster",
                "brokerId": 0,
            },
            DataVersion(2, 2).encode(),
        )
        resp = await client.invoke(addr, dv, 3)
        assert resp.ext_fields["changed"] == "false" and DataVersion.decode(resp.body) == DataVersion(2, 2)

    with_namesrv(body)


def test_compressed_register_body() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        resp = await client.invoke(addr, register_cmd(topics={"Zipped": 3}, compressed=True), 3)
        assert resp.code == 0
        route = TopicRouteData.decode((await route_of(client, addr, "Zipped")).body)
        assert route.queue_datas[0].read_queue_nums == 3

    with_namesrv(body)


def test_bad_register_bodies_are_refused_and_server_keeps_serving() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        bad = register_cmd(topics={"T": 1})
        bad.body = b"{not json"
        bad.ext_fields["bodyCrc32"] = "0"
        resp = await client.invoke(addr, bad, 3)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "JSON" in (resp.remark or "")
        crc = register_cmd(topics={"T": 1})
        crc.ext_fields["bodyCrc32"] = "12345"
        assert (await client.invoke(addr, crc, 3)).remark == "crc32 not match"
        missing = RemotingCommand.request(RC.REGISTER_BROKER, {"brokerName": "x"})
        resp = await client.invoke(addr, missing, 3)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "brokerAddr" in (resp.remark or "")
        unknown = await client.invoke(addr, RemotingCommand.request(9999), 3)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert (await client.invoke(addr, register_cmd(topics={"T": 1}), 3)).code == 0

    with_namesrv(body)


def test_topic_lists_deletion_and_write_perm() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        await client.invoke(addr, register_cmd(topics={"A": 4, "B": 4}), 3)
        await client.invoke(
            addr, register_cmd(name="broker-x", addr="127.0.0.9:10911", cluster="Other", topics={"C": 1}), 3
        )

        async def call(code: int, ext: dict[str, Any] | None = None) -> RemotingCommand:
            return await client.invoke(addr, RemotingCommand.request(code, ext), 3)

        all_topics = TopicList.decode((await call(RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body)
        assert all_topics.topic_list == {"A", "B", "C"}
        by_cluster = TopicList.decode((await call(RC.GET_TOPICS_BY_CLUSTER, {"cluster": "Other"})).body)
        assert by_cluster.topic_list == {"C"}
        system = TopicList.decode((await call(RC.GET_SYSTEM_TOPIC_LIST_FROM_NS)).body)
        assert {"DefaultCluster", "Other", "broker-a", "broker-x"} <= system.topic_list
        assert (await call(RC.DELETE_TOPIC_IN_NAMESRV, {"topic": "A"})).code == 0
        assert (await route_of(client, addr, "A")).code == ResponseCode.TOPIC_NOT_EXIST
        wiped = await call(RC.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert wiped.ext_fields["wipeTopicCount"] == "1"
        assert TopicRouteData.decode((await route_of(client, addr, "B")).body).queue_datas[0].perm == 4
        added = await call(RC.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert added.ext_fields["addTopicCount"] == "1"
        assert TopicRouteData.decode((await route_of(client, addr, "B")).body).queue_datas[0].perm == 6

    with_namesrv(body)


def test_kv_config_and_order_topic_conf(tmp_path: Path) -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        async def call(code: int, ext: dict[str, Any]) -> RemotingCommand:
            return await client.invoke(addr, RemotingCommand.request(code, ext), 3)

        nf = await call(RC.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
        assert nf.code == ResponseCode.QUERY_NOT_FOUND
        put = {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "broker-a:4"}
        assert (await call(RC.PUT_KV_CONFIG, put)).code == 0
        assert (await call(RC.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})).ext_fields == {
            "value": "broker-a:4"
        }
        table = KVTable.decode(
            (await call(RC.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"})).body
        )
        assert table.table == {"T": "broker-a:4"}
        reg = await client.invoke(addr, register_cmd(topics={"T": 4}), 3)
        assert KVTable.decode(reg.body).table == {"T": "broker-a:4"}  # brokers learn orderly topics
        route = TopicRouteData.decode((await route_of(client, addr, "T")).body)
        assert route.order_topic_conf == "broker-a:4"

    with_namesrv(body, tmp_path)
    assert orjson.loads((tmp_path / "kvConfig.json").read_bytes()) == {
        "configTable": {"ORDER_TOPIC_CONFIG": {"T": "broker-a:4"}}
    }

    async def reload(ns: NameServer, client: Any, addr: str) -> None:  # persisted across restarts
        got = await client.invoke(
            addr,
            RemotingCommand.request(RC.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"}),
            3,
        )
        assert got.ext_fields == {"value": "broker-a:4"}

    with_namesrv(reload, tmp_path)


def test_several_namesrvs_are_independent() -> None:
    async def main() -> None:
        a = NameServer(NamesrvSettings(listen="127.0.0.1:0"), TcpTransport())
        b = NameServer(NamesrvSettings(listen="127.0.0.1:0"), TcpTransport())
        await a.start()
        await b.start()
        client = TcpTransport().client()
        try:
            await client.invoke(a.address, register_cmd(topics={"OnlyA": 1}), 3)
            assert (await route_of(client, a.address, "OnlyA")).code == 0
            assert (await route_of(client, b.address, "OnlyA")).code == ResponseCode.TOPIC_NOT_EXIST
            await a.stop()
            await client.invoke(b.address, register_cmd(topics={"OnlyA": 1}), 3)
            assert (await route_of(client, b.address, "OnlyA")).code == 0
        finally:
            await client.close()
            await a.stop()
            await b.stop()

    run(main())


def test_namesrv_config_over_the_wire() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        got = await client.invoke(addr, RemotingCommand.request(RC.GET_NAMESRV_CONFIG), 3)
        assert "broker_expire_s=120.0" in got.body.decode()
        upd = RemotingCommand.request(RC.UPDATE_NAMESRV_CONFIG, body=b"broker_expire_s=30\n")
        assert (await client.invoke(addr, upd, 3)).code == 0
        assert ns.settings.broker_expire_s == 30.0
        bad = RemotingCommand.request(RC.UPDATE_NAMESRV_CONFIG, body=b"listen=1.2.3.4:1\n")
        assert (await client.invoke(addr, bad, 3)).code == ResponseCode.SYSTEM_ERROR

    with_namesrv(body)


def test_add_write_perm_sets_read_write_as_rocketmq_does() -> None:
    # RocketMQ's operateWritePermOfBroker sets PERM_READ|PERM_WRITE outright: a read-only topic
    # (perm 4) and one with the priority bit (4|8) both come back as 6.
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        cmd = register_cmd(topics={"ReadOnly": 2, "Priority": 2})
        table = TopicConfigSerializeWrapper(
            {
                "ReadOnly": TopicConfig("ReadOnly", 2, 2, perm=4),
                "Priority": TopicConfig("Priority", 2, 2, perm=12),
            },
            DataVersion(1000, 1),
        )
        cmd.body = RegisterBrokerBody(table).encode()
        cmd.ext_fields["bodyCrc32"] = str(zlib.crc32(cmd.body) & 0x7FFFFFFF)
        assert (await client.invoke(addr, cmd, 3)).code == ResponseCode.SUCCESS
        added = await client.invoke(
            addr, RemotingCommand.request(RC.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}), 3
        )
        assert added.ext_fields["addTopicCount"] == "2"
        for topic in ("ReadOnly", "Priority"):
            assert TopicRouteData.decode((await route_of(client, addr, topic)).body).queue_datas[0].perm == 6

    with_namesrv(body)


def test_namesrv_config_speaks_rocketmq_names(tmp_path: Path) -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        async def update(text: bytes) -> RemotingCommand:
            return await client.invoke(addr, RemotingCommand.request(RC.UPDATE_NAMESRV_CONFIG, body=text), 3)

        got = (await client.invoke(addr, RemotingCommand.request(RC.GET_NAMESRV_CONFIG), 3)).body.decode()
        lines = dict(line.split("=", 1) for line in got.splitlines())
        assert lines["listenPort"] == addr.rsplit(":", 1)[1]
        assert lines["kvConfigPath"] == str(tmp_path / "kvConfig.json")
        assert lines["orderMessageEnable"] == "true" and lines["scanNotActiveBrokerInterval"] == "10000"
        # Java properties syntax: '=', ':' or a space; RocketMQ's key in ms.
        assert (await update(b"# comment\nscanNotActiveBrokerInterval: 2500\nbroker_expire_s 45\n")).code == 0
        assert (ns.settings.scan_interval_s, ns.settings.broker_expire_s) == (2.5, 45.0)
        for key in (b"kvConfigPath", b"configStorePath"):
            refused = await update(key + b"=/tmp/elsewhere\n")
            assert (refused.code, refused.remark) == (
                ResponseCode.NO_PERMISSION,
                "Can not update config path",
            )
        unknown = await update(b"serverWorkerThreads=16\n")
        assert unknown.code == ResponseCode.SYSTEM_ERROR and "serverWorkerThreads" in (unknown.remark or "")
        # All or nothing: a bad line leaves the good one unapplied.
        mixed = await update(b"broker_expire_s=60\nproductEnvName=x\n")
        assert mixed.code == ResponseCode.SYSTEM_ERROR and ns.settings.broker_expire_s == 45.0
        assert (await update(b"")).code == ResponseCode.SUCCESS

    with_namesrv(body, tmp_path)
