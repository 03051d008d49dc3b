"""NameServer authentication and registration ranges, tried as an attacker would: raw frames on loopback.

Security review C1: a forged REGISTER_BROKER received producers' messages, the same packet plus a
disconnect wiped a real broker's routes, UPDATE_NAMESRV_CONFIG ``broker_expire_s=0.001`` kept every
route empty, and ``writeQueueNums`` 10^8 (or negative) was served to clients.  With ``[namesrv]
credentials_file`` every write must carry RocketMQ's ACL signature of an ``admin: true`` account;
reads stay unsigned.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tidemq.acl import sign_request
from tidemq.config import NamesrvSettings
from tidemq.errors import ConfigError
from tidemq.namesrv import NameServer
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.protocol import (
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicRouteData,
)
from tidemq_transport_tcp import TcpTransport, run

pytestmark = pytest.mark.timeout(60)

RC = RequestCode
ADMIN = ("ns-admin-key", "ns-admin-secret-1234")
CREDENTIALS = f"""\
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: app-user-key
    secretKey: app-user-secret-1234
"""


def credentials_file(tmp_path: Path, text: str = CREDENTIALS, mode: int = 0o600) -> str:
    path = tmp_path / "ns_acl.yml"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def register(
    addr: str,
    topics: dict[str, TopicConfig],
    name: str = "broker-a",
    signed: tuple[str, str] | None = ADMIN,
) -> RemotingCommand:
    raw = RegisterBrokerBody(TopicConfigSerializeWrapper(topics, DataVersion(1000, 1))).encode()
    req = RemotingCommand.request(
        RC.REGISTER_BROKER,
        {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": "DefaultCluster",
            "haServerAddr": "",
            "brokerId": 0,
            "bodyCrc32": zlib.crc32(raw) & 0x7FFFFFFF,
        },
        raw,
    )
    if signed is not None:
        sign_request(req, *signed)
    return req


def with_namesrv(
    tmp_path: Path, body: Callable[[NameServer, str, Any], Awaitable[None]], **settings: Any
) -> None:
    """Run ``body(ns, address, broker)``; ``broker`` is a client kept open throughout, as a real
    broker's (its routes go when its connection closes)."""

    async def main() -> None:
        ns = NameServer(NamesrvSettings(listen="127.0.0.1:0", **settings), TcpTransport())
        await ns.start()
        broker = TcpTransport().client()
        try:
            await body(ns, ns.address, broker)
        finally:
            await broker.close()
            await ns.stop()

    run(main())


async def call(addr: str, req: RemotingCommand, client: Any = None) -> RemotingCommand:
    own = client is None
    client = client or TcpTransport().client()
    try:
        return await client.invoke(addr, req, 3)
    finally:
        if own:
            await client.close()


