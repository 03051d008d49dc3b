"""ACL administration (request codes 50-54) on a broker with the plain ACL, through raw requests
and ``tidemq admin``'s updateAclConfig, deleteAclConfig, clusterAclConfigVersion,
updateGlobalWhiteAddr and getAclConfig; and the admin-only rule on every admin request code."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from click.testing import CliRunner
from test_acl_broker import AclCluster, raw

from tidemq.admin import admin
from tidemq.remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.timeout(120)

_NO_ENV = {k: None for k in os.environ if k.startswith("TIDEMQ_")}


class Cluster(AclCluster):
    """:class:`AclCluster` whose ``admin`` runs ``tidemq admin`` in this process (click's runner: real
    sockets, no interpreter start-up); a traceback is not caught, so it fails the test."""

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = CliRunner().invoke(admin, [*args, "-n", self.namesrv], env=_NO_ENV, catch_exceptions=False)
        return subprocess.CompletedProcess(
            ["tidemq", "admin", *args], result.exit_code, result.stdout, result.stderr
        )

    def admin_process(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The real command line, in a process of its own."""
        return AclCluster.admin(self, *args)


ACL = """\
# written by hand; remote edits rewrite the file
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: plain-user
    secretKey: plain-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: root-admin
    secretKey: root-secret
    admin: true
"""
ADMIN = ["--access-key", "root-admin", "--secret-key", "root-secret"]
ADMIN_SIGN = {"ak": "root-admin", "sk": "root-secret"}
USER_SIGN = {"ak": "plain-user", "sk": "plain-secret"}

