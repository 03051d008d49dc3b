"""Consumer offsets reset, consumer status and running info, consume-directly (issue 21).

One NameServer and one broker (``tidemq`` command line) serve the whole module; tidemq's own push
consumer runs on a loop thread of this process and answers what the broker relays to it, while the
``tidemq admin`` commands run as subprocesses, as an operator runs them.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, free_port, run_admin, wait_for

from tidemq import mqjson
from tidemq.client import AdminClient, Message, Producer, PullConsumer, PushConsumer
from tidemq.client.blocking import LoopThread
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

TOPIC = "ResetT"
BROKER = "broker-cc"


class Env:
    """The module's cluster, a client loop, and helpers to run commands and raw requests."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.servers: list[Server] = []
        ns = Server(["namesrv", "--listen", "127.0.0.1:0"], tmp)
        self.servers.append(ns)
        self.namesrv = ns.addresses["namesrv"]
        (tmp / "broker.toml").write_text(
            f'[broker]\nname = "{BROKER}"\nlisten = "127.0.0.1:{free_port()}"\n'
            f'namesrv = ["{self.namesrv}"]\ndata_dir = "{tmp / "data"}"\n'
        )
        broker = Server(["broker", "-c", str(tmp / "broker.toml")], tmp)
        self.servers.append(broker)
        self.broker = broker.addresses["broker"]
        self.loop = LoopThread("test-admin-consumers")

    def admin(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        out = run_admin(self.namesrv, *args, cwd=self.tmp, ok=ok)
        if not ok:
            assert out.returncode == 1, out.stdout
            assert out.stderr.startswith("tidemq admin: error: ") and out.stderr.count("\n") == 1, out.stderr
        return out

    def call(self, code: int, fields: dict[str, Any], body: bytes | None = None) -> RemotingCommand:
        async def go() -> RemotingCommand:
            client = AdminClient(self.namesrv, timeout=15)
            try:
                return await client.call(self.broker, code, fields, body, ok=tuple(range(-1, 400)))
            finally:
                await client.close()

        return self.loop.run(go())

    def send(self, topic: str, n: int, prefix: str) -> list[Any]:
        async def go() -> list[Any]:
            async with Producer("PG_ADMIN_CONSUMERS", namesrv=self.namesrv) as p:
                return [
                    await p.send(Message(topic, f"{prefix}-{i}".encode(), keys=f"{prefix}-{i}"))
                    for i in range(n)
                ]

        return self.loop.run(go())

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        for qid, off in offsets.items():
            resp = self.call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": topic, "queueId": qid, "commitOffset": off},
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark

    def committed(self, group: str, topic: str, qid: int) -> int:
        resp = self.call(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": qid}
        )
        return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else -1

    def close(self) -> None:
        self.loop.stop()
        for s in reversed(self.servers):
            s.stop()


class Live:
    """A tidemq push consumer of ``group`` recording every body it is handed."""

    def __init__(self, env: Env, group: str, topic: str) -> None:
        self.env = env
        self.bodies: list[str] = []
        self.lock = threading.Lock()
        # Offsets persisted every second (the client's default is 5 s): the fixture waits for them.
        self.consumer = PushConsumer(
            group, namesrv=env.namesrv, consume_from="first", rebalance_interval_s=2, persist_interval_s=1.0
        )
        self.consumer.subscribe(topic)
        self.consumer.register_listener(self._on)
        env.loop.run(self.consumer.start())

    def _on(self, msgs: list[Any]) -> None:
        with self.lock:
            self.bodies.extend(m.body.decode() for m in msgs)

    def count(self, body: str) -> int:
        with self.lock:
            return self.bodies.count(body)

    @property
    def client_id(self) -> str:
        return self.consumer.instance.client_id

    def stop(self) -> None:
        self.env.loop.run(self.consumer.shutdown())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("admin-consumers"))
    try:
        e.admin("updateTopic", "-t", TOPIC, "-r", "2", "-w", "2")
        yield e
    finally:
        e.close()


