"""POP's wire pinned to RocketMQ 5's sources (issue 39): request and response header field names
(``PopMessageRequestHeader``, ``PopMessageResponseHeader``, ``AckMessageRequestHeader``,
``ChangeInvisibleTimeRequestHeader``/``ResponseHeader``) and the ``extraInfo`` a RocketMQ 5 remoting
client builds from the answer (``ExtraInfoUtil.buildExtraInfo``, ``parseStartOffsetInfo``,
``parseMsgOffsetInfo``).  No RocketMQ 5 remoting client is installable here (docs/pop.md), so the
client's side is written out below as the Java code does it, from raw requests."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from pop_support import BROKER, PopEnv

from tidemq.message import iter_messages
from tidemq.remoting.codes import RequestCode

TOPIC = "PopWire"
GROUP = "GPOPWIRE"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PopEnv]:
    e = PopEnv(tmp_path_factory.mktemp("popwire"))
    try:
        e.send(TOPIC, 6, "w")
        yield e
    finally:
        e.close()


def java_parse_info(info: str) -> dict[str, str]:
    """ExtraInfoUtil.parse*Info: ``;``-separated ``retry queueId value`` entries, keyed
    ``retry@queueId``; an entry with more or fewer separators is an error, a key seen twice too."""
    out: dict[str, str] = {}
    for entry in info.split(";"):
        m = re.fullmatch(r"([^ ]+) ([^ ]+) ([^ ]+)", entry)
        assert m is not None, f"{entry!r} is not 'retry queueId value'"
        key = f"{m.group(1)}@{m.group(2)}"
        assert key not in out, f"duplicate {key} in {info!r}"
        out[key] = m.group(3)
    return out


def java_extra_info(ck: int, pop_time: str, invisible: str, rqid: str, topic: str, qid: int, off: int) -> str:
    """ExtraInfoUtil.buildExtraInfo(ckQueueOffset, popTime, invisibleTime, reviveQid, topic,
    brokerName, queueId, msgQueueOffset), KEY_SEPARATOR being a space."""
    retry = (
        "2" if topic.startswith("%RETRY%") and "+" in topic else "1" if topic.startswith("%RETRY%") else "0"
    )
    return f"{ck} {pop_time} {invisible} {rqid} {retry} {BROKER} {qid} {off}"


def test_pop_ack_and_change_invisible_with_rocketmq_5_field_names(env: PopEnv) -> None:
    pop = env.call(
        RequestCode.POP_MESSAGE,
        {  # PopMessageRequestHeader's fields
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": -1,
            "maxMsgNums": 32,
            "invisibleTime": 60_000,
            "pollTime": 1000,
            "bornTime": 1,
            "initMode": 0,
            "expType": "TAG",
            "exp": "*",
            "order": "false",
            "attemptId": "a1",
        },
    )
    assert pop.code == 0, pop.remark
    h = pop.ext_fields or {}
    # PopMessageResponseHeader: @CFNotNull popTime invisibleTime reviveQid restNum; the three infos
    assert {"popTime", "invisibleTime", "reviveQid", "restNum", "startOffsetInfo", "msgOffsetInfo"} <= set(h)
    assert h["invisibleTime"] == "60000" and h["reviveQid"] == "0" and int(h["restNum"]) >= 0
    assert "orderCountInfo" not in h  # only FIFO pops carry attempt counts
    starts = java_parse_info(h["startOffsetInfo"])
    offsets = {k: [int(o) for o in v.split(",")] for k, v in java_parse_info(h["msgOffsetInfo"]).items()}
    assert set(starts) == set(offsets)
    msgs = list(iter_messages(pop.payload() or b""))
    assert len(msgs) == 6
    handles = []
    for m in msgs:
        key = f"0@{m.queue_id}"  # ExtraInfoUtil.getStartOffsetInfoMapKey(topic, queueId)
        assert m.queue_offset in offsets[key]
        handles.append((m, java_extra_info(int(starts[key]), h["popTime"], h["invisibleTime"], h["reviveQid"], m.topic, m.queue_id, m.queue_offset)))  # fmt: skip
    # AckMessageRequestHeader: consumerGroup topic queueId extraInfo offset
    m, extra = handles[0]
    ack = env.call(
        RequestCode.ACK_MESSAGE,
        {
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": m.queue_id,
            "extraInfo": extra,
            "offset": m.queue_offset,
        },
    )
    assert ack.code == 0, ack.remark
    # ChangeInvisibleTimeRequestHeader: the same and invisibleTime; the answer's header
    # (ChangeInvisibleTimeResponseHeader) popTime invisibleTime reviveQid make the new handle.
    m, extra = handles[1]
    change = env.call(
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        {
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": m.queue_id,
            "extraInfo": extra,
            "offset": m.queue_offset,
            "invisibleTime": 30_000,
        },
    )
    assert change.code == 0, change.remark
    ch = change.ext_fields or {}
    assert ch["invisibleTime"] == "30000" and {"popTime", "reviveQid"} <= set(ch)
    # the client's new handle: the message's own offset as ckQueueOffset (MQClientAPIImpl)
    new = java_extra_info(m.queue_offset, ch["popTime"], ch["invisibleTime"], ch["reviveQid"], TOPIC, m.queue_id, m.queue_offset)  # fmt: skip
    assert env.call(RequestCode.ACK_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": m.queue_id, "extraInfo": new, "offset": m.queue_offset}).code == 0  # fmt: skip
    stale = env.call(RequestCode.ACK_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": m.queue_id, "extraInfo": extra, "offset": m.queue_offset})  # fmt: skip
    assert stale.code == 208  # NO_MESSAGE: the old handle was spent by the change