#: Every code issue 21 makes admin-only, written out (not read from the plugin) so that dropping one
#: from the plugin's set fails this test: RocketMQ 4.9's five, the ACL codes, the operator codes.
ADMIN_ONLY = [
    RequestCode.UPDATE_AND_CREATE_TOPIC,  # 17
    RequestCode.UPDATE_BROKER_CONFIG,  # 25
    RequestCode.GET_BROKER_CONFIG,  # 26
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,  # 50
    RequestCode.DELETE_ACL_CONFIG,  # 51
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO,  # 52
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,  # 53
    RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,  # 54
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,  # 200
    RequestCode.DELETE_SUBSCRIPTIONGROUP,  # 207
    RequestCode.DELETE_TOPIC_IN_BROKER,  # 215
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,  # 222
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER,  # 305
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,  # 306
    RequestCode.CONSUME_MESSAGE_DIRECTLY,  # 309
    RequestCode.CLONE_GROUP_OFFSET,  # 314
    RequestCode.CLEAN_UNUSED_TOPIC,  # 316
    RequestCode.RESUME_CHECK_HALF_MESSAGE,  # 323
    RequestCode.DELETE_EXPIRED_COMMITLOG,  # 329
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # A long reload period: a remote edit must be in force at once, not when the file is next polled.
    c = Cluster(tmp_path_factory.mktemp("acladmin"), ACL, reload_check_s=60)
    yield c
    c.stop()


def acl_file(cluster: Cluster) -> dict:
    return yaml.safe_load(cluster.acl_path.read_text())


def account(cluster: Cluster, ak: str) -> dict | None:
    return next((a for a in acl_file(cluster)["accounts"] if a["accessKey"] == ak), None)


def version_counter(cluster: Cluster) -> int:
    return int(acl_file(cluster)["dataVersion"][0]["counter"])


# ---------------------------------------------------------------------------- admin-only rule
@pytest.mark.parametrize("code", ADMIN_ONLY, ids=lambda c: f"{c.name}({int(c)})")
def test_a_non_admin_account_and_an_unsigned_request_are_refused(cluster: Cluster, code: RequestCode) -> None:
    fields = {"topic": "T", "consumerGroup": "G", "accessKey": "plain-user", "brokerName": "b"}
    signed = raw(cluster.broker, code, dict(fields), **USER_SIGN)
    assert signed.code == ResponseCode.NO_PERMISSION, (signed.code, signed.remark)
    assert f"request code {int(code)} ({code.name}) needs an admin account" in (signed.remark or "")
    assert "accessKey plain-user is not" in (signed.remark or "")
    unsigned = raw(cluster.broker, code, dict(fields))
    assert unsigned.code == ResponseCode.NO_PERMISSION
    assert "carries no AccessKey" in (unsigned.remark or "")


def test_the_same_non_admin_account_may_send_what_is_not_admin_only(cluster: Cluster) -> None:
    # The refusal above is the admin rule, not a broken signature: a read the account may do passes.
    resp = raw(cluster.broker, RequestCode.GET_BROKER_RUNTIME_INFO, {}, **USER_SIGN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_a_non_admin_account_gets_a_one_line_refusal_from_the_commands(cluster: Cluster) -> None:
    before = cluster.acl_path.read_bytes()
    out = cluster.admin_process(
        "updateAclConfig", "-b", cluster.broker, "-a", "sneaky-user", "-s", "sneaky-secret", "-m", "true",
        "--access-key", "plain-user", "--secret-key", "plain-secret",
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.startswith("tidemq admin: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert "NO_PERMISSION(16)" in out.stderr and "UPDATE_AND_CREATE_ACL_CONFIG" in out.stderr
    assert cluster.acl_path.read_bytes() == before


# ---------------------------------------------------------------------------- wire shapes
def test_acl_info_answers_clusteraclversioninfo_header_fields(cluster: Cluster) -> None:
    resp = raw(cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}, **ADMIN_SIGN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    f = resp.ext_fields
    assert f["brokerName"] == "broker-acl" and f["clusterName"] == "DefaultCluster"
    assert f["brokerAddr"] == cluster.broker
    version = orjson.loads(f["version"])
    assert list(version) == ["counter", "timestamp"]
    # Not yet edited remotely: counter 0, and the file's modification time as the last update.
    assert version == {"counter": 0, "timestamp": cluster.acl_path.stat().st_mtime_ns // 1_000_000}
    assert orjson.loads(f["allAclFileVersion"]) == {str(cluster.acl_path): version}
    assert resp.body in (None, b"")


def test_acl_config_body_is_plainaccessconfig_json(cluster: Cluster) -> None:
    resp = raw(cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, {}, **ADMIN_SIGN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    body = orjson.loads(resp.body)
    assert set(body) == {"globalWhiteAddrs", "plainAccessConfigs"}
    users = {a["accessKey"]: a for a in body["plainAccessConfigs"]}
    assert users["plain-user"] == {
        "accessKey": "plain-user",
        "admin": False,
        "defaultGroupPerm": "SUB",
        "defaultTopicPerm": "PUB|SUB",
        "secretKey": "plain-secret",
    }
    assert list(users["plain-user"]) == sorted(users["plain-user"])  # fastjson's key order
    assert users["root-admin"]["admin"] is True


def test_a_missing_header_field_is_answered_not_crashed(cluster: Cluster) -> None:
    resp = raw(cluster.broker, RequestCode.DELETE_ACL_CONFIG, {}, **ADMIN_SIGN)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "accessKey" in (resp.remark or "")
    resp = raw(cluster.broker, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {}, **ADMIN_SIGN)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "globalWhiteAddrs" in (resp.remark or "")


# ---------------------------------------------------------------------------- commands
def test_update_acl_config_creates_an_account_in_force_at_once(cluster: Cluster) -> None:
    counter = version_counter(cluster) if "dataVersion" in acl_file(cluster) else 0
    out = cluster.admin(
        "updateAclConfig", "-b", cluster.broker, "-a", "new-account", "-s", "new-secret-1",
        "-i", "DENY", "-u", "SUB", "-t", "Orders=PUB,Audit=SUB", "-g", "billing=SUB", "-w", "10.9.8.*",
        *ADMIN,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"create or update plain access config to {cluster.broker} success."
    assert out.stdout.splitlines()[1] == (
        "PlainAccessConfig{accessKey=new-account, admin=false, whiteRemoteAddress=10.9.8.*, defaultTopicPerm=DENY, "
        "defaultGroupPerm=SUB, topicPerms=Orders=PUB,Audit=SUB, groupPerms=billing=SUB}"
    )  # the secret key is not printed
    assert account(cluster, "new-account") == {
        "accessKey": "new-account",
        "secretKey": "new-secret-1",
        "whiteRemoteAddress": "10.9.8.*",
        "admin": False,
        "defaultTopicPerm": "DENY",
        "defaultGroupPerm": "SUB",
        "topicPerms": ["Orders=PUB", "Audit=SUB"],
        "groupPerms": ["billing=SUB"],
    }
    assert version_counter(cluster) == counter + 1
    assert not list(cluster.acl_path.parent.glob("*.tmp"))
    # Known at once (reload_check_s is 60 s): refused as a non-admin, not as an unknown key.
    resp = raw(
        cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}, ak="new-account", sk="new-secret-1"
    )
    assert resp.code == ResponseCode.NO_PERMISSION and "needs an admin account" in (resp.remark or "")
    # Updating keeps what is not given (topic perms), sets admin, and is in force at once too.
    out = cluster.admin(
        "updateAclConfig",
        "-b",
        cluster.broker,
        "-a",
        "new-account",
        "-s",
        "new-secret-1",
        "-m",
        "true",
        *ADMIN,
    )
    assert out.returncode == 0, out.stderr
    updated = account(cluster, "new-account")
    assert (
        updated is not None
        and updated["admin"] is True
        and updated["topicPerms"] == ["Orders=PUB", "Audit=SUB"]
    )
    resp = raw(
        cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}, ak="new-account", sk="new-secret-1"
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert version_counter(cluster) == counter + 2


def test_update_acl_config_refuses_bad_values_and_leaves_the_file(cluster: Cluster) -> None:
    before = cluster.acl_path.read_bytes()
    for args, words in (
        (["-a", "short", "-s", "long-enough-secret"], "length should longer than 6"),
        (["-a", "long-enough-key", "-s", "tiny"], "length should longer than 6"),
        (
            ["-a", "long-enough-key", "-s", "long-enough-secret", "-t", "Orders=WRITE"],
            "Parse resource permission error",
        ),
        (
            ["-a", "long-enough-key", "-s", "long-enough-secret", "-g", "nogroupperm"],
            "Parse Resource format error",
        ),
        (["-a", "long-enough-key", "-s", "long-enough-secret", "-w", "10.1.1.1-x"], "white address"),
    ):
        out = cluster.admin("updateAclConfig", "-b", cluster.broker, *args, *ADMIN)
        assert out.returncode == 1, (args, out.stdout)
        assert out.stderr.count("\n") == 1 and "UPDATE_AND_CREATE_ACL_CONFIG_FAILED(209)" in out.stderr, (
            out.stderr
        )
        assert words in out.stderr, out.stderr
    assert cluster.acl_path.read_bytes() == before
    usage = cluster.admin("updateAclConfig", "-a", "long-enough-key", "-s", "long-enough-secret", *ADMIN)
    assert usage.returncode == 2 and "-b/--brokerAddr" in usage.stderr


def test_cluster_acl_config_version_prints_mqadmins_table(cluster: Cluster) -> None:
    out = cluster.admin("clusterAclConfigVersion", "-c", "DefaultCluster", *ADMIN)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "#Cluster", "Name", "#Broker", "Name", "#Broker", "Addr", "#AclFilePath", "#AclConfigVersionNum", "#AclLastUpdateTime",
    ]  # fmt: skip
    row = lines[1].split()
    assert row[:5] == [
        "DefaultCluster",
        "broker-acl",
        cluster.broker,
        str(cluster.acl_path),
        str(version_counter(cluster)),
    ]
    assert len(row) == 7 and row[5].count("-") == 2 and row[6].count(":") == 2  # yyyy-MM-dd HH:mm:ss
    assert lines[-1] == "get cluster's plain access config version success."
    single = cluster.admin("clusterAclConfigVersion", "-b", cluster.broker, *ADMIN)
    assert single.returncode == 0, single.stderr
    assert single.stdout.splitlines()[0].split()[:2] == ["DefaultCluster", "broker-acl"]
    assert single.stdout.splitlines()[-1] == "get broker's plain access config version success."
    unknown = cluster.admin("clusterAclConfigVersion", "-c", "NoSuchCluster", *ADMIN)
    assert unknown.returncode == 1 and "NoSuchCluster" in unknown.stderr


def test_get_acl_config_prints_white_addresses_and_accounts(cluster: Cluster) -> None:
    out = cluster.admin("getAclConfig", "-b", cluster.broker, *ADMIN)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "\nglobalWhiteRemoteAddresses: [10.10.103.*]\n" in text
    assert "\naccounts:\n" in text
    block = text.split("  accessKey         : plain-user\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert block == [
        "  secretKey         : plain-secret",
        "  whiteRemoteAddress: ",
        "  admin             : false",
        "  defaultTopicPerm  : PUB|SUB",
        "  defaultGroupPerm  : SUB",
        "  topicPerms        : ",
        "  groupPerms        : ",
    ]
    assert "  admin             : true" in text  # root-admin
    by_cluster = cluster.admin("getAclConfig", "-c", "DefaultCluster", *ADMIN)
    assert by_cluster.returncode == 0 and "plain-user" in by_cluster.stdout


def test_update_global_white_addr_applies_at_once(cluster: Cluster) -> None:
    out = cluster.admin("updateGlobalWhiteAddr", "-b", cluster.broker, "-g", "10.1.2.*,192.168.7.*", *ADMIN)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"update global white remote addresses to {cluster.broker} success.\n"
    assert acl_file(cluster)["globalWhiteRemoteAddresses"] == ["10.1.2.*", "192.168.7.*"]
    shown = cluster.admin("getAclConfig", "-b", cluster.broker, *ADMIN)
    assert "globalWhiteRemoteAddresses: [10.1.2.*, 192.168.7.*]" in shown.stdout
    # White-listing loopback lets an unsigned request in at once; emptying the list shuts it again.
    assert raw(cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}).code == ResponseCode.NO_PERMISSION
    out = cluster.admin("updateGlobalWhiteAddr", "-c", "DefaultCluster", "-g", "127.0.0.1", *ADMIN)
    assert out.returncode == 0, out.stderr
    assert raw(cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}).code == ResponseCode.SUCCESS
    out = cluster.admin("updateGlobalWhiteAddr", "-b", cluster.broker, "-g", "", *ADMIN)
    assert out.returncode == 0, out.stderr
    assert acl_file(cluster)["globalWhiteRemoteAddresses"] == []
    assert raw(cluster.broker, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}).code == ResponseCode.NO_PERMISSION


def test_update_global_white_addr_refuses_another_file_and_bad_patterns(cluster: Cluster) -> None:
    before = cluster.acl_path.read_bytes()
    other = cluster.admin(
        "updateGlobalWhiteAddr", "-b", cluster.broker, "-g", "10.0.0.*", "-p", "/etc/other.yml", *ADMIN
    )
    assert other.returncode == 1 and "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED(211)" in other.stderr
    assert "/etc/other.yml is not this broker's ACL file" in other.stderr
    same = cluster.admin(
        "updateGlobalWhiteAddr", "-b", cluster.broker, "-g", "10.0.0.*", "-p", str(cluster.acl_path), *ADMIN
    )
    assert same.returncode == 0, same.stderr
    after_same = cluster.acl_path.read_bytes()
    assert after_same != before
    bad = cluster.admin("updateGlobalWhiteAddr", "-b", cluster.broker, "-g", "10.0.0.300", *ADMIN)
    assert bad.returncode == 1 and "UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED(211)" in bad.stderr
    assert cluster.acl_path.read_bytes() == after_same
    cluster.admin("updateGlobalWhiteAddr", "-b", cluster.broker, "-g", "", *ADMIN)


def test_delete_acl_config_removes_the_account_at_once(cluster: Cluster) -> None:
    out = cluster.admin(
        "updateAclConfig", "-b", cluster.broker, "-a", "doomed-user", "-s", "doomed-secret", *ADMIN
    )
    assert out.returncode == 0, out.stderr
    counter = version_counter(cluster)
    out = cluster.admin("deleteAclConfig", "-b", cluster.broker, "-a", "doomed-user", *ADMIN)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"delete plain access config account from {cluster.broker} success.",
        "account's accesskey is:doomed-user",
    ]
    assert account(cluster, "doomed-user") is None and version_counter(cluster) == counter + 1
    resp = raw(cluster.broker, RequestCode.GET_BROKER_RUNTIME_INFO, {}, ak="doomed-user", sk="doomed-secret")
    assert resp.code == ResponseCode.NO_PERMISSION and "no ACL account for accessKey doomed-user" in (
        resp.remark or ""
    )
    again = cluster.admin("deleteAclConfig", "-c", "DefaultCluster", "-a", "doomed-user", *ADMIN)
    assert again.returncode == 1 and "DELETE_ACL_CONFIG_FAILED(210)" in again.stderr
    assert "doomed-user" in again.stderr and again.stderr.count("\n") == 1


def test_a_hand_edit_and_a_remote_edit_both_survive(cluster: Cluster, tmp_path: Path) -> None:
    # The remote edit reads the file as it is now, so an operator's edit made meanwhile is kept.
    doc = acl_file(cluster)
    doc["accounts"].append({"accessKey": "by-hand-user", "secretKey": "by-hand-secret"})
    cluster.rewrite_acl(yaml.safe_dump(doc))
    out = cluster.admin(
        "updateAclConfig", "-b", cluster.broker, "-a", "remote-user", "-s", "remote-secret", *ADMIN
    )
    assert out.returncode == 0, out.stderr
    assert account(cluster, "by-hand-user") is not None and account(cluster, "remote-user") is not None
    for ak, sk in (("by-hand-user", "by-hand-secret"), ("remote-user", "remote-secret")):
        resp = raw(cluster.broker, RequestCode.GET_BROKER_RUNTIME_INFO, {}, ak=ak, sk=sk)
        assert resp.code == ResponseCode.SUCCESS, (ak, resp.remark)


def test_a_failed_write_leaves_the_old_file_whole_and_in_force(cluster: Cluster) -> None:
    # The temporary file cannot be created (a directory holds its name): the edit fails before the
    # rename, so the file on disk and the accounts in force are the old ones.
    blocker = cluster.acl_path.with_name(cluster.acl_path.name + ".tmp")
    blocker.mkdir()
    try:
        before = cluster.acl_path.read_bytes()
        out = cluster.admin(
            "updateAclConfig", "-b", cluster.broker, "-a", "never-user", "-s", "never-secret", *ADMIN
        )
        assert out.returncode == 1 and "UPDATE_AND_CREATE_ACL_CONFIG_FAILED(209)" in out.stderr, out.stderr
        assert cluster.acl_path.read_bytes() == before
        resp = raw(
            cluster.broker, RequestCode.GET_BROKER_RUNTIME_INFO, {}, ak="never-user", sk="never-secret"
        )
        assert resp.code == ResponseCode.NO_PERMISSION and "no ACL account" in (resp.remark or "")
    finally:
        blocker.rmdir()
    out = cluster.admin(
        "updateAclConfig", "-b", cluster.broker, "-a", "never-user", "-s", "never-secret", *ADMIN
    )
    assert out.returncode == 0, out.stderr
    inode = cluster.acl_path.stat().st_ino
    cluster.admin("deleteAclConfig", "-b", cluster.broker, "-a", "never-user", *ADMIN)
    assert cluster.acl_path.stat().st_ino != inode  # replaced by a rename, never written in place