@pytest.fixture(scope="module")
def live(env: Env) -> Iterator[tuple[Live, list[Any]]]:
    """Group G_LIVE consuming TOPIC, after 6 messages were sent and consumed."""
    consumer = Live(env, "G_LIVE", TOPIC)
    sent = env.send(TOPIC, 6, "first")
    assert wait_for(lambda: all(consumer.count(f"first-{i}") >= 1 for i in range(6)), 30)
    # Offsets reach the broker every persist interval (1 s here): wait for them to be committed.
    assert wait_for(lambda: env.committed("G_LIVE", TOPIC, 0) + env.committed("G_LIVE", TOPIC, 1) == 6, 20)
    yield consumer, sent
    consumer.stop()


# ---------------------------------------------------------------------- fastjson bodies
def test_mq_keyed_maps_round_trip_and_malformed_bodies_are_refused() -> None:
    mq = MessageQueue("T", "b", 3)
    body = mqjson.dumps({"offsetTable": {mq: 7}, "ids": {0: 1}})
    assert body == b'{"offsetTable":{{"brokerName":"b","queueId":3,"topic":"T"}:7},"ids":{0:1}}'
    assert mqjson.loads(body) == {"offsetTable": {mq: 7}, "ids": {0: 1}}
    text_key = b'{"t":{"{\\"topic\\":\\"T\\",\\"brokerName\\":\\"b\\",\\"queueId\\":3}":7}}'
    assert mqjson.mq_map(mqjson.loads(text_key)["t"]) == {mq: 7}
    rows = [{"topic": "T", "brokerName": "b", "queueId": 3, "offset": 9}]
    assert mqjson.mq_map(rows, "offset") == {mq: 9}
    for bad in (b"{", b'{"a":}', b'{{"x":1}:2}', b"[1,2", b"{} x"):
        with pytest.raises(mqjson.MQJsonError):
            mqjson.mq_map(mqjson.loads(bad))


# ---------------------------------------------------------------------- connection, status
def test_consumer_connection_and_status(env: Env, live: tuple[Live, list[Any]]) -> None:
    consumer, _ = live
    cid = consumer.client_id
    out = env.admin("consumerConnection", "-g", "G_LIVE").stdout
    assert cid in out and "V4_9_3" in out
    assert f"{TOPIC:<20} *" in out and "ConsumeType: CONSUME_PASSIVELY" in out
    assert "MessageModel: CLUSTERING" in out and "ConsumeFromWhere: CONSUME_FROM_FIRST_OFFSET" in out

    one = env.admin("consumerStatus", "-g", "G_LIVE", "-i", cid).stdout
    assert one.startswith("#Consumer Properties#\n")
    assert "PROP_CONSUMEORDERLY                     : false" in one
    assert "PROP_CONSUME_TYPE                       : CONSUME_PASSIVELY" in one
    assert f"PROP_NAMESERVER_ADDR                    : {env.namesrv};" in one
    assert f"Topic: {TOPIC:<40} ClassFilter: false    SubExpression: *" in one
    offsets = [line.split() for line in one.split("#Consumer Offset#\n")[1].split("\n\n")[0].splitlines()[1:]]
    assert sorted((r[0], r[1], r[2]) for r in offsets if r[0] == TOPIC) == [
        (TOPIC, BROKER, "0"),
        (TOPIC, BROKER, "1"),
    ]
    assert sum(int(r[3]) for r in offsets if r[0] == TOPIC) == 6
    assert "ProcessQueueInfo [commitOffset=" in one and "#Consumer RT&TPS#" in one
    assert "#Consumer jstack#" not in one
    with_stack = env.admin("consumerStatus", "-g", "G_LIVE", "-i", cid, "-s").stdout
    assert "#Consumer jstack#" in with_stack and "test-admin-consumers" in with_stack

    everyone = env.admin("consumerStatus", "-g", "G_LIVE").stdout
    row = everyone.splitlines()[1].split()
    assert row[:3] == ["1", cid, "V4_9_3"]
    assert (env.tmp / row[3]).read_text().startswith("#Consumer Properties#")
    assert "Rebalance OK" in everyone

    missing = env.admin("consumerStatus", "-g", "G_LIVE", "-i", "10.0.0.9@nobody", ok=False)
    assert "not online" in missing.stderr
    assert "not online" in env.admin("consumerConnection", "-g", "G_NOBODY", ok=False).stderr


