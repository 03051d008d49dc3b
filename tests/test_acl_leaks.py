"""Where the plain ACL is stricter than RocketMQ 4.x: each test is an attacker's request on loopback
that RocketMQ (and tidemq before issue 41) answered.

A signed non-admin tenant (``app-user``) and a white-listed non-admin account (``lan-user``) try to
read another tenant's topic by offset, copy it into their own retry topic, lock another group's
queues, dump the broker's tables and administer the ACL.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from test_acl_broker import AclCluster, _send_fields, produce, raw

from tidemq.message import decode_message, decode_message_id
from tidemq.remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.timeout(120)

ACL = """\
accounts:
  - accessKey: ops-admin
    secretKey: ops-admin-secret
    admin: true
  - accessKey: app-user
    secretKey: app-user-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AppTopic=PUB|SUB
    groupPerms:
      - AppGroup=SUB
  - accessKey: lan-user
    secretKey: lan-user-secret
    whiteRemoteAddress: 127.0.0.1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - LanTopic=PUB
  - accessKey: other-user
    secretKey: other-user-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - OtherTopic=PUB|SUB
"""
ADMIN = {"ak": "ops-admin", "sk": "ops-admin-secret"}
APP = {"ak": "app-user", "sk": "app-user-secret"}
OTHER = {"ak": "other-user", "sk": "other-user-secret"}
ADMIN_ARGS = ["--access-key", "ops-admin", "--secret-key", "ops-admin-secret"]


class Tenants:
    def __init__(self, cluster: AclCluster) -> None:
        self.c = cluster
        for topic in ("PrivTopic", "AppTopic", "LanTopic", "OtherTopic"):
            out = cluster.admin(
                "updateTopic", "-t", topic, "-r", "1", "-w", "1", "-b", cluster.broker, *ADMIN_ARGS
            )
            assert out.returncode == 0, out.stderr
        creds = {"access_key": ADMIN["ak"], "secret_key": ADMIN["sk"]}
        self.priv = produce(cluster.namesrv, "PrivTopic", [b"ssn=123-45-6789 eve"], **creds)[0]
        app = {"access_key": APP["ak"], "secret_key": APP["sk"]}
        self.own = produce(cluster.namesrv, "AppTopic", [b"mine"], **app)[0]

    @staticmethod
    def offset(result: object) -> int:
        return decode_message_id(result.offset_msg_id)[1]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    c = AclCluster(tmp_path_factory.mktemp("acl-leaks"), ACL)
    try:
        yield Tenants(c)
    finally:
        c.stop()


def test_a_white_listed_account_waives_the_signature_not_the_admin_rule(tenants: Tenants) -> None:
    # Before: lan-user, unsigned, read every secret key (54) and created an account (50).
    b = tenants.c.broker
    lan = {"AccessKey": "lan-user"}
    dump = raw(b, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, lan)
    assert dump.code == ResponseCode.NO_PERMISSION, dump.payload()
    assert b"ops-admin-secret" not in (dump.payload() or b"")
    create = {**lan, "accessKey": "evil-admin", "secretKey": "evil-admin-secret", "admin": "true"}
    assert raw(b, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, create).code == ResponseCode.NO_PERMISSION
    assert raw(b, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {**lan, "globalWhiteAddrs": "*"}).code == (
        ResponseCode.NO_PERMISSION
    )
    assert raw(b, RequestCode.GET_ALL_TOPIC_CONFIG, lan).code == ResponseCode.NO_PERMISSION
    # ... and its resources still apply: no topic it is not granted.
    assert raw(
        b,
        RequestCode.QUERY_MESSAGE,
        {**lan, "topic": "PrivTopic", "key": "k", "maxNum": "1", "beginTimestamp": "0", "endTimestamp": "0"},
    ).code == (ResponseCode.NO_PERMISSION)
    # The signature is still waived for what it may do.
    assert raw(b, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, {}, **ADMIN).code == ResponseCode.SUCCESS


def test_view_message_by_id_needs_sub_on_the_stored_topic(tenants: Tenants) -> None:
    # Before: app-user, refused PULL on PrivTopic, read its message by offset (code 33).
    b = tenants.c.broker
    stolen = raw(b, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(tenants.offset(tenants.priv))}, **APP)
    assert stolen.code == ResponseCode.NO_PERMISSION, stolen.payload()
    assert "topic:PrivTopic" in (stolen.remark or "")
    own = raw(b, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(tenants.offset(tenants.own))}, **APP)
    assert own.code == ResponseCode.SUCCESS
    assert decode_message(own.payload()).body == b"mine"
    admin = raw(b, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(tenants.offset(tenants.priv))}, **ADMIN)
    assert admin.code == ResponseCode.SUCCESS
    assert raw(b, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "x"}, **APP).code == ResponseCode.NO_PERMISSION
    missing = raw(b, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(1 << 40)}, **APP)
    assert missing.code == ResponseCode.SYSTEM_ERROR  # nothing stored there: the processor says so


def test_send_back_needs_sub_on_the_stored_topic(tenants: Tenants) -> None:
    # Before: app-user copied PrivTopic's message into %RETRY%AppGroup (code 36), then pulled it.
    b = tenants.c.broker
    fields = {"group": "AppGroup", "delayLevel": "-1", "maxReconsumeTimes": "16"}
    stolen = raw(
        b, RequestCode.CONSUMER_SEND_MSG_BACK, {**fields, "offset": str(tenants.offset(tenants.priv))}, **APP
    )
    assert stolen.code == ResponseCode.NO_PERMISSION, stolen.remark
    own = raw(
        b, RequestCode.CONSUMER_SEND_MSG_BACK, {**fields, "offset": str(tenants.offset(tenants.own))}, **APP
    )
    assert own.code == ResponseCode.SUCCESS, own.remark


def test_lock_batch_needs_the_group(tenants: Tenants) -> None:
    # Before: app-user locked PrivTopic's queues for group PrivOrderly (code 41).
    b = tenants.c.broker

    def body(group: str, topic: str) -> bytes:
        mq = {"topic": topic, "brokerName": "broker-acl", "queueId": 0}
        return orjson.dumps({"consumerGroup": group, "clientId": "attacker@1", "mqSet": [mq]})

    for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        assert raw(b, code, {}, body("PrivOrderly", "PrivTopic"), **APP).code == ResponseCode.NO_PERMISSION
        assert raw(b, code, {}, body("AppGroup", "PrivTopic"), **APP).code == ResponseCode.NO_PERMISSION
        assert raw(b, code, {}, body("AppGroup", "AppTopic"), **APP).code == ResponseCode.SUCCESS
    assert raw(b, RequestCode.LOCK_BATCH_MQ, {}, b"[1]", **APP).code == ResponseCode.NO_PERMISSION


@pytest.mark.parametrize(
    ("code", "fields"),
    [
        (RequestCode.GET_ALL_TOPIC_CONFIG, {}),
        (RequestCode.GET_ALL_CONSUMER_OFFSET, {}),
        (RequestCode.GET_ALL_DELAY_OFFSET, {}),
        (RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}),
        (RequestCode.GET_ALL_PRODUCER_INFO, {}),
        (
            RequestCode.QUERY_CONSUME_QUEUE,
            {"topic": "PrivTopic", "queueId": "0", "index": "0", "count": "1", "consumerGroup": "AppGroup"},
        ),
    ],
)
def test_whole_broker_reads_need_an_admin(tenants: Tenants, code: int, fields: dict[str, str]) -> None:
    # Before: any signed account read every topic's configuration, every group's offsets...
    refused = raw(tenants.c.broker, code, fields, **APP)
    assert refused.code == ResponseCode.NO_PERMISSION
    assert "needs an admin account" in (refused.remark or "")
    assert raw(tenants.c.broker, code, fields, **ADMIN).code == ResponseCode.SUCCESS


def test_validator_without_a_store_asks_an_admin_for_offset_reads(tmp_path: Path) -> None:
    from tidemq.acl import AccessDenied, sign_request
    from tidemq.remoting.command import RemotingCommand
    from tidemq_acl.validator import PlainAccessValidator

    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    v = PlainAccessValidator(path, reload_check_s=0)
    req = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "0"})
    sign_request(req, APP["ak"], APP["sk"])
    with pytest.raises(AccessDenied, match="needs an admin account"):
        v.validate(req, "127.0.0.1:5000")


def test_register_filter_server_needs_an_admin(tenants: Tenants) -> None:
    # Before: anyone, unsigned, put 203.0.113.66:9999 into a topic's filterServerTable.
    fields = {"filterServerAddr": "203.0.113.66:9999"}
    b = tenants.c.broker
    assert raw(b, RequestCode.REGISTER_FILTER_SERVER, fields).code == ResponseCode.NO_PERMISSION
    assert raw(b, RequestCode.REGISTER_FILTER_SERVER, fields, **APP).code == ResponseCode.NO_PERMISSION


def _pull(topic: str, group: str) -> dict[str, str]:
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "8",
        "sysFlag": "4",
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }


def test_filter_server_checks_the_acl_on_what_it_forwards(tenants: Tenants) -> None:
    # Before: the filter server forwarded any pull (unsigned, as itself), and registered unsigned;
    # a signed consumer's pull reached the broker with rewritten fields and a broken signature.
    from tidemq.acl import sign_request
    from tidemq.plugins import get_plugin_manager
    from tidemq.remoting.command import RemotingCommand
    from tidemq_filter_server.filtersrv import FilterServer

    c = tenants.c
    acl = get_plugin_manager().create("acl", "plain", options={"file": str(c.acl_path)})

    async def main() -> None:
        fs = FilterServer(c.broker, acl=acl, credentials=(ADMIN["ak"], ADMIN["sk"]), register_interval_s=60)
        await fs.start()
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            assert fs.registered.is_set()  # a signed admin registration

            async def pull(topic: str, group: str, **sign: str) -> RemotingCommand:
                req = RemotingCommand.request(RequestCode.PULL_MESSAGE, _pull(topic, group))
                if sign:
                    sign_request(req, sign["ak"], sign["sk"])
                return await client.invoke(fs.address, req, 10.0)

            assert (await pull("PrivTopic", "AppGroup")).code == ResponseCode.NO_PERMISSION
            stolen = await pull("PrivTopic", "AppGroup", **APP)
            assert stolen.code == ResponseCode.NO_PERMISSION and "topic:PrivTopic" in stolen.remark
            assert (await pull("AppTopic", "PrivGroup", **APP)).code == ResponseCode.NO_PERMISSION
            forged = RemotingCommand.request(RequestCode.PULL_MESSAGE, _pull("AppTopic", "AppGroup"))
            sign_request(forged, APP["ak"], "not-the-secret")
            assert (await client.invoke(fs.address, forged, 10.0)).code == ResponseCode.NO_PERMISSION
            own = await pull("AppTopic", "AppGroup", **APP)
            assert own.code == ResponseCode.SUCCESS, own.remark
            assert [decode_message(own.payload()).body] == [b"mine"]
        finally:
            await client.close()
            await fs.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--access-key", "ops-admin", "--secret-key", "ops-admin-secret"],
            "--access-key without --acl-file",
        ),
        (["--listen", "0.0.0.0:0"], "reaches beyond this machine"),
    ],
)
def test_filter_server_refuses_to_be_an_open_proxy(args: list[str], needle: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "filtersrv", "--broker", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and needle in out.stderr, out.stderr


def test_end_transaction_needs_pub_on_the_half_messages_topic(tenants: Tenants) -> None:
    # Before: app-user committed (or rolled back) other-user's pending transaction by offset.
    b = tenants.c.broker
    fields = {
        **_send_fields("OtherTopic", group="tx-pg"),
        "f": "4",
        "i": "TRAN_MSG\x01true\x02PGROUP\x01tx-pg\x02",
    }
    half = raw(b, RequestCode.SEND_MESSAGE_V2, fields, b"pending payment", **OTHER)
    assert half.code == ResponseCode.SUCCESS, half.remark
    end = {
        "producerGroup": "tx-pg",
        "tranStateTableOffset": half.ext_fields["queueOffset"],
        "commitLogOffset": str(decode_message_id(half.ext_fields["msgId"])[1]),
        "commitOrRollback": "8",  # commit
        "fromTransactionCheck": "false",
    }
    refused = raw(b, RequestCode.END_TRANSACTION, end, **APP)
    assert refused.code == ResponseCode.NO_PERMISSION and "topic:OtherTopic" in refused.remark
    assert raw(b, RequestCode.END_TRANSACTION, end, **OTHER).code == ResponseCode.SUCCESS
