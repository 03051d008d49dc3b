"""A topic created on first use survives a SIGKILL once a send to it was acknowledged.

The broker writes ``config/topics.json`` off the event loop, a burst of changes in one write.  A
topic auto-created by a producer's send (``autoCreateTopicEnable``), and a retry or dead-letter
topic created by a consumer's send-back, must be on disk before the send is answered: else a
SIGKILL just after the answer leaves the messages in the commit log under a topic the restarted
broker does not have, and no consumer can route to them.  A clean stop writes every table, so only
a killed broker shows this.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.broker import Broker
from tidemq.config import compose, parse_config
from tidemq.message import properties_to_string
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

GROUP = "Keepers"
RETRY, DLQ = f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"


def invoke(addr: str, *requests: tuple[int, dict[str, Any], bytes | None]) -> list[RemotingCommand]:
    """The requests' answers, one after the other over one connection."""

    async def go() -> list[RemotingCommand]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            return [
                await client.invoke(addr, RemotingCommand.request(code, fields, body), 5.0)
                for code, fields, body in requests
            ]
        finally:
            await client.close()

    return asyncio.run(go())


def send(topic: str, body: bytes, reconsume_times: int = 0) -> tuple[int, dict[str, Any], bytes]:
    fields = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_string({"TAGS": "t"}),
        "reconsumeTimes": reconsume_times,
        "maxReconsumeTimes": 2,
    }
    return RequestCode.SEND_MESSAGE, fields, body