async def route(addr: str, topic: str) -> TopicRouteData | None:
    resp = await call(addr, RemotingCommand.request(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    return TopicRouteData.decode(resp.body) if resp.code == ResponseCode.SUCCESS else None


def test_forged_register_broker_is_refused_and_signed_one_accepted(tmp_path: Path) -> None:
    async def body(ns: NameServer, addr: str, broker: Any) -> None:
        payroll = {"Payroll": TopicConfig("Payroll", 4, 4)}
        # The attacker: unsigned, signed by an unknown key, by a non-admin account, with a wrong secret.
        for signed in (None, ("intruder-key", "whatever-1234"), ("app-user-key", "app-user-secret-1234")):
            resp = await call(addr, register("127.0.0.1:45999", payroll, signed=signed))
            assert resp.code == ResponseCode.NO_PERMISSION, (signed, resp.remark)
        resp = await call(addr, register("127.0.0.1:45999", payroll, signed=(ADMIN[0], "wrong-secret-123")))
        assert resp.code == ResponseCode.NO_PERMISSION
        assert resp.remark == f"signature check failed for accessKey {ADMIN[0]}"
        assert await route(addr, "Payroll") is None  # producers are not sent to the attacker
        # A broker with the credentials registers; reads stay unsigned (RocketMQ's clients send them so).
        assert (await call(addr, register("127.0.0.1:10911", payroll), broker)).code == ResponseCode.SUCCESS
        found = await route(addr, "Payroll")
        assert found is not None and found.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}

    with_namesrv(tmp_path, body, credentials_file=credentials_file(tmp_path))


def test_wipe_by_disconnect_leaves_the_real_broker_routed(tmp_path: Path) -> None:
    async def body(ns: NameServer, addr: str, broker: Any) -> None:
        real = TcpTransport().client()
        topics = {"Orders": TopicConfig("Orders", 4, 4)}
        assert (await call(addr, register("127.0.0.1:10911", topics), real)).code == 0
        attacker = TcpTransport().client()
        forged = await call(addr, register("127.0.0.1:45999", topics, signed=None), attacker)
        assert forged.code == ResponseCode.NO_PERMISSION
        await attacker.close()  # before the fix, this disconnect removed every broker-a route
        await asyncio.sleep(0.2)
        found = await route(addr, "Orders")
        assert found is not None and found.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
        await real.close()

    with_namesrv(tmp_path, body, credentials_file=credentials_file(tmp_path))


def test_every_write_code_needs_a_signature_reads_do_not(tmp_path: Path) -> None:
    async def body(ns: NameServer, addr: str, broker: Any) -> None:
        assert (
            await call(addr, register("127.0.0.1:10911", {"T": TopicConfig("T", 4, 4)}), broker)
        ).code == 0
        writes = [
            RemotingCommand.request(
                RC.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "x"}
            ),
            RemotingCommand.request(RC.DELETE_KV_CONFIG, {"namespace": "ns", "key": "k"}),
            RemotingCommand.request(
                RC.UNREGISTER_BROKER,
                {
                    "brokerName": "broker-a",
                    "brokerAddr": "127.0.0.1:10911",
                    "clusterName": "DefaultCluster",
                    "brokerId": 0,
                },
            ),
            RemotingCommand.request(RC.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
            RemotingCommand.request(RC.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
            RemotingCommand.request(RC.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}),
            RemotingCommand.request(RC.REGISTER_TOPIC_IN_NAMESRV, {"topic": "U"}, b"{}"),
            RemotingCommand.request(RC.UPDATE_NAMESRV_CONFIG, {}, b"orderMessageEnable=false"),
            RemotingCommand.request(RC.QUERY_DATA_VERSION, {"brokerAddr": "127.0.0.1:10911"}, b"{}"),
        ]
        for req in writes:
            resp = await call(addr, req)
            assert resp.code == ResponseCode.NO_PERMISSION, (req.code, resp.remark)
            assert "needs a signature" in (resp.remark or "")
        found = await route(addr, "T")
        assert found is not None and found.queue_datas[0].perm == 6  # nothing was wiped
        assert ns.kv_config.namespace("ORDER_TOPIC_CONFIG") is None and ns.order_message_enable
        for code in (
            RC.GET_BROKER_CLUSTER_INFO,
            RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
            RC.GET_NAMESRV_CONFIG,
        ):
            assert (await call(addr, RemotingCommand.request(code))).code == ResponseCode.SUCCESS
        wipe = RemotingCommand.request(RC.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        sign_request(wipe, *ADMIN)  # an admin account may
        assert (await call(addr, wipe)).ext_fields["wipeTopicCount"] == "1"

    with_namesrv(tmp_path, body, credentials_file=credentials_file(tmp_path))


def test_update_namesrv_config_cannot_expire_every_broker(tmp_path: Path) -> None:
    async def body(ns: NameServer, addr: str, broker: Any) -> None:
        text = b"broker_expire_s=0.001\nscan_interval_s=0.2"
        unsigned = await call(addr, RemotingCommand.request(RC.UPDATE_NAMESRV_CONFIG, {}, text))
        assert unsigned.code == ResponseCode.NO_PERMISSION
        signed = RemotingCommand.request(RC.UPDATE_NAMESRV_CONFIG, {}, text)
        sign_request(signed, *ADMIN)
        resp = await call(addr, signed)  # even an admin: below a registration period is refused
        assert resp.code == ResponseCode.SYSTEM_ERROR and "broker_expire_s = 0.001 is below 10" in (
            resp.remark or ""
        )
        assert (ns.settings.broker_expire_s, ns.settings.scan_interval_s) == (120.0, 10.0)

    with_namesrv(tmp_path, body, credentials_file=credentials_file(tmp_path))


@pytest.mark.parametrize(
    ("topic", "remark"),
    [
        (TopicConfig("Big", 4, 10**8), "writeQueueNums = 100000000 is out of range (0..1024)"),
        (TopicConfig("Neg", -1, 4), "readQueueNums = -1 is out of range (0..1024)"),
        (TopicConfig("Perm", 4, 4, perm=64), "perm = 64 is out of range (0..15)"),
        (TopicConfig("Flag", 4, 4, topic_sys_flag=-5), "topicSysFlag = -5 is out of range"),
    ],
)
def test_registration_numbers_are_range_checked(tmp_path: Path, topic: TopicConfig, remark: str) -> None:
    async def body(ns: NameServer, addr: str, broker: Any) -> None:
        ok = TopicConfig("Fine", 4, 4)
        resp = await call(
            addr, register("127.0.0.1:10911", {"Fine": ok, topic.topic_name: topic}, signed=None)
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR and remark in (resp.remark or ""), resp.remark
        assert await route(addr, "Fine") is None  # the whole registration is refused
        bad_topic = TopicRouteData()
        assert (await call(addr, register("127.0.0.1:10911", {"Fine": ok}, signed=None), broker)).code == 0
        bad_topic.queue_datas.append(
            QueueData(
                "broker-a", topic.read_queue_nums, topic.write_queue_nums, topic.perm, topic.topic_sys_flag
            )
        )
        reg = RemotingCommand.request(RC.REGISTER_TOPIC_IN_NAMESRV, {"topic": "Added"}, bad_topic.encode())
        refused = await call(addr, reg)
        assert refused.code == ResponseCode.SYSTEM_ERROR and remark in (refused.remark or "")
        assert await route(addr, "Added") is None

    with_namesrv(tmp_path, body)  # ranges hold with or without credentials


def test_a_registration_with_a_bad_address_is_refused(tmp_path: Path) -> None:
    async def body(ns: NameServer, addr: str, broker: Any) -> None:
        resp = await call(addr, register("not-an-address", {"T": TopicConfig("T", 4, 4)}, signed=None))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "brokerAddr" in (resp.remark or "")

    with_namesrv(tmp_path, body)


def test_credentials_file_must_be_private_valid_and_name_an_admin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"readable by others \(mode 0644\): run chmod 600"):
        NameServer(NamesrvSettings(credentials_file=credentials_file(tmp_path, mode=0o644)), TcpTransport())
    broken = credentials_file(
        tmp_path, "accounts:\n  - accessKey: ns-admin-key\n    secretKey: top-secret-value: [oops\n"
    )
    with pytest.raises(ConfigError, match="not valid YAML at line 3") as err:
        NameServer(NamesrvSettings(credentials_file=broken), TcpTransport())
    assert "top-secret-value" not in str(err.value)  # the line holds a secret: only where it is
    none = credentials_file(
        tmp_path, "accounts:\n  - accessKey: app-user-key\n    secretKey: app-user-secret-1234\n"
    )
    with pytest.raises(ConfigError, match="no account has admin: true"):
        NameServer(NamesrvSettings(credentials_file=none), TcpTransport())


def test_protected_mode_refuses_an_open_namesrv_beyond_loopback(tmp_path: Path) -> None:
    async def main() -> None:
        ns = NameServer(NamesrvSettings(listen="0.0.0.0:0"), TcpTransport())
        with pytest.raises(ConfigError, match=r"protected mode: the NameServer would listen on 0\.0\.0\.0"):
            await ns.start()
        assert ns.address == "0.0.0.0:0"  # nothing was bound (a bound server names its port)

    run(main())
