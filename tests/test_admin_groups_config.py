"""Subscription groups, broker config at run time, maintenance and export, against a NameServer
and a broker started with the command line (one pair per module), over ``tidemq admin`` and RPC."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import Server, runtime_info, wait_for

from tidemq.admin import admin
from tidemq.client.admin import AdminClient
from tidemq.message import Prop, decode_message_id
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.testing.requests import send_fields

pytestmark = pytest.mark.timeout(120)

_NO_ENV = {k: None for k in os.environ if k.startswith("TIDEMQ_")}

CLUSTER = "C1"
BROKER = "broker-x"
GROUP_FIELDS = [
    "brokerId",
    "consumeBroadcastEnable",
    "consumeEnable",
    "consumeFromMinEnable",
    "groupName",
    "notifyConsumerIdsChangedEnable",
    "retryMaxTimes",
    "retryQueueNums",
    "whichBrokerWhenConsumeSlowly",
]


class Cluster:
    def __init__(self, root: Path, namesrv: Server, broker_toml: Path) -> None:
        self.root, self.namesrv_server, self.toml = root, namesrv, broker_toml
        self.namesrv = namesrv.addresses["namesrv"]
        self.data = root / "data"
        self.broker_server = self.start_broker()

    def start_broker(self) -> Server:
        self.broker_server = Server(["broker", "-c", str(self.toml)], self.root)
        self.broker = self.broker_server.addresses["broker"]
        return self.broker_server

    def admin(
        self, *args: str, ok: bool = True, lines: int = 1, process: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``tidemq admin`` in this process (click's runner: real sockets, no interpreter start-up;
        a traceback fails the test), or with ``process`` the real command line."""
        if process:
            out = subprocess.run(
                [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
                capture_output=True,
                text=True,
                timeout=30,
                cwd=self.root,
                env={**os.environ},
            )
        else:
            result = CliRunner().invoke(
                admin, [*args, "-n", self.namesrv], env=_NO_ENV, catch_exceptions=False
            )
            out = subprocess.CompletedProcess(
                ["tidemq", "admin", *args], result.exit_code, result.stdout, result.stderr
            )
        if ok:
            assert out.returncode == 0, out.stderr
        else:
            assert out.returncode == 1, out.stdout
            # One error line (a command over several brokers: one line per failed broker first).
            assert out.stderr.count("\n") == lines, out.stderr
            assert out.stderr.splitlines()[-1].startswith("tidemq admin: error: "), out.stderr
        return out

    def rpc(
        self, code: int, fields: dict[str, Any] | None = None, body: bytes | None = None
    ) -> RemotingCommand:
        async def main() -> RemotingCommand:
            client = AdminClient(self.namesrv)
            try:
                return await client.call(self.broker, code, fields, body, ok=tuple(range(-1, 400)))
            finally:
                await client.close()

        return asyncio.run(main())


def _broker_toml(root: Path, namesrv: str) -> Path:
    # Small commit-log files kept ~1 s, cleaned only on request (the hour is never this one).
    hour = (time.localtime().tm_hour + 12) % 24
    path = root / "broker.toml"
    path.write_text(
        f'[broker]\nname = "{BROKER}"\ncluster = "{CLUSTER}"\nlisten = "127.0.0.1:0"\n'
        f'namesrv = ["{namesrv}"]\ndata_dir = "{root / "data"}"\n'
        f'[store.mmap]\ncommitlog_file_size = 4096\nfile_reserved_hours = 0.0003\ndelete_when = "{hour:02d}"\n'
        f"preallocate = false\n"
    )
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("groups_config")
    namesrv = Server(["namesrv", "--listen", "127.0.0.1:0"], root)
    c = Cluster(root, namesrv, _broker_toml(root, namesrv.addresses["namesrv"]))
    try:
        yield c
    finally:
        c.broker_server.stop()
        namesrv.stop()


def _groups(cluster: Cluster) -> dict[str, Any]:
    resp = cluster.rpc(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert resp.code == ResponseCode.SUCCESS
    return dict(orjson.loads(resp.body))


def _config(cluster: Cluster) -> dict[str, str]:
    resp = cluster.rpc(RequestCode.GET_BROKER_CONFIG)
    assert resp.code == ResponseCode.SUCCESS
    return dict(line.split("=", 1) for line in resp.body.decode().splitlines())


def _send(cluster: Cluster, topic: str, body: bytes, props: dict[str, str] | None = None) -> RemotingCommand:
    return cluster.rpc(RequestCode.SEND_MESSAGE, send_fields(topic, 0, props), body)


# ---------------------------------------------------------------------------- subscription groups
def test_sub_group_lifecycle_with_mqadmin_output(cluster: Cluster) -> None:
    out = cluster.admin(
        "updateSubGroup", "-b", cluster.broker, "-g", "G1", "-q", "3", "-r", "5", "-i", "0", process=True
    ).stdout
    assert out.splitlines() == [
        f"create subscription group to {cluster.broker} success.",
        "SubscriptionGroupConfig [groupName=G1, consumeEnable=true, consumeFromMinEnable=false, "
        "consumeBroadcastEnable=false, retryQueueNums=3, retryMaxTimes=5, brokerId=0, "
        "whichBrokerWhenConsumeSlowly=1, notifyConsumerIdsChangedEnable=true]",
    ]
    wrapper = _groups(cluster)
    assert sorted(wrapper) == ["dataVersion", "subscriptionGroupTable"]
    assert sorted(wrapper["dataVersion"]) == ["counter", "timestamp"]
    g1 = wrapper["subscriptionGroupTable"]["G1"]
    assert sorted(g1) == GROUP_FIELDS
    assert (g1["retryQueueNums"], g1["retryMaxTimes"], g1["consumeBroadcastEnable"]) == (3, 5, False)
    # On disk when answered.
    on_disk = json.loads((cluster.data / "config" / "subscriptionGroup.json").read_text())
    assert on_disk["subscriptionGroupTable"]["G1"]["retryQueueNums"] == 3

    shown = cluster.admin("getConsumerConfig", "-g", "G1").stdout.splitlines()
    assert shown[0] == f"============================={CLUSTER}:{BROKER}============================="
    assert f"{'retryQueueNums':<40}=  3" in shown and f"{'groupName':<40}=  G1" in shown
    assert len(shown) == 10

    # By cluster: every master, then the config once.
    out = cluster.admin("updateSubGroup", "-c", CLUSTER, "-g", "G1", "-s", "false").stdout
    assert out.splitlines()[0] == f"create subscription group to {cluster.broker} success."
    assert _groups(cluster)["subscriptionGroupTable"]["G1"]["consumeEnable"] is False

    out = cluster.admin("deleteSubGroup", "-b", cluster.broker, "-g", "G1").stdout
    assert out.strip() == f"delete subscription group [G1] from broker [{cluster.broker}] success."
    assert "G1" not in _groups(cluster)["subscriptionGroupTable"]
    # By cluster: the group's retry and dead-letter topics go too.
    cluster.admin("updateSubGroup", "-c", CLUSTER, "-g", "G3")
    assert _send(cluster, "%RETRY%G3", b"r").code == ResponseCode.SUCCESS
    out = cluster.admin("deleteSubGroup", "-c", CLUSTER, "-g", "G3").stdout.splitlines()
    assert out == [
        f"delete subscription group [G3] from broker [{cluster.broker}] in cluster [{CLUSTER}] success.",
        f"delete topic [%RETRY%G3] from cluster [{CLUSTER}] success.",
        "delete topic [%RETRY%G3] from NameServer success.",
        f"delete topic [%DLQ%G3] from cluster [{CLUSTER}] success.",
        "delete topic [%DLQ%G3] from NameServer success.",
    ]
    topics = orjson.loads(cluster.rpc(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
    assert "%RETRY%G3" not in topics and "G3" not in _groups(cluster)["subscriptionGroupTable"]
    missing = cluster.admin("getConsumerConfig", "-g", "G1", ok=False, process=True)
    assert "no broker has subscription group 'G1'" in missing.stderr
    nowhere = cluster.admin("updateSubGroup", "-g", "G2", ok=False)
    assert "give -b" in nowhere.stderr


def test_disabled_group_cannot_pull_and_delete_can_remove_offsets(cluster: Cluster) -> None:
    assert _send(cluster, "PullT", b"x").code == ResponseCode.SUCCESS
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "Off", "-s", "false")
    pull = {
        "consumerGroup": "Off",
        "topic": "PullT",
        "queueId": 0,
        "queueOffset": 0,
        "maxMsgNums": 4,
        "sysFlag": 4,  # FLAG_SUBSCRIPTION: the subscription comes with the pull
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
        "expressionType": "TAG",
    }
    refused = cluster.rpc(RequestCode.PULL_MESSAGE, pull)
    assert refused.code == ResponseCode.NO_PERMISSION and "Off" in (refused.remark or "")
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "Off", "-s", "true")
    assert cluster.rpc(RequestCode.PULL_MESSAGE, pull).code == ResponseCode.SUCCESS

    commit = {"consumerGroup": "Off", "topic": "PullT", "queueId": 0, "commitOffset": 1}
    assert cluster.rpc(RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == ResponseCode.SUCCESS
    offsets = orjson.loads(cluster.rpc(RequestCode.GET_ALL_CONSUMER_OFFSET).body)["offsetTable"]
    assert "PullT@Off" in offsets
    cluster.admin("deleteSubGroup", "-b", cluster.broker, "-g", "Off", "-r", "true")
    offsets = orjson.loads(cluster.rpc(RequestCode.GET_ALL_CONSUMER_OFFSET).body)["offsetTable"]
    assert "PullT@Off" not in offsets


def test_send_back_follows_the_group_retry_settings(cluster: Cluster) -> None:
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "R0", "-r", "0")
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "R3", "-q", "3", "-r", "4")
    sent = _send(cluster, "BackT", b"failed once")
    _, offset = decode_message_id(sent.ext_fields["msgId"])
    for group in ("R0", "R3"):
        fields = {"offset": offset, "group": group, "delayLevel": 0, "originTopic": "BackT"}
        resp = cluster.rpc(RequestCode.CONSUMER_SEND_MSG_BACK, fields)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    topics = orjson.loads(cluster.rpc(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
    assert "%DLQ%R0" in topics and "%RETRY%R0" not in topics  # no retry allowed: dead at once
    assert topics["%RETRY%R3"]["writeQueueNums"] == 3 and "%DLQ%R3" not in topics


@pytest.mark.parametrize(
    ("body", "remark"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "should be a JSON object"),
        (b'{"consumeEnable": true}', "groupName is missing"),
        (b'{"groupName": "G", "retryQueueNums": -1}', "retryQueueNums = -1 is out of range"),
        (b'{"groupName": "G", "consumeEnable": "yes"}', "consumeEnable should be true or false"),
        (b'{"groupName": "G", "retryMaxTimes": "5"}', "retryMaxTimes should be an integer"),
        (b'{"groupName": "a/b"}', "a/b"),
    ],
)
def test_bad_group_bodies_are_refused(cluster: Cluster, body: bytes, remark: str) -> None:
    resp = cluster.rpc(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    assert resp.code == ResponseCode.SYSTEM_ERROR and remark in (resp.remark or ""), resp.remark
    assert "G" not in _groups(cluster)["subscriptionGroupTable"]


def test_delete_group_needs_its_name(cluster: Cluster) -> None:
    resp = cluster.rpc(RequestCode.DELETE_SUBSCRIPTIONGROUP, {})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "groupName" in (resp.remark or "")


# ---------------------------------------------------------------------------- broker config
def test_get_broker_config_properties_and_version(cluster: Cluster) -> None:
    resp = cluster.rpc(RequestCode.GET_BROKER_CONFIG)
    assert resp.code == ResponseCode.SUCCESS
    version = orjson.loads(resp.ext_fields["version"])
    assert sorted(version) == ["counter", "timestamp"]
    props = dict(line.split("=", 1) for line in resp.body.decode().splitlines())
    assert props["brokerName"] == BROKER and props["brokerClusterName"] == CLUSTER
    assert props["brokerId"] == "0" and props["brokerRole"] == "ASYNC_MASTER"
    assert props["fileReservedTime"] == "0.0003" and props["flushDiskType"] == "ASYNC_FLUSH"
    assert props["listenPort"] == cluster.broker.rsplit(":", 1)[1]

    out = cluster.admin("getBrokerConfig", "-b", cluster.broker).stdout.splitlines()
    assert out[0] == f"============{cluster.broker}============"
    assert f"{'brokerName':<50}=  {BROKER}" in out and out[-1] == ""
    by_cluster = cluster.admin("getBrokerConfig", "-c", CLUSTER).stdout.splitlines()
    assert by_cluster[0] == f"============Master: {cluster.broker}============"
    assert cluster.admin("getBrokerConfig", "-c", "Nope", ok=False).stderr.count("Nope") == 1


def test_update_broker_config_applies_and_refuses_by_name(cluster: Cluster) -> None:
    before = int(orjson.loads(cluster.rpc(RequestCode.GET_BROKER_CONFIG).ext_fields["version"])["counter"])
    out = cluster.admin(
        "updateBrokerConfig", "-b", cluster.broker, "-k", "slaveReadEnable", "-v", "true"
    ).stdout
    assert out.strip() == f"update broker config success, {cluster.broker}"
    resp = cluster.rpc(RequestCode.GET_BROKER_CONFIG)
    assert int(orjson.loads(resp.ext_fields["version"])["counter"]) == before + 1
    assert _config(cluster)["slaveReadEnable"] == "true"
    saved = (cluster.data / "config" / "broker.runtime.properties").read_text()
    assert "slaveReadEnable=true\n" in saved

    unknown = cluster.admin(
        "updateBrokerConfig", "-b", cluster.broker, "-k", "noSuchKey", "-v", "1", ok=False
    )
    assert "unknown broker config key 'noSuchKey'" in unknown.stderr
    fixed = cluster.admin("updateBrokerConfig", "-b", cluster.broker, "-k", "brokerName", "-v", "x", ok=False)
    assert "brokerName cannot be changed at run time" in fixed.stderr
    by_cluster = cluster.admin(
        "updateBrokerConfig", "-c", CLUSTER, "-k", "brokerName", "-v", "x", ok=False, lines=2
    )
    assert by_cluster.stderr.startswith(f"update broker config failed, {cluster.broker}: ")
    bad = cluster.admin(
        "updateBrokerConfig", "-b", cluster.broker, "-k", "longPollingEnable", "-v", "maybe", ok=False
    )
    assert "expected true or false" in bad.stderr
    out_of_range = cluster.rpc(RequestCode.UPDATE_BROKER_CONFIG, body=b"shortPollingTimeMills=0\n")
    assert out_of_range.code == ResponseCode.SYSTEM_ERROR and "short_polling_ms" in (
        out_of_range.remark or ""
    )
    # All or nothing: one refused key, nothing applied.
    mixed = cluster.rpc(RequestCode.UPDATE_BROKER_CONFIG, body=b"slaveReadEnable=false\nbrokerId=3\n")
    assert mixed.code == ResponseCode.SYSTEM_ERROR and "brokerId" in (mixed.remark or "")
    assert _config(cluster)["slaveReadEnable"] == "true" and _config(cluster)["brokerName"] == BROKER


def test_auto_create_topic_switch_takes_effect_live(cluster: Cluster) -> None:
    cluster.admin("updateBrokerConfig", "-b", cluster.broker, "-k", "autoCreateTopicEnable", "-v", "false")
    try:
        refused = _send(cluster, "NeverCreated", b"x")
        assert refused.code == ResponseCode.TOPIC_NOT_EXIST, refused.remark
    finally:
        cluster.admin("updateBrokerConfig", "-b", cluster.broker, "-k", "autoCreateTopicEnable", "-v", "true")
    assert _send(cluster, "CreatedNow", b"x").code == ResponseCode.SUCCESS


# ---------------------------------------------------------------------------- system topics
def test_system_topics_and_broker_name_topic(cluster: Cluster) -> None:
    resp = cluster.rpc(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)
    assert resp.code == ResponseCode.SUCCESS
    listed = set(orjson.loads(resp.body)["topicList"])
    assert {
        CLUSTER,
        BROKER,
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        f"{CLUSTER}_REPLY_TOPIC",
    } <= listed
    topics = orjson.loads(cluster.rpc(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
    assert topics[BROKER]["perm"] == 7 and topics[BROKER]["writeQueueNums"] == 1
    assert topics[CLUSTER]["perm"] == 7
    # Request-reply's topic exists from the start, 1 queue, readable and writable (RocketMQ 4.6+).
    reply = topics[f"{CLUSTER}_REPLY_TOPIC"]
    assert (reply["perm"], reply["readQueueNums"], reply["writeQueueNums"]) == (6, 1, 1)
    # The trace topic is made only when traceTopicEnable is on (off by default).
    assert "RMQ_SYS_TRACE_TOPIC" not in topics
    # mqadmin sendMsgStatus sends to the broker-name topic: the route exists and the send lands.
    assert wait_for(lambda: BROKER in cluster.admin("topicList").stdout.split(), 10)
    sent = cluster.admin("sendMessage", "-t", BROKER, "-p", "probe").stdout
    assert "SEND_OK" in sent
    assert _send(cluster, CLUSTER, b"rt probe").code == ResponseCode.SUCCESS  # mqadmin clusterRT's topic

    cluster.admin("updateBrokerConfig", "-b", cluster.broker, "-k", "brokerTopicEnable", "-v", "false")
    try:
        topics = orjson.loads(cluster.rpc(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
        assert topics[BROKER]["perm"] == 1
        assert _send(cluster, BROKER, b"x").code == ResponseCode.NO_PERMISSION
    finally:
        cluster.admin("updateBrokerConfig", "-b", cluster.broker, "-k", "brokerTopicEnable", "-v", "true")


# ---------------------------------------------------------------------------- maintenance
def _cq_dir(cluster: Cluster, topic: str) -> Path:
    return cluster.data / "consumequeue" / topic


def test_delete_expired_commitlog_then_clean_expired_queues(cluster: Cluster) -> None:
    for _ in range(8):  # ~8 records of 1 KiB: the 4 KiB commit-log files roll
        assert _send(cluster, "OldT", b"o" * 1000).code == ResponseCode.SUCCESS
    assert _cq_dir(cluster, "OldT").is_dir()
    time.sleep(1.5)  # older than file_reserved_hours
    for _ in range(5):
        assert _send(cluster, "NewT", b"n" * 1000).code == ResponseCode.SUCCESS
    min_before = int(runtime_info(cluster.broker)["commitLogMinOffset"])
    out = cluster.admin("deleteExpiredCommitLog", "-b", cluster.broker).stdout
    assert out.strip() == "success"
    assert int(runtime_info(cluster.broker)["commitLogMinOffset"]) > min_before

    assert cluster.admin("cleanExpiredCQ", "-c", CLUSTER).stdout.strip() == "success"
    assert not _cq_dir(cluster, "OldT").exists()  # every record of it was deleted
    assert _cq_dir(cluster, "NewT").is_dir()
    # The topic is still in the table: a new send starts its queue again.
    assert _send(cluster, "OldT", b"again").code == ResponseCode.SUCCESS
    max_off = cluster.rpc(RequestCode.GET_MAX_OFFSET, {"topic": "OldT", "queueId": 0})
    assert max_off.ext_fields["offset"] == "1"


def test_maintenance_of_an_unknown_cluster_fails(cluster: Cluster) -> None:
    out = cluster.admin("cleanUnusedTopic", "-c", "Nope", ok=False)
    assert "cluster 'Nope' is unknown" in out.stderr


def test_a_server_that_is_no_broker_gets_one_error_line(cluster: Cluster, tmp_path: Path) -> None:
    # The NameServer's address given as a broker's: it refuses these codes; no traceback.
    for args in (
        ("getBrokerConfig", "-b", cluster.namesrv),
        ("exportMetadata", "-b", cluster.namesrv, "-t", "-f", str(tmp_path)),
        ("updateSubGroup", "-b", cluster.namesrv, "-g", "G"),
    ):
        out = cluster.admin(*args, ok=False)
        assert cluster.namesrv in out.stderr
    assert cluster.admin("cleanExpiredCQ", "-b", cluster.namesrv, ok=False, lines=2).stdout == "false\n"


def test_resume_check_half_message(cluster: Cluster) -> None:
    half = _send(cluster, "TxT", b"tx", {Prop.TRANSACTION_PREPARED: "true", Prop.PRODUCER_GROUP: "PG"})
    assert half.code == ResponseCode.SUCCESS, half.remark
    queue = {"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": 0}
    before = int(cluster.rpc(RequestCode.GET_MAX_OFFSET, queue).ext_fields["offset"])
    resp = cluster.rpc(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": half.ext_fields["msgId"]})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert int(cluster.rpc(RequestCode.GET_MAX_OFFSET, queue).ext_fields["offset"]) == before + 1

    plain = _send(cluster, "PlainT", b"p")
    wrong = cluster.rpc(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": plain.ext_fields["msgId"]})
    assert wrong.code == ResponseCode.SYSTEM_ERROR and "not a half message" in (wrong.remark or "")
    bad = cluster.rpc(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": "zz"})
    assert bad.code == ResponseCode.SYSTEM_ERROR
    missing = cluster.rpc(RequestCode.RESUME_CHECK_HALF_MESSAGE, {})
    assert missing.code == ResponseCode.SYSTEM_ERROR and "msgId" in (missing.remark or "")


# ---------------------------------------------------------------------------- export
def test_export_metadata_and_configs(cluster: Cluster, tmp_path: Path) -> None:
    cluster.admin("updateTopic", "-t", "UserT", "-b", cluster.broker, "-r", "2", "-w", "2")
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "UserG", "-q", "2")
    out = cluster.admin("exportMetadata", "-c", CLUSTER, "-f", str(tmp_path)).stdout
    assert out.strip() == f"export {tmp_path / 'metadata.json'} success"
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert sorted(meta) == ["exportTime", "subscriptionGroupTable", "topicConfigTable"]
    assert meta["topicConfigTable"]["UserT"]["readQueueNums"] == 2
    assert not {"TBW102", CLUSTER, BROKER} & set(meta["topicConfigTable"])
    assert not any(t.startswith("%RETRY%") for t in meta["topicConfigTable"])
    assert meta["subscriptionGroupTable"]["UserG"]["retryQueueNums"] == 2

    cluster.admin("exportMetadata", "-b", cluster.broker, "-t", "-s", "-f", str(tmp_path))
    topic_json = json.loads((tmp_path / "topic.json").read_text())
    assert (
        sorted(topic_json) == ["dataVersion", "topicConfigTable"]
        and "UserT" in topic_json["topicConfigTable"]
    )
    cluster.admin("exportMetadata", "-b", cluster.broker, "-g", "-f", str(tmp_path))
    groups_json = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert "UserG" in groups_json["subscriptionGroupTable"]
    assert "give -t" in cluster.admin("exportMetadata", "-b", cluster.broker, ok=False).stderr

    out = cluster.admin("exportConfigs", "-c", CLUSTER, "-f", str(tmp_path)).stdout
    assert out.strip() == f"export {tmp_path / 'configs.json'} success"
    configs = json.loads((tmp_path / "configs.json").read_text())
    assert configs["clusterScale"] == {"namesrvSize": 1, "masterBrokerSize": 1, "slaveBrokerSize": 0}
    broker = configs["brokerConfigs"][BROKER]
    assert len(broker) == 16 and broker["brokerClusterName"] == CLUSTER and broker["useTLS"] == "false"


# ---------------------------------------------------------------------------- restart (last: restarts the broker)
def test_restart_keeps_groups_and_runtime_config_and_cleans_unused_topics(cluster: Cluster) -> None:
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "Kept", "-r", "7")
    cluster.admin("updateBrokerConfig", "-b", cluster.broker, "-k", "longPollingEnable", "-v", "false")
    assert _send(cluster, "Orphan", b"x").code == ResponseCode.SUCCESS
    cluster.broker_server.stop()
    # The topic table forgets Orphan while its stored queue stays: what cleanUnusedTopic is for.
    topics_file = cluster.data / "config" / "topics.json"
    table = json.loads(topics_file.read_text())
    del table["topicConfigTable"]["Orphan"]
    topics_file.write_text(json.dumps(table))
    cluster.start_broker()

    assert _groups(cluster)["subscriptionGroupTable"]["Kept"]["retryMaxTimes"] == 7
    assert _config(cluster)["longPollingEnable"] == "false"
    assert "longPollingEnable=false" in cluster.broker_server.log_path.read_text()  # the override is logged
    assert _cq_dir(cluster, "Orphan").is_dir()
    assert cluster.admin("cleanUnusedTopic", "-b", cluster.broker).stdout.strip() == "success"
    assert not _cq_dir(cluster, "Orphan").exists()
    assert _cq_dir(cluster, "NewT").is_dir()  # a topic of the table is kept