def broker_config(tmp_path: Path) -> Path:
    config = tmp_path / "broker.toml"
    data = tmp_path / "data"
    config.write_text(f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = []\ndata_dir = "{data}"\n')
    return config


def topics_of(addr: str) -> dict[str, Any]:
    (resp,) = invoke(addr, (RequestCode.GET_ALL_TOPIC_CONFIG, {}, None))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return dict(orjson.loads(resp.body or b"{}")["topicConfigTable"])


def pulled(addr: str, topic: str, queue_id: int) -> list[int]:
    """Queue offsets a pull from 0 finds (the topic routes: it is in the restarted broker's table)."""
    fields = {
        "consumerGroup": GROUP,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": 0,
        "maxMsgNums": 32,
        "sysFlag": 4,  # PullSysFlag.FLAG_SUBSCRIPTION: the subscription is in the request
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "expressionType": "TAG",
        "subVersion": 0,
    }
    (resp,) = invoke(addr, (RequestCode.PULL_MESSAGE, fields, None))
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return list(range(int(resp.ext_fields["minOffset"]), int(resp.ext_fields["maxOffset"])))


def test_a_topic_auto_created_by_a_send_survives_a_sigkill_just_after_the_answer(
    spawn: Any, tmp_path: Path
) -> None:
    config = broker_config(tmp_path)
    broker = spawn("broker", "-c", str(config))
    (addr,) = broker.addresses.values()
    # Sends on one connection, the first and the third to a topic they create; the broker dies
    # as soon as the last answer is read.
    answers = invoke(addr, send("Fresh", b"first"), send("Fresh", b"second"), send("Other", b"third"))
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 3, [a.remark for a in answers]
    broker.stop(signal.SIGKILL)
    assert (tmp_path / "data" / "abort").exists()  # killed, not stopped

    again = spawn("broker", "-c", str(config))
    (addr,) = again.addresses.values()
    table = topics_of(addr)
    assert {"Fresh", "Other"} <= set(table), sorted(table)
    assert (table["Fresh"]["readQueueNums"], table["Fresh"]["writeQueueNums"], table["Fresh"]["perm"]) == (
        4,
        4,
        6,
    )
    assert pulled(addr, "Fresh", 0) == [0, 1] and pulled(addr, "Other", 0) == [0]


def test_retry_and_dead_letter_topics_created_by_sends_back_survive_a_sigkill(
    spawn: Any, tmp_path: Path
) -> None:
    config = broker_config(tmp_path)
    broker = spawn("broker", "-c", str(config))
    (addr,) = broker.addresses.values()
    create = {"topic": "Orders", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
    made, sent = invoke(addr, (RequestCode.UPDATE_AND_CREATE_TOPIC, create, None), send("Orders", b"o"))
    assert (made.code, sent.code) == (ResponseCode.SUCCESS, ResponseCode.SUCCESS), (made.remark, sent.remark)
    offset = int(sent.ext_fields["msgId"][-16:], 16)  # the commit-log offset ends an offset message id

    def back(delay_level: int) -> tuple[int, dict[str, Any], None]:
        fields = {
            "group": GROUP,
            "offset": offset,
            "delayLevel": delay_level,
            "originMsgId": "",
            "maxReconsumeTimes": 16,
        }
        return RequestCode.CONSUMER_SEND_MSG_BACK, fields, None

    # A failed message to %RETRY%Keepers (delay level 0: the broker's), another straight to
    # %DLQ%Keepers (delay level -1); the broker dies as soon as the second is answered.
    answers = invoke(addr, back(0), back(-1))
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 2, [a.remark for a in answers]
    broker.stop(signal.SIGKILL)

    again = spawn("broker", "-c", str(config))
    (addr,) = again.addresses.values()
    table = topics_of(addr)
    assert {RETRY, DLQ} <= set(table), sorted(table)
    assert table[DLQ]["perm"] == 2 and table[RETRY]["perm"] == 6  # as created: the DLQ write-only


def test_a_dead_letter_topic_a_producer_resend_creates_survives_a_sigkill(spawn: Any, tmp_path: Path) -> None:
    """A message sent to %RETRY%<group> past its retries goes to %DLQ%<group>, created by that send."""
    config = broker_config(tmp_path)
    broker = spawn("broker", "-c", str(config))
    (addr,) = broker.addresses.values()
    (answer,) = invoke(addr, send(RETRY, b"given up", reconsume_times=2))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    broker.stop(signal.SIGKILL)

    again = spawn("broker", "-c", str(config))
    (addr,) = again.addresses.values()
    table = topics_of(addr)
    assert DLQ in table, sorted(table)


def test_a_send_whose_topic_cannot_be_written_is_answered_flush_disk_timeout_and_the_broker_goes_on(
    tmp_path: Path,
) -> None:
    """A ``topics.json`` that cannot be replaced (here a directory in its place, as a full disk
    would): the message is stored, the answer says it is not durable, and once the file can be
    written again the topic is in it and sends to it succeed."""

    async def go() -> None:
        cfg = parse_config(
            {"broker": {"listen": "127.0.0.1:0", "namesrv": [], "data_dir": str(tmp_path / "b")}}
        )
        broker = Broker(compose(cfg))
        await broker.start()
        client = get_plugin_manager().create("transport", "tcp").client()
        path = tmp_path / "b" / "config" / "topics.json"
        try:
            await asyncio.to_thread(broker.topics.persist)
            path.unlink()
            path.mkdir()
            (path / "in-the-way").write_text("x")  # os.replace onto a non-empty directory fails
            code, fields, body = send("Blocked", b"kept")
            first = await client.invoke(broker.address, RemotingCommand.request(code, fields, body), 5.0)
            assert first.code == ResponseCode.FLUSH_DISK_TIMEOUT, (first.code, first.remark)
            assert "topics.json" in (first.remark or "")
            assert first.ext_fields.get("msgId")  # stored all the same
            (path / "in-the-way").unlink()
            path.rmdir()
            deadline = time.monotonic() + 10
            while not path.is_file() and time.monotonic() < deadline:  # the writer retries each second
                await asyncio.sleep(0.1)
            assert "Blocked" in orjson.loads(path.read_bytes())["topicConfigTable"]
            again = await client.invoke(broker.address, RemotingCommand.request(code, fields, b"more"), 5.0)
            assert again.code == ResponseCode.SUCCESS, again.remark
        finally:
            await client.close()
            await broker.stop()

    asyncio.run(go())
