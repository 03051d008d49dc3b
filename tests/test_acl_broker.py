"""A broker with the plain ACL (``[plugins] acl = "plain"``), run as a subprocess, against tidemq's
own client, raw signed/unsigned requests and ``tidemq admin`` with credentials."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, free_port

from tidemq.acl import sign_request
from tidemq.client import BrokerError, Message, Producer, PullConsumer, PullStatus, SendFailedError
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
      - Secret=DENY
  - accessKey: consumer-ak
    secretKey: consumer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=SUB
    groupPerms:
      - orders-cg=SUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""
PRODUCER = {"access_key": "producer-ak", "secret_key": "producer-secret"}
CONSUMER = {"access_key": "consumer-ak", "secret_key": "consumer-secret"}
ADMIN = ["--access-key", "admin-ak", "--secret-key", "admin-secret"]


class AclCluster:
    """A NameServer and a broker whose ACL file is ``acl_path``."""

    def __init__(self, tmp: Path, acl_text: str = ACL, reload_check_s: float = 0.1) -> None:
        self.tmp = tmp
        self.acl_path = tmp / "plain_acl.yml"
        self.acl_path.write_text(acl_text)
        self.servers: list[Server] = []
        self.namesrv = self._start("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
        (tmp / "broker.toml").write_text(
            "[broker]\n"
            'name = "broker-acl"\n'
            f'listen = "127.0.0.1:{free_port()}"\n'
            f'namesrv = ["{self.namesrv}"]\n'
            f'data_dir = "{tmp / "data"}"\n'
            "[plugins]\n"
            'acl = "plain"\n'
            "[acl.plain]\n"
            f'file = "{self.acl_path}"\n'
            f"reload_check_s = {reload_check_s}\n"
        )
        self.broker_server = self._start("broker", "-c", str(tmp / "broker.toml"))
        self.broker = self.broker_server.addresses["broker"]

    def _start(self, *args: str) -> Server:
        server = Server(list(args), self.tmp)
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
        return subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    def broker_log(self) -> str:
        return self.broker_server.log_path.read_text()

    def rewrite_acl(self, text: str) -> None:
        self.acl_path.write_text(text)
        st = self.acl_path.stat()
        os.utime(
            self.acl_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9)
        )  # a new stamp even within one tick


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclCluster]:
    c = AclCluster(tmp_path_factory.mktemp("acl"))
    out = c.admin("updateTopic", "-t", "Orders", "-r", "2", "-w", "2", "-b", c.broker, *ADMIN)
    assert out.returncode == 0, out.stderr
    yield c
    c.stop()


async def _raw(
    addr: str, code: int, fields: dict[str, str], body: bytes | None = None, **sign: str
) -> RemotingCommand:
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        req = RemotingCommand.request(code, fields, body)
        if sign:
            sign_request(req, sign["ak"], sign["sk"])
        return await client.invoke(addr, req, 5.0)
    finally:
        await client.close()


def raw(
    addr: str, code: int, fields: dict[str, str], body: bytes | None = None, **sign: str
) -> RemotingCommand:
    return asyncio.run(_raw(addr, code, fields, body, **sign))


def _send_fields(topic: str, group: str = "acl-pg") -> dict[str, str]:
    now = str(int(time.time() * 1000))
    return {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": now,
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
        "m": "false",
    }


async def _produce(namesrv: str, topic: str, bodies: list[bytes], **creds: str) -> list[Any]:
    async with Producer("acl-pg", namesrv=namesrv, retry_times=0, **creds) as producer:
        return [await producer.send(Message(topic, b)) for b in bodies]


def produce(namesrv: str, topic: str, bodies: list[bytes], **creds: str) -> list[Any]:
    return asyncio.run(_produce(namesrv, topic, bodies, **creds))


def refused_code(exc: BaseException) -> int | None:
    """The broker's answer code inside a failed send."""
    if isinstance(exc, BrokerError):
        return exc.code
    if isinstance(exc, SendFailedError):
        return next((e.code for e in exc.errors if isinstance(e, BrokerError)), None)
    return None


