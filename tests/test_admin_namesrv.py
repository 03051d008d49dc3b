"""``tidemq admin``'s NameServer commands (KV and order config, NameServer config, write permission,
topic clusters, topic permission) and ``updateTopic -o``, against two NameServers and two brokers
started with the command line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Server, free_port

from tidemq.admin import admin
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

_NO_ENV = {k: None for k in os.environ if k.startswith("TIDEMQ_")}


def run_admin(*args: str) -> subprocess.CompletedProcess[str]:
    """``tidemq admin ARGS`` in this process (click's runner: real sockets, no interpreter start-up);
    a traceback is not caught, so it fails the test."""
    result = CliRunner().invoke(admin, list(args), env=_NO_ENV, catch_exceptions=False)
    return subprocess.CompletedProcess(
        ["tidemq", "admin", *args], result.exit_code, result.stdout, result.stderr
    )


class Cluster:
    """Two NameServers, brokers ``broker-a`` and ``broker-b`` of cluster ``C1`` (no ACL)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.servers: list[Server] = []
        self.namesrvs = [
            self._start("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"] for _ in range(2)
        ]
        self.brokers: dict[str, str] = {}
        for name in ("broker-a", "broker-b"):
            conf = tmp / f"{name}.toml"
            conf.write_text(
                f'[broker]\nname = "{name}"\ncluster = "C1"\nlisten = "127.0.0.1:{free_port()}"\n'
                f'namesrv = {json.dumps(self.namesrvs)}\ndata_dir = "{tmp / name}"\n'
            )
            self.brokers[name] = self._start("broker", "-c", str(conf)).addresses["broker"]

    def _start(self, *args: str) -> Server:
        server = Server(list(args), self.tmp)
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()

    def admin(self, *args: str, namesrv: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_admin(*args, "-n", namesrv or ";".join(self.namesrvs))

    def ok(self, *args: str) -> str:
        out = self.admin(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("nsadmin"))
    yield c
    c.stop()


async def _raw(
    addr: str, code: int, fields: dict[str, str] | None = None, body: bytes | None = None
) -> RemotingCommand:
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        return await client.invoke(addr, RemotingCommand.request(code, fields or {}, body), 5.0)
    finally:
        await client.close()


def raw(
    addr: str, code: int, fields: dict[str, str] | None = None, body: bytes | None = None
) -> RemotingCommand:
    return asyncio.run(_raw(addr, code, fields, body))


def kv(ns: str, namespace: str, key: str) -> str | None:
    resp = raw(ns, RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key})
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp.ext_fields["value"]


def route(ns: str, topic: str) -> dict:
    resp = raw(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return json.loads(resp.body)


def perms(ns: str, topic: str) -> dict[str, tuple[int, int, int]]:
    return {
        q["brokerName"]: (q["readQueueNums"], q["writeQueueNums"], q["perm"])
        for q in route(ns, topic)["queueDatas"]
    }


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, out.stdout
    assert out.stderr.startswith("tidemq admin: error: ") and out.stderr.count("\n") == 1, out.stderr
    return out.stderr


# ---------------------------------------------------------------------------- KV config
def test_update_and_delete_kv_config_on_every_namesrv(cluster: Cluster) -> None:
    out = cluster.ok("updateKvConfig", "-s", "ops", "-k", "region", "-v", " eu-west ")
    assert out == "create or update kv config to namespace success.\n"
    assert [kv(ns, "ops", "region") for ns in cluster.namesrvs] == ["eu-west", "eu-west"]
    out = cluster.ok("deleteKvConfig", "-s", "ops", "-k", "region")
    assert out == "delete kv config from namespace success.\n"
    assert [kv(ns, "ops", "region") for ns in cluster.namesrvs] == [None, None]
    missing = cluster.admin("updateKvConfig", "-s", "ops", "-k", "region")
    assert missing.returncode == 2 and "-v" in missing.stderr


def test_kv_writes_reach_the_live_namesrv_and_report_the_dead_one(cluster: Cluster) -> None:
    dead = f"127.0.0.1:{free_port()}"
    out = cluster.admin(
        "updateKvConfig", "-s", "ops", "-k", "half", "-v", "1", namesrv=f"{dead};{cluster.namesrvs[0]}"
    )
    assert dead in one_error_line(out)
    assert kv(cluster.namesrvs[0], "ops", "half") == "1"


def test_update_order_conf_put_get_delete(cluster: Cluster) -> None:
    out = cluster.ok("updateOrderConf", "-t", "Ordered1", "-m", "put", "-v", "broker-a:4;broker-b:4")
    assert out == "update orderConf success. topic=[Ordered1], orderConf=[broker-a:4;broker-b:4]\n"
    assert [kv(ns, "ORDER_TOPIC_CONFIG", "Ordered1") for ns in cluster.namesrvs] == [
        "broker-a:4;broker-b:4"
    ] * 2
    out = cluster.ok("updateOrderConf", "-t", "Ordered1", "-m", "get")
    assert out == "get orderConf success. topic=[Ordered1], orderConf=[broker-a:4;broker-b:4]\n"
    out = cluster.ok("updateOrderConf", "-t", "Ordered1", "-m", "delete")
    assert out == "delete orderConf success. topic=[Ordered1]\n"
    assert kv(cluster.namesrvs[1], "ORDER_TOPIC_CONFIG", "Ordered1") is None
    assert "no orderConf for topic Ordered1" in one_error_line(
        cluster.admin("updateOrderConf", "-t", "Ordered1", "-m", "get")
    )
    no_value = cluster.admin("updateOrderConf", "-t", "Ordered1", "-m", "put")
    assert no_value.returncode == 2 and "please set orderConf with option -v." in no_value.stderr
    bad = cluster.admin("updateOrderConf", "-t", "Ordered1", "-m", "put", "-v", "broker-a")
    assert bad.returncode == 2 and "brokerName:queueNums" in bad.stderr
    method = cluster.admin("updateOrderConf", "-t", "Ordered1", "-m", "replace")
    assert method.returncode == 2 and "put" in method.stderr


# ---------------------------------------------------------------------------- updateTopic -o
def test_update_topic_order_true_on_a_cluster_writes_the_whole_order_conf(cluster: Cluster) -> None:
    out = cluster.ok("updateTopic", "-t", "GlobalOrder", "-c", "C1", "-r", "4", "-w", "4", "-o", "true")
    lines = out.splitlines()
    assert sorted(lines[:2]) == sorted(f"create topic to {a} success." for a in cluster.brokers.values())
    assert lines[2] == "set cluster orderConf. isOrder=true, orderConf=[broker-a:4;broker-b:4]"
    assert lines[3] == (
        "TopicConfig [topicName=GlobalOrder, readQueueNums=4, writeQueueNums=4, perm=RW-, "
        "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=true]"
    )
    for ns in cluster.namesrvs:
        assert kv(ns, "ORDER_TOPIC_CONFIG", "GlobalOrder") == "broker-a:4;broker-b:4"
        assert route(ns, "GlobalOrder")["orderTopicConf"] == "broker-a:4;broker-b:4"


def test_update_topic_order_true_on_one_broker_merges_its_part(cluster: Cluster) -> None:
    cluster.ok("updateOrderConf", "-t", "PartOrder", "-m", "put", "-v", "broker-a:8;broker-b:8")
    out = cluster.ok(
        "updateTopic",
        "-t",
        "PartOrder",
        "-b",
        cluster.brokers["broker-b"],
        "-w",
        "2",
        "-r",
        "2",
        "-o",
        "TRUE",
    )
    assert "set broker orderConf. isOrder=true, orderConf=[broker-a:8;broker-b:2]" in out
    assert kv(cluster.namesrvs[1], "ORDER_TOPIC_CONFIG", "PartOrder") == "broker-a:8;broker-b:2"


def test_update_topic_order_false_writes_no_order_conf(cluster: Cluster) -> None:
    out = cluster.ok(
        "updateTopic", "-t", "Unordered", "-b", cluster.brokers["broker-a"], "-o", "false", "-u", "true"
    )
    assert "orderConf" not in out and out.rstrip().endswith("topicSysFlag=1, order=false]")
    assert kv(cluster.namesrvs[0], "ORDER_TOPIC_CONFIG", "Unordered") is None
    # -o takes true|false, as mqadmin's: given as a bare flag it lacks its value.
    cmd = [
        sys.executable,
        "-m",
        "tidemq",
        "admin",
        "updateTopic",
        "-n",
        cluster.namesrvs[0],
        "-t",
        "Unordered",
        "-o",
    ]
    flag_only = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert flag_only.returncode == 2 and "Option '-o' requires an argument" in flag_only.stderr


# ---------------------------------------------------------------------------- NameServer config
def test_get_namesrv_config_prints_rocketmq_and_tidemq_keys(cluster: Cluster) -> None:
    out = cluster.ok("getNamesrvConfig")
    sections = out.split("============")
    assert [s for s in sections if s.strip() and "=" not in s] == cluster.namesrvs
    first = out.split(f"============{cluster.namesrvs[1]}============")[0]
    port = cluster.namesrvs[0].rsplit(":", 1)[1]
    assert f"{'listenPort':<50}=  {port}\n" in first
    assert f"{'orderMessageEnable':<50}=  true\n" in first
    assert f"{'scanNotActiveBrokerInterval':<50}=  10000\n" in first
    assert f"{'broker_expire_s':<50}=  120.0\n" in first


def test_update_namesrv_config_takes_rocketmq_names_and_refuses_paths(cluster: Cluster) -> None:
    out = cluster.ok("updateNamesrvConfig", "-k", "scanNotActiveBrokerInterval", "-v", "5000")
    assert (
        out
        == f"update name server config success![{', '.join(cluster.namesrvs)}]\nscanNotActiveBrokerInterval : 5000\n"
    )
    for ns in cluster.namesrvs:
        body = raw(ns, RequestCode.GET_NAMESRV_CONFIG).body.decode()
        assert "scan_interval_s=5.0\n" in body and "scanNotActiveBrokerInterval=5000\n" in body
    path = one_error_line(cluster.admin("updateNamesrvConfig", "-k", "kvConfigPath", "-v", "/tmp/x.json"))
    assert "NO_PERMISSION(16)" in path and "Can not update config path" in path
    unknown = one_error_line(cluster.admin("updateNamesrvConfig", "-k", "listen", "-v", "0.0.0.0:1"))
    assert (
        "SYSTEM_ERROR(1)" in unknown and "updatable:" in unknown and "scanNotActiveBrokerInterval" in unknown
    )
    nan = one_error_line(cluster.admin("updateNamesrvConfig", "-k", "scan_interval_s", "-v", "nan"))
    assert "scan_interval_s" in nan
    cluster.ok("updateNamesrvConfig", "-k", "scan_interval_s", "-v", "10")


def test_order_message_enable_false_hides_the_order_conf_from_routes(cluster: Cluster) -> None:
    cluster.ok("updateTopic", "-t", "Hidden", "-c", "C1", "-w", "2", "-r", "2", "-o", "true")
    ns = cluster.namesrvs[0]
    assert route(ns, "Hidden")["orderTopicConf"] == "broker-a:2;broker-b:2"
    resp = raw(ns, RequestCode.UPDATE_NAMESRV_CONFIG, body=b"orderMessageEnable=false\n")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    try:
        assert "orderTopicConf" not in route(ns, "Hidden")
        assert "orderMessageEnable=false\n" in raw(ns, RequestCode.GET_NAMESRV_CONFIG).body.decode()
    finally:
        raw(ns, RequestCode.UPDATE_NAMESRV_CONFIG, body=b"orderMessageEnable=true\n")
    assert route(ns, "Hidden")["orderTopicConf"] == "broker-a:2;broker-b:2"


# ---------------------------------------------------------------------------- write permission
def test_wipe_and_add_write_perm_on_every_namesrv(cluster: Cluster) -> None:
    cluster.ok("updateTopic", "-t", "Drain", "-c", "C1", "-r", "2", "-w", "2")
    out = cluster.ok("wipeWritePerm", "-b", "broker-a")
    lines = out.splitlines()
    assert len(lines) == 2
    for line, ns in zip(lines, cluster.namesrvs, strict=True):
        assert line.startswith(f"wipe write perm of broker[broker-a] in name server[{ns}] OK, ")
        assert int(line.rsplit(" ", 1)[1]) >= 1
        assert perms(ns, "Drain") == {"broker-a": (2, 2, 4), "broker-b": (2, 2, 6)}
    out = cluster.ok("addWritePerm", "-b", "broker-a")
    assert out.splitlines()[0].startswith(
        f"add write perm of broker[broker-a] in name server[{cluster.namesrvs[0]}] OK, "
    )
    for ns in cluster.namesrvs:
        assert perms(ns, "Drain")["broker-a"] == (2, 2, 6)
    none = cluster.ok("wipeWritePerm", "-b", "no-such-broker")
    assert none.splitlines()[0].endswith("OK, 0")


def test_wipe_write_perm_names_a_namesrv_that_failed(cluster: Cluster) -> None:
    dead = f"127.0.0.1:{free_port()}"
    out = cluster.admin("wipeWritePerm", "-b", "no-such-broker", namesrv=f"{cluster.namesrvs[0]};{dead}")
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"wipe write perm of broker[no-such-broker] in name server[{cluster.namesrvs[0]}] OK, 0",
        f"wipe write perm of broker[no-such-broker] in name server[{dead}] Failed",
    ]
    assert out.stderr.count("\n") == 1 and dead in out.stderr


# ---------------------------------------------------------------------------- topics
def test_topic_cluster_list(cluster: Cluster) -> None:
    cluster.ok("updateTopic", "-t", "WhereAmI", "-b", cluster.brokers["broker-b"])
    assert cluster.ok("topicClusterList", "-t", "WhereAmI") == "C1\n"
    assert "NoSuchTopicHere" in one_error_line(cluster.admin("topicClusterList", "-t", "NoSuchTopicHere"))


def test_update_topic_perm_keeps_the_queue_counts(cluster: Cluster) -> None:
    cluster.ok("updateTopic", "-t", "PermTopic", "-b", cluster.brokers["broker-a"], "-r", "3", "-w", "5")
    cluster.ok("updateTopic", "-t", "PermTopic", "-b", cluster.brokers["broker-b"], "-r", "2", "-w", "2")
    addr_a = cluster.brokers["broker-a"]
    out = cluster.ok("updateTopicPerm", "-b", addr_a, "-t", "PermTopic", "-p", "4")
    assert out.splitlines() == [
        f"update topic perm from 6 to 4 in {addr_a} success.",
        "TopicConfig [topicName=PermTopic, readQueueNums=3, writeQueueNums=5, perm=R--, "
        "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false].",
    ]
    assert perms(cluster.namesrvs[0], "PermTopic") == {"broker-a": (3, 5, 4), "broker-b": (2, 2, 6)}
    assert (
        cluster.ok("updateTopicPerm", "-b", addr_a, "-t", "PermTopic", "-p", "4")
        == "new perm equals to the old one!\n"
    )
    out = cluster.ok("updateTopicPerm", "-c", "C1", "-t", "PermTopic", "-p", "2")
    assert f"update topic perm from 4 to 2 in {addr_a} success." in out.splitlines()
    assert perms(cluster.namesrvs[1], "PermTopic") == {"broker-a": (3, 5, 2), "broker-b": (2, 2, 2)}
    bad = cluster.admin("updateTopicPerm", "-b", addr_a, "-t", "PermTopic", "-p", "5")
    assert bad.returncode == 2 and "not 2 (W), 4 (R) or 6 (RW)" in bad.stderr
    nowhere = cluster.admin("updateTopicPerm", "-t", "PermTopic", "-p", "6")
    assert nowhere.returncode == 2 and "-b/--brokerAddr" in nowhere.stderr
    stranger = one_error_line(
        cluster.admin("updateTopicPerm", "-b", "127.0.0.1:1", "-t", "PermTopic", "-p", "6")
    )
    assert "broker is not master" in stranger
    assert "NoSuchTopicHere" in one_error_line(
        cluster.admin("updateTopicPerm", "-c", "C1", "-t", "NoSuchTopicHere", "-p", "6")
    )


# ---------------------------------------------------------------------------- ACL codes without the plain ACL
@pytest.mark.parametrize(
    ("code", "answer"),
    [
        (RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED),
        (RequestCode.DELETE_ACL_CONFIG, ResponseCode.DELETE_ACL_CONFIG_FAILED),
        (RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED),
        (RequestCode.GET_BROKER_CLUSTER_ACL_INFO, ResponseCode.SYSTEM_ERROR),
        (RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, ResponseCode.SYSTEM_ERROR),
    ],
)
def test_acl_codes_on_a_broker_without_the_plain_acl_say_so(cluster: Cluster, code: int, answer: int) -> None:
    fields = {"accessKey": "someone-here", "secretKey": "some-secret", "globalWhiteAddrs": "*"}
    resp = raw(cluster.brokers["broker-a"], code, fields)
    assert resp.code == answer
    assert 'the plain ACL is not enabled on this broker ([plugins] acl = "plain")' == resp.remark
    out = cluster.admin("getAclConfig", "-b", cluster.brokers["broker-a"])
    assert "the plain ACL is not enabled" in one_error_line(out)