def test_running_info_and_status_bodies(env: Env, live: tuple[Live, list[Any]]) -> None:
    consumer, _ = live
    resp = env.call(
        RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G_LIVE", "clientId": consumer.client_id}
    )
    assert resp.code == ResponseCode.SUCCESS
    assert b'"mqTable":{{"brokerName":"' + BROKER.encode() + b'","queueId":0,"topic":"' in resp.body
    info = mqjson.loads(resp.body)
    assert set(info) == {"properties", "subscriptionSet", "mqTable", "statusTable"}
    pq = info["mqTable"][MessageQueue(TOPIC, BROKER, 0)]
    assert set(pq) >= {"commitOffset", "cachedMsgCount", "locked", "droped", "lastPullTimestamp"}
    assert info["statusTable"][TOPIC]["consumeOKTPS"] > 0
    assert {s["topic"] for s in info["subscriptionSet"]} == {TOPIC, "%RETRY%G_LIVE"}

    status = env.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": "G_LIVE"})
    assert status.code == ResponseCode.SUCCESS
    table = mqjson.loads(status.body)
    assert table["messageQueueTable"] == {}
    offsets = table["consumerTable"][consumer.client_id]
    assert sum(offsets[MessageQueue(TOPIC, BROKER, q)] for q in (0, 1)) == 6
    other = env.call(
        RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
        {"topic": TOPIC, "group": "G_LIVE", "clientAddr": "x@y"},
    )
    assert mqjson.loads(other.body)["consumerTable"] == {}
    none = env.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": "G_NOBODY"})
    assert none.code == ResponseCode.SYSTEM_ERROR and "G_NOBODY" in (none.remark or "")
    nobody = env.call(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G_LIVE", "clientId": "a@b"})
    assert nobody.code == ResponseCode.SYSTEM_ERROR and "not online" in (nobody.remark or "")
    no_header = env.call(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G_LIVE"})
    assert no_header.code != ResponseCode.SUCCESS and "clientId" in (no_header.remark or "")


# ---------------------------------------------------------------------- consume directly
def test_query_msg_resend_to_a_live_consumer(env: Env, live: tuple[Live, list[Any]]) -> None:
    consumer, sent = live
    cid = consumer.client_id
    before = consumer.count("first-2")
    out = env.admin("queryMsgById", "-i", sent[2].offset_msg_id, "-g", "G_LIVE", "-d", cid).stdout
    assert out.startswith(
        "ConsumeMessageDirectlyResult [order=false, autoCommit=true, consumeResult=CR_SUCCESS, remark=null"
    )
    assert consumer.count("first-2") == before + 1

    by_key = env.admin("queryMsgByUniqueKey", "-i", sent[3].msg_id, "-t", TOPIC).stdout
    assert f"OffsetID:            {sent[3].offset_msg_id}" in by_key and "first-3" in by_key
    resent = env.admin(
        "queryMsgByUniqueKey", "-i", sent[3].msg_id, "-t", TOPIC, "-g", "G_LIVE", "-d", cid
    ).stdout
    assert "consumeResult=CR_SUCCESS" in resent and consumer.count("first-3") == before + 1

    body = env.call(
        RequestCode.CONSUME_MESSAGE_DIRECTLY,
        {"consumerGroup": "G_LIVE", "clientId": cid, "msgId": sent[4].offset_msg_id},
    )
    result = mqjson.loads(body.body)
    assert result["consumeResult"] == "CR_SUCCESS" and result["order"] is False and "spentTimeMills" in result
    bad = env.call(
        RequestCode.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": "G_LIVE", "clientId": cid, "msgId": "zz"}
    )
    assert bad.code == ResponseCode.SYSTEM_ERROR and "zz" in (bad.remark or "")
    gone = env.admin("queryMsgById", "-i", sent[2].offset_msg_id, "-g", "G_LIVE", "-d", "1.2.3.4@x", ok=False)
    assert "not online" in gone.stderr


# ---------------------------------------------------------------------- progress, allocation
def test_consumer_progress_every_group_and_client_ip(env: Env, live: tuple[Live, list[Any]]) -> None:
    consumer, _ = live
    summary = env.admin("consumerProgress").stdout.splitlines()
    assert summary[0].split() == ["#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff", "Total"]
    row = next(line.split() for line in summary if line.startswith("G_LIVE "))
    assert row[1:5] == ["1", "V4_9_3", "PUSH", "CLUSTERING"] and row[6] == "0"
    detail = env.admin("consumerProgress", "-g", "G_LIVE", "-s", "true").stdout
    lines = [line.split() for line in detail.splitlines() if line.startswith(TOPIC)]
    ip = consumer.client_id.split("@")[0]
    assert len(lines) == 2 and all(r[5] == ip and r[6] == "0" for r in lines)
    assert "Consume TPS: " in detail and "Diff Total: 0" in detail


def test_allocate_mq(env: Env) -> None:
    out = env.admin("allocateMQ", "-t", TOPIC, "-i", "10.0.0.1,10.0.0.2,10.0.0.3").stdout
    result = mqjson.loads(out)["result"]
    assert result["10.0.0.1"] == [{"brokerName": BROKER, "queueId": 0, "topic": TOPIC}]
    assert result["10.0.0.2"] == [{"brokerName": BROKER, "queueId": 1, "topic": TOPIC}]
    assert result["10.0.0.3"] == []


# ---------------------------------------------------------------------- offsets
def test_reset_offset_of_a_live_group_replays_messages(env: Env, live: tuple[Live, list[Any]]) -> None:
    consumer, _ = live
    out = env.admin("resetOffsetByTime", "-g", "G_LIVE", "-t", TOPIC, "-s", "0").stdout
    assert out.startswith(
        f"rollback consumer offset by specified group[G_LIVE], topic[{TOPIC}], force[true], "
        "timestamp(string)[0], timestamp(long)[0]"
    )
    rows = [line.split() for line in out.splitlines()[2:]]
    assert rows == [[BROKER, "0", "0"], [BROKER, "1", "0"]]
    # The client dropped its queues, committed 0 and consumes everything again.
    assert wait_for(lambda: all(consumer.count(f"first-{i}") >= 2 for i in range(6)), 30)
    # As a C++ admin (-c): the client gets the list form (ResetOffsetBodyForC) and reads it too.
    env.admin("resetOffsetByTime", "-g", "G_LIVE", "-t", TOPIC, "-s", "0", "-c")
    assert wait_for(lambda: all(consumer.count(f"first-{i}") >= 3 for i in range(6)), 30)

    skipped_to = env.send(TOPIC, 2, "second")
    assert wait_for(lambda: consumer.count("second-1") >= 1, 30)
    resp = env.call(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        {"topic": TOPIC, "group": "G_LIVE", "timestamp": -1, "isForce": True},
    )
    assert resp.code == ResponseCode.SUCCESS
    table = mqjson.mq_map(mqjson.loads(resp.body)["offsetTable"])
    assert sum(table.values()) == 8 and set(table) == {MessageQueue(TOPIC, BROKER, q) for q in (0, 1)}
    assert len(skipped_to) == 2
    skip = env.admin("skipAccumulatedMessage", "-g", "G_LIVE", "-t", TOPIC).stdout
    assert skip.splitlines()[0].split() == ["#brokerName", "#queueId", "#offset"]
    assert sum(int(line.split()[2]) for line in skip.splitlines()[1:]) == 8


def test_reset_offset_of_an_offline_group_falls_back(env: Env) -> None:
    env.admin("updateTopic", "-t", "OfflineT", "-r", "2", "-w", "2")
    env.send("OfflineT", 4, "off")
    env.commit("G_OFF", "OfflineT", {0: 2, 1: 2})
    resp = env.call(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        {"topic": "OfflineT", "group": "G_OFF", "timestamp": 0, "isForce": True},
    )
    assert resp.code == ResponseCode.CONSUMER_NOT_ONLINE and "G_OFF" in (resp.remark or "")

    out = env.admin("resetOffsetByTime", "-g", "G_OFF", "-t", "OfflineT", "-s", "now", "-f", "false").stdout
    assert out.splitlines()[0].startswith(
        "rollback consumer offset by specified consumerGroup[G_OFF], topic[OfflineT], force[false]"
    )
    assert out.splitlines()[1].split() == [
        "#brokerName",
        "#queueId",
        "#brokerOffset",
        "#consumerOffset",
        "#timestampOffset",
        "#rollbackOffset",
    ]
    rows = [line.split() for line in out.splitlines()[2:]]
    # Not forced: "now" is ahead of offset 2, so nothing moves.
    assert [r[3] for r in rows] == ["2", "2"] and [r[5] for r in rows] == ["2", "2"]

    out = env.admin(
        "resetOffsetByTime", "-g", "G_OFF", "-t", "OfflineT", "-s", "1970-01-01#00:00:00:000"
    ).stdout
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[5] for r in rows] == ["0", "0"]
    assert env.committed("G_OFF", "OfflineT", 0) == 0 and env.committed("G_OFF", "OfflineT", 1) == 0

    skip = env.admin("skipAccumulatedMessage", "-g", "G_OFF", "-t", "OfflineT").stdout
    assert skip.splitlines()[0].split()[0] == "#brokerName"
    total = sum(env.committed("G_OFF", "OfflineT", q) for q in (0, 1))
    assert total == 4

    bad = env.admin("resetOffsetByTime", "-g", "G_OFF", "-t", "OfflineT", "-s", "yesterday", ok=False)
    assert "yesterday" in bad.stderr
    never = env.admin("resetOffsetByTime", "-g", "G_NEVER", "-t", "OfflineT", "-s", "now", ok=False)
    assert "G_NEVER" in never.stderr


def test_clone_group_offset_and_correction_offset(env: Env) -> None:
    env.admin("updateTopic", "-t", "CloneT", "-r", "2", "-w", "2")
    env.send("CloneT", 6, "clone")
    env.commit("G_SRC", "CloneT", {0: 3, 1: 1})
    env.commit("G_OTHER", "CloneT", {0: 2, 1: 3})
    out = env.admin("cloneGroupOffset", "-s", "G_SRC", "-d", "G_DEST", "-t", "CloneT").stdout
    assert out.strip() == "clone group offset success. srcGroup[G_SRC], destGroup=[G_DEST], topic[CloneT]"
    assert [env.committed("G_DEST", "CloneT", q) for q in (0, 1)] == [3, 1]
    progress = env.admin("consumerProgress", "-g", "G_DEST", "-t", "CloneT").stdout
    assert "Diff Total: 2" in progress  # 3 + 3 stored, 3 + 1 committed

    resp = env.call(
        RequestCode.QUERY_CORRECTION_OFFSET,
        {"topic": "CloneT", "compareGroup": "G_OTHER", "filterGroups": "G_OTHER,G_DEST"},
    )
    # Without G_OTHER, the lowest offsets are G_SRC's (3, 1); G_OTHER is behind on queue 0.
    assert resp.code == ResponseCode.SUCCESS
    assert resp.body == b'{"correctionOffsets":{0:' + str(2**63 - 1).encode() + b",1:1}}"
    resp = env.call(RequestCode.QUERY_CORRECTION_OFFSET, {"topic": "CloneT", "compareGroup": "G_SRC"})
    # Unfiltered, the compared group is one of "all groups": never behind their minimum.
    assert mqjson.loads(resp.body)["correctionOffsets"] == {0: 2, 1: 1}
    missing = env.call(RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": "G_SRC"})
    assert missing.code != ResponseCode.SUCCESS and "destGroup" in (missing.remark or "")


def test_pull_consumer_answers_reset_and_status(env: Env) -> None:
    env.admin("updateTopic", "-t", "PullT", "-r", "1", "-w", "1")
    env.send("PullT", 3, "pull")
    consumer = PullConsumer("G_PULL", namesrv=env.namesrv)
    mq = MessageQueue("PullT", BROKER, 0)

    async def start() -> None:
        await consumer.start()
        consumer._topics.add("PullT")
        await consumer.assign([mq])
        await consumer.update_consume_offset(mq, 3)
        await consumer.instance.send_heartbeats()

    env.loop.run(start())
    try:
        out = env.admin("resetOffsetByTime", "-g", "G_PULL", "-t", "PullT", "-s", "0").stdout
        assert [line.split() for line in out.splitlines()[2:]] == [[BROKER, "0", "0"]]
        assert wait_for(lambda: consumer.position(mq) == 0, 10)
        assert env.committed("G_PULL", "PullT", 0) == 0
        status = env.call(
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": "PullT", "group": "G_PULL"}
        )
        assert mqjson.loads(status.body)["consumerTable"][consumer.instance.client_id] == {mq: 0}
        info = env.admin("consumerStatus", "-g", "G_PULL", "-i", consumer.instance.client_id).stdout
        assert "PROP_CONSUME_TYPE                       : CONSUME_ACTIVELY" in info
        direct = env.call(
            RequestCode.GET_CONSUMER_RUNNING_INFO,
            {"consumerGroup": "G_PULL", "clientId": consumer.instance.client_id},
        )
        assert direct.code == ResponseCode.SUCCESS
    finally:
        env.loop.run(consumer.shutdown())


def test_client_refuses_malformed_operator_requests() -> None:
    """A broker's 220/221/307/309 the client cannot serve gets SYSTEM_ERROR, never a crash."""
    from tidemq.client import ClientInstance

    async def go() -> list[RemotingCommand | None]:
        instance = ClientInstance("127.0.0.1:1")
        consumer = PushConsumer("G_UNIT", instance=instance)
        consumer.subscribe("UnitT")
        consumer.register_listener(lambda msgs: None)
        instance.register_consumer(consumer)
        handle = instance._handle_server_request
        reqs = [
            RemotingCommand.request(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET, {"topic": "UnitT", "group": "G_UNIT"}, b"{x"
            ),
            RemotingCommand.request(
                RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G_OTHER", "clientId": "c"}
            ),
            RemotingCommand.request(
                RequestCode.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": "G_UNIT"}, b"\x00\x01"
            ),
            RemotingCommand.request(
                RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"topic": "UnitT", "group": "G_UNIT"}
            ),
            RemotingCommand.request(
                RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "G_UNIT", "clientId": "c"}
            ),
        ]
        return [await handle(None, r) for r in reqs]  # type: ignore[arg-type]

    bad_reset, other_group, bad_msg, status, info = asyncio.run(go())
    assert bad_reset is not None and bad_reset.code == ResponseCode.SYSTEM_ERROR
    assert other_group is not None and other_group.code == ResponseCode.SYSTEM_ERROR
    assert "G_OTHER" in (other_group.remark or "")
    assert bad_msg is not None and bad_msg.code == ResponseCode.SYSTEM_ERROR
    assert status is not None and mqjson.loads(status.body) == {"consumerTable": {}, "messageQueueTable": {}}
    assert info is not None and info.code == ResponseCode.SUCCESS
    props = mqjson.loads(info.body)["properties"]
    assert (
        props["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY" and props["PROP_NAMESERVER_ADDR"] == "127.0.0.1:1;"
    )