async def _consume(namesrv: str, topic: str, group: str, want: int, **creds: str) -> list[bytes]:
    async with PullConsumer(group, namesrv=namesrv, **creds) as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        queues = await consumer.fetch_subscribe_queues(topic)
        offsets = dict.fromkeys(queues, 0)
        while len(got) < want and time.monotonic() < deadline:
            for mq in queues:
                result = await consumer.pull(mq, "*", offsets[mq], 32)
                if result.status is PullStatus.FOUND:
                    got.extend(m.body for m in result.messages)
                offsets[mq] = result.next_begin_offset
            await asyncio.sleep(0.05)
        for mq in queues:
            await consumer.update_consume_offset(mq, offsets[mq])  # UPDATE_CONSUMER_OFFSET is checked too
        return got


def test_admin_codes_need_the_admin_account(cluster: AclCluster) -> None:
    args = ["updateTopic", "-t", "AdminOnly", "-b", cluster.broker]
    denied = cluster.admin(*args, "--access-key", "producer-ak", "--secret-key", "producer-secret")
    assert denied.returncode == 1
    assert "NO_PERMISSION(16)" in denied.stderr and "needs an admin account" in denied.stderr
    unsigned = cluster.admin(*args)
    assert unsigned.returncode == 1 and "NO_PERMISSION(16)" in unsigned.stderr
    half = cluster.admin(*args, "--access-key", "admin-ak")
    assert half.returncode == 1 and "must be given together" in half.stderr
    assert cluster.admin(*args, *ADMIN).returncode == 0


def test_credentials_from_the_environment(cluster: AclCluster) -> None:
    env = {**os.environ, "TIDEMQ_ACCESS_KEY": "admin-ak", "TIDEMQ_SECRET_KEY": "admin-secret"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidemq",
            "admin",
            "updateTopic",
            "-t",
            "EnvTopic",
            "-b",
            cluster.broker,
            "-n",
            cluster.namesrv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr


def test_valid_credentials_produce_and_consume(cluster: AclCluster) -> None:
    bodies = [f"order-{i}".encode() for i in range(10)]
    results = produce(cluster.namesrv, "Orders", bodies, **PRODUCER)
    assert all(r.status.name == "SEND_OK" for r in results)
    got = asyncio.run(_consume(cluster.namesrv, "Orders", "orders-cg", len(bodies), **CONSUMER))
    assert sorted(got) == sorted(bodies)


def test_topic_permissions_refuse_with_no_permission(cluster: AclCluster) -> None:
    for topic in ("Secret", "Unlisted"):  # DENY, and the default DENY
        with pytest.raises(SendFailedError) as err:
            produce(cluster.namesrv, topic, [b"x"], **PRODUCER)
        assert refused_code(err.value) == ResponseCode.NO_PERMISSION
        assert f"topic:{topic}" in str(err.value)
    with pytest.raises(SendFailedError) as err:  # SUB only: the consumer may not publish
        produce(cluster.namesrv, "Orders", [b"x"], **CONSUMER)
    assert refused_code(err.value) == ResponseCode.NO_PERMISSION


def test_group_permissions_refuse_a_pull_for_another_group(cluster: AclCluster) -> None:
    resp = raw(
        cluster.broker,
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "other-cg",
            "topic": "Orders",
            "queueId": "0",
            "queueOffset": "0",
            "maxMsgNums": "1",
            "sysFlag": "0",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subVersion": "0",
        },
        ak="consumer-ak",
        sk="consumer-secret",
    )
    assert resp.code == ResponseCode.NO_PERMISSION and "group:other-cg" in (resp.remark or "")


