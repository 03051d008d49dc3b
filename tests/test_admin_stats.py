"""``tidemq admin`` statistics, queue and message-printing commands against a NameServer and a
broker started with the command line (one pair for the module), checked as an operator sees them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server, free_port, run_admin, runtime_info, wait_for

from tidemq.admin.stats import json_body, parse_timestamp, readable
from tidemq.client import Message
from tidemq.client.admin import AdminClient, AdminError
from tidemq.client.blocking import BlockingProducer
from tidemq.message import java_string_hash
from tidemq.remoting.codes import RequestCode

pytestmark = pytest.mark.timeout(180)

TOPIC = "Orders"
GROUP = "cg-stats"


class Cluster:
    def __init__(self, namesrv: str, broker: str, cwd: Path):
        self.namesrv, self.broker, self.cwd = namesrv, broker, cwd

    def admin(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return run_admin(self.namesrv, *args, cwd=self.cwd, ok=ok)

    def many(self, *calls: tuple[str, ...]) -> list[str]:
        """Run independent commands at once (each must succeed); their outputs, in order."""
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=self.cwd,
            )
            for args in calls
        ]
        outs = []
        for args, proc in zip(calls, procs, strict=True):
            stdout, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0 and "Traceback" not in stderr, (args, stderr)
            outs.append(stdout)
        return outs


async def _consume(namesrv: str, broker: str) -> None:
    """Group GROUP pulls 2 messages of queue 1 (the broker counts them) and commits offset 2."""
    client = AdminClient(namesrv)
    try:
        fields = {
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": 1,
            "queueOffset": 0,
            "maxMsgNums": 2,
            "sysFlag": 4,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
            "expressionType": "TAG",
        }
        await client.call(broker, RequestCode.PULL_MESSAGE, fields)
        await client.call(
            broker,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 1, "commitOffset": 2},
        )
    finally:
        await client.close()


async def _create_topic(broker: str) -> None:
    client = AdminClient("127.0.0.1:1")  # only the broker is asked
    try:
        fields = {"topic": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
        await client.call(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("admin-stats")
    servers: list[Server] = []
    producer = None
    try:
        servers.append(Server(["namesrv", "--listen", "127.0.0.1:0"], tmp))
        ns = servers[0].addresses["namesrv"]
        (tmp / "broker.toml").write_text(
            f'[broker]\nname = "broker-s"\ncluster = "CS"\nlisten = "127.0.0.1:{free_port()}"\n'
            f'namesrv = ["{ns}"]\ndata_dir = "{tmp / "data"}"\n'
        )
        servers.append(Server(["broker", "-c", str(tmp / "broker.toml")], tmp))
        broker = servers[1].addresses["broker"]
        c = Cluster(ns, broker, tmp)
        asyncio.run(_create_topic(broker))
        producer = BlockingProducer("pg-stats", ns)
        producer.start()
        for i, tag in enumerate(["red", "blue", "red"]):
            # All to queue 1: queue 0 stays empty.
            result = producer.send_orderly(
                Message(TOPIC, f"body-{i}".encode(), tags=tag), 1, lambda qs, m, k: qs[1]
            )
            assert result.queue.queue_id == 1
        asyncio.run(_consume(ns, broker))
        # The producer's heartbeat reached the broker (producerConnection / producer read it).
        assert wait_for(lambda: runtime_info(broker)["producerGroupCount"] != "0", 20)
        yield c
    finally:
        if producer is not None:
            producer.shutdown()
        for server in reversed(servers):
            server.stop()


def test_broker_status(cluster: Cluster) -> None:
    out = cluster.admin("brokerStatus", "-b", cluster.broker).stdout
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert lines["msgPutTotalTodayNow".ljust(32)] == "3"
    assert lines["brokerName".ljust(32)] == "broker-s"
    assert len(lines["putTps".ljust(32)].split()) == 3
    by_cluster = cluster.admin("brokerStatus", "-c", "CS").stdout
    assert any(
        line.startswith(f"{cluster.broker} ") and "msgGetTotalTodayNow" in line
        for line in by_cluster.splitlines()
    )
    # The NameServer is no broker: one line, exit 1.
    bad = cluster.admin("brokerStatus", "-b", cluster.namesrv, ok=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "GET_BROKER_RUNTIME_INFO" in bad.stderr


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


async def _minute_tps(broker: str, name: str, key: str) -> float:
    client = AdminClient("127.0.0.1:1")  # only the broker is asked
    try:
        resp = await client.call(
            broker, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key}
        )
        return float(json_body(resp.body, "VIEW_BROKER_STATS_DATA")["statsMinute"]["tps"])
    finally:
        await client.close()


def test_stats_all(cluster: Cluster) -> None:
    # The minute's TPS decays as time passes: statsAll's must lie between the broker's before and after.
    tps_keys = [("TOPIC_PUT_NUMS", TOPIC), ("GROUP_GET_NUMS", f"{TOPIC}@{GROUP}")]
    before = [asyncio.run(_minute_tps(cluster.broker, *k)) for k in tps_keys]
    rows = _rows(cluster.admin("statsAll", "-t", TOPIC).stdout)
    after = [asyncio.run(_minute_tps(cluster.broker, *k)) for k in tps_keys]
    assert len(rows) == 1
    topic, group, backlog, in_tps, out_tps, in_24h, out_24h = rows[0]
    assert (topic, group, backlog, in_24h, out_24h) == (TOPIC, GROUP, "1", "3", "2")
    for printed, lo, hi in zip((in_tps, out_tps), after, before, strict=True):
        assert round(lo, 2) - 0.01 <= float(printed) <= round(hi, 2) + 0.01
    every, active_out = cluster.many(("statsAll",), ("statsAll", "-a"))
    assert "TBW102" in every and "NO_CONSUMER" in every
    active = [r[0] for r in _rows(active_out)]
    assert TOPIC in active and "TBW102" not in active


def test_broker_consume_stats(cluster: Cluster) -> None:
    out, lagging, ordered = cluster.many(
        ("brokerConsumeStats", "-b", cluster.broker),
        ("brokerConsumeStats", "-b", cluster.broker, "-l", "2"),
        ("brokerConsumeStats", "-b", cluster.broker, "-o", "true"),
    )
    rows = [r for r in _rows(out) if r and r[0] == TOPIC]
    # As mqadmin: only queues the group consumed from are listed (queue 0 never was).
    assert [r[:7] for r in rows] == [[TOPIC, GROUP, "broker-s", "1", "3", "2", "1"]]
    assert rows[0][7] == time.strftime("%Y-%m-%d", time.localtime())
    assert "Diff Total: 1" in out
    # -l 2: queue 1 lags by 1 only; the broker's total stays.
    assert not [r for r in _rows(lagging) if r and r[0] == TOPIC] and "Diff Total: 1" in lagging
    assert TOPIC not in ordered and "Diff Total: 0" in ordered


def test_producers(cluster: Cluster) -> None:
    out = cluster.admin("producerConnection", "-g", "pg-stats", "-t", TOPIC).stdout.splitlines()
    assert len(out) == 1 and out[0].startswith("0001  ") and "PYTHON" in out[0]
    assert out[0].split()[-1].startswith("V")  # the version's name, as mqadmin (MQVersion)
    missing = cluster.admin("producerConnection", "-g", "no-such-pg", "-t", TOPIC, ok=False)
    assert missing.returncode == 1 and "the producer group[no-such-pg] not exist" in missing.stderr
    listing = cluster.admin("producer", "-b", cluster.broker).stdout
    line = next(x for x in listing.splitlines() if x.startswith("producer group (pg-stats) instance : "))
    assert "clientId=" in line and "language=PYTHON" in line and "lastUpdateTimestamp=" in line


def test_query_cq(cluster: Cluster) -> None:
    out, grouped = cluster.many(
        ("queryCq", "-t", TOPIC, "-q", "1", "-i", "1", "-c", "5"),
        ("queryCq", "-t", TOPIC, "-q", "1", "-i", "0", "-g", GROUP),
    )
    assert "Queue data: \nmax: 3, min: 0" in out
    assert out.count("idx: ") == 2 and "idx: 1\n" in out and "idx: 2\n" in out
    assert f"tagsCode={java_string_hash('blue')}," in out and "extendDataJson='null'" in out
    assert f"Filter data: \n{GROUP}@{TOPIC} is not online!" in grouped
    outside = cluster.admin("queryCq", "-t", TOPIC, "-q", "1", "-i", "9", ok=False)
    assert outside.returncode == 1 and "Index 9 of 1@Orders is not exist!" in outside.stderr


def test_query_msg_by_offset_and_print(cluster: Cluster) -> None:
    one = cluster.admin("queryMsgByOffset", "-t", TOPIC, "-b", "broker-s", "-i", "1", "-o", "1").stdout
    assert "Message Body:        body-1" in one and "Queue Offset:        1" in one
    none = cluster.admin("queryMsgByOffset", "-t", TOPIC, "-b", "broker-s", "-i", "0", "-o", "0", ok=False)
    assert none.returncode == 1 and none.stderr.count("\n") == 1

    printed, hidden, by_queue = cluster.many(
        ("printMsg", "-t", TOPIC, "-s", "red"),
        ("printMsg", "-t", TOPIC, "-d", "false"),
        (
            "printMsgByQueue",
            "-t",
            TOPIC,
            "-a",
            "broker-s",
            "-i",
            "1",
            "-p",
            "true",
            "-d",
            "true",
            "-f",
            "true",
        ),
    )
    assert "minOffset=0, maxOffset=3, MessageQueue [topic=Orders, brokerName=broker-s, queueId=1]" in printed
    bodies = [line.rsplit("BODY: ", 1)[1] for line in printed.splitlines() if line.startswith("MSGID: ")]
    assert bodies == ["body-0", "body-2"]
    assert hidden.count("BODY: NOT PRINT BODY") == 3

    assert by_queue.count("MSGID: ") == 3
    tags = [line.split() for line in by_queue.splitlines() if line.startswith("Tag: ")]
    assert tags == [["Tag:", "red", "Count:", "2"], ["Tag:", "blue", "Count:", "1"]]


def test_consume_message_with_mqadmin_flags(cluster: Cluster) -> None:
    later = str(int(time.time() * 1000) + 3_600_000)
    out, red, none = cluster.many(
        ("consumeMessage", "-t", TOPIC, "-b", "broker-s", "-i", "1", "-o", "1", "-c", "1"),
        ("consumeMessage", "-t", TOPIC, "--tags", "red"),
        ("consumeMessage", "-t", TOPIC, "-s", later),
    )
    assert "q1@1 " in out and "body=body-1" in out and "1 message(s)" in out
    assert "2 message(s)" in red and "body=body-1" not in red
    assert "0 message(s)" in none
    bad = cluster.admin("consumeMessage", "-t", TOPIC, "-i", "1", ok=False)
    assert bad.returncode == 1 and "-i QUEUE_ID needs -b BROKER_NAME" in bad.stderr


def test_topic_commands(cluster: Cluster) -> None:
    status_out, listing_out = cluster.many(("topicStatus", "-t", TOPIC), ("topicList", "-c"))
    status, listing = _rows(status_out), _rows(listing_out)
    assert [r[:4] for r in status] == [["broker-s", "0", "0", "0"], ["broker-s", "1", "0", "3"]]
    assert ["CS", TOPIC, GROUP] in listing and ["CS", "TBW102"] in listing


def test_cluster_list(cluster: Cluster) -> None:
    base = _rows(cluster.admin("clusterList").stdout)
    assert base[0][:5] == ["CS", "broker-s", "0", cluster.broker, "tidemq"]
    assert 0.0 <= float(base[0][-1]) <= 1.0  # #SPACE: the commit log disk's used ratio
    more = _rows(cluster.admin("clusterList", "-m").stdout)
    info = runtime_info(cluster.broker)  # nothing else runs meanwhile: the same figures
    today_in = int(info["msgPutTotalTodayNow"]) - int(info["msgPutTotalTodayMorning"])
    today_out = int(info["msgGetTotalTodayNow"]) - int(info["msgGetTotalTodayMorning"])
    assert today_in >= 3 and today_out >= 2
    assert more == [["CS", "broker-s", "0", "0", str(today_in), str(today_out)]]
    # -i repeats until interrupted.
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq", "admin", "clusterList", "-m", "-i", "1", "-n", cluster.namesrv],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        headers = 0
        deadline = time.monotonic() + 30
        while headers < 2 and time.monotonic() < deadline:
            if proc.stdout.readline().startswith("#Cluster Name"):
                headers += 1
        assert headers == 2
    finally:
        proc.terminate()
        proc.wait(10)


def test_send_probes(cluster: Cluster) -> None:
    # The broker-name and cluster-name topics ([broker] broker_topic_enable / cluster_topic_enable).
    status = cluster.admin("sendMsgStatus", "-b", "broker-s", "-c", "3", "-s", "64").stdout.splitlines()
    assert len(status) == 3 and all(
        line.startswith("rt=") and "sendStatus=SEND_OK" in line for line in status
    )
    assert "messageQueue=MessageQueue [topic=broker-s, brokerName=broker-s, queueId=0]" in status[0]
    rt = cluster.admin("checkMsgSendRT", "-t", TOPIC, "-a", "4", "-s", "32").stdout
    rows = _rows(rt.split("Avg RT:")[0])
    assert [r[:3] for r in rows] == [["broker-s", q, "true"] for q in ("0", "1", "0", "1")]
    assert float(rt.split("Avg RT: ")[1]) >= 0
    crt = _rows(cluster.admin("clusterRT", "-a", "3").stdout)
    assert crt[0][0:2] == ["CS", "broker-s"] and crt[0][3:] == ["3", "0"]
    missing = cluster.admin("sendMsgStatus", "-b", "no-such-broker", "-c", "1", ok=False)
    assert missing.returncode == 1 and "no-such-broker" in missing.stderr


def test_unreadable_answers_and_timestamps() -> None:
    @readable
    async def reads_a_missing_field() -> None:
        _ = {"offsetTable": {}}["brokerOffset"]

    with pytest.raises(AdminError, match="cannot read the broker's answer"):
        asyncio.run(reads_a_missing_field())
    with pytest.raises(AdminError, match="cannot read the X answer"):
        json_body(b'{"table": {{"a"', "X")
    with pytest.raises(AdminError, match="not a JSON object"):
        json_body(b"[1, 2]", "X")
    assert json_body(b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"x":1}}}', "X")
    assert parse_timestamp("1700000000000") == 1700000000000
    local = parse_timestamp("2024-01-02#03:04:05:006")
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(local / 1000)) == "2024-01-02 03:04:05"
    assert local % 1000 == 6