def test_unsigned_wrong_secret_and_unknown_key_are_refused_and_logged(cluster: AclCluster) -> None:
    fields = _send_fields("Orders")
    unsigned = raw(cluster.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x")
    assert unsigned.code == ResponseCode.NO_PERMISSION and "no AccessKey" in (unsigned.remark or "")
    wrong = raw(
        cluster.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x", ak="producer-ak", sk="not-the-secret"
    )
    assert wrong.code == ResponseCode.NO_PERMISSION and "signature check failed" in (wrong.remark or "")
    unknown = raw(cluster.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x", ak="stranger-ak", sk="whatever1")
    assert unknown.code == ResponseCode.NO_PERMISSION and "stranger-ak" in (unknown.remark or "")
    good = raw(
        cluster.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x", ak="producer-ak", sk="producer-secret"
    )
    assert good.code == ResponseCode.SUCCESS  # the broker stayed up and serves valid requests
    deadline = time.monotonic() + 5
    while "stranger-ak" not in cluster.broker_log() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [ln for ln in cluster.broker_log().splitlines() if "refused SEND_MESSAGE_V2" in ln]
    assert any(
        "WARNING" in ln and "127.0.0.1:" in ln and "'producer-ak'" in ln and "(code 310)" in ln
        for ln in lines
    )
    assert any("'stranger-ak'" in ln for ln in lines)
    log = cluster.broker_log()
    assert "producer-secret" not in log and "not-the-secret" not in log and "Signature" not in log


def test_file_changes_are_reloaded_without_restart(tmp_path: Path) -> None:
    c = AclCluster(tmp_path)
    try:
        with pytest.raises(SendFailedError):
            produce(c.namesrv, "Secret", [b"x"], **PRODUCER)
        c.rewrite_acl(ACL.replace("Secret=DENY", "Secret=PUB"))
        deadline = time.monotonic() + 10
        while True:
            try:
                produce(c.namesrv, "Secret", [b"now allowed"], **PRODUCER)
                break
            except SendFailedError:
                assert time.monotonic() < deadline, "the changed ACL file was not reloaded"
                time.sleep(0.2)
        c.rewrite_acl("accounts: [broken")  # a broken edit keeps the accounts in force
        time.sleep(0.5)
        produce(c.namesrv, "Secret", [b"still allowed"], **PRODUCER)
        assert "plain ACL not reloaded" in c.broker_log()
    finally:
        c.stop()


def test_white_addresses_pass_without_signature(tmp_path: Path) -> None:
    acl = ACL.replace(
        "    secretKey: producer-secret\n",
        "    secretKey: producer-secret\n    whiteRemoteAddress: 127.0.0.1\n",
    )
    c = AclCluster(tmp_path, acl)
    try:
        fields = _send_fields("Orders")
        named = {**fields, "AccessKey": "producer-ak"}  # no signature: the account's white address
        assert raw(c.broker, RequestCode.SEND_MESSAGE_V2, named, b"x").code == ResponseCode.SUCCESS
        assert raw(c.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x").code == ResponseCode.NO_PERMISSION
        c.rewrite_acl(
            ACL.replace("globalWhiteRemoteAddresses:\n", "globalWhiteRemoteAddresses:\n  - 127.0.0.*\n")
        )
        deadline = time.monotonic() + 10
        while raw(c.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x").code != ResponseCode.SUCCESS:
            assert time.monotonic() < deadline, "the global white list was not applied"
            time.sleep(0.2)
        c.rewrite_acl(
            ACL.replace("globalWhiteRemoteAddresses:\n", "globalWhiteRemoteAddresses:\n  - 127.0.0.2-255\n")
        )
        deadline = time.monotonic() + 10
        while raw(c.broker, RequestCode.SEND_MESSAGE_V2, fields, b"x").code != ResponseCode.NO_PERMISSION:
            assert time.monotonic() < deadline, "127.0.0.1 is outside 127.0.0.2-255"
            time.sleep(0.2)
    finally:
        c.stop()


def test_a_broken_acl_file_at_start_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text("accounts: [{accessKey: short, secretKey: x}]")
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\ndata_dir = "{tmp_path / "d"}"\n[plugins]\nacl = "plain"\n'
        f'[acl.plain]\nfile = "{tmp_path / "plain_acl.yml"}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "broker", "-c", str(tmp_path / "broker.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()[-1]
    assert "plain_acl.yml" in err and "accessKey must be at least 7" in err
