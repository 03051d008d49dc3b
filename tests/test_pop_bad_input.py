"""POP's refusals (issue 39): unknown groups and topics, invisible times out of range, forged,
stale, replayed and foreign ack handles, oversized batch acks; nothing acknowledged that was not
received, and the broker keeps serving."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator

import orjson
import pytest
from pop_support import PopEnv

from tidemq.remoting.codes import RequestCode

INVALID_PARAMETER = 29
NO_MESSAGE = 208
TOPIC = "PopBad"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PopEnv]:
    e = PopEnv(tmp_path_factory.mktemp("popbad"), "auto_create_subscription_group = false\n")
    try:
        e.update_group("GBAD")
        e.update_group("GOTHER")
        e.send(TOPIC, 6, "b")
        yield e
    finally:
        e.close()


def pop_fields(**over: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "consumerGroup": "GBAD",
        "topic": TOPIC,
        "queueId": -1,
        "maxMsgNums": 32,
        "invisibleTime": 1000,
        "pollTime": 0,
        "bornTime": int(time.time() * 1000),
        "initMode": 0,
    }
    fields.update(over)
    return fields


@pytest.mark.parametrize(
    ("over", "code", "words"),
    [
        ({"consumerGroup": "GNOPE"}, 26, "does not exist"),
        ({"topic": "NoSuchTopic"}, 17, "not exist"),
        ({"invisibleTime": -1}, INVALID_PARAMETER, "invisibleTime -1 ms is out of range"),
        ({"invisibleTime": 0}, INVALID_PARAMETER, "out of range"),
        ({"invisibleTime": 10**15}, INVALID_PARAMETER, "out of range"),
        ({"invisibleTime": "soon"}, INVALID_PARAMETER, "not an integer"),
        ({"maxMsgNums": 0}, INVALID_PARAMETER, "maxMsgNums 0"),
        ({"maxMsgNums": 10_000}, INVALID_PARAMETER, "maxMsgNums 10000"),
        ({"queueId": 99}, INVALID_PARAMETER, "queueId[99] is illegal"),
        ({"topic": "%RETRY%GBAD_PopBad"}, INVALID_PARAMETER, "not its retry topic"),
        ({"expType": "SQL92", "exp": "a >"}, None, ""),  # refused one way or the other, never a crash
    ],
)
def test_pop_refusals(env: PopEnv, over: dict[str, object], code: int | None, words: str) -> None:
    resp = env.call(RequestCode.POP_MESSAGE, pop_fields(**over))
    if code is None:
        assert resp.code not in (0,), resp.remark
    else:
        assert resp.code == code, resp.remark
        assert words in (resp.remark or "")


def test_forged_stale_replayed_and_foreign_handles_acknowledge_nothing(env: PopEnv) -> None:
    c = env.consumer("GBAD", TOPIC)
    msgs = env.receive_all(c, 6, invisible=1.5)
    assert len(msgs) == 6
    m = msgs[0]

    def ack(
        group: str = "GBAD",
        topic: str = TOPIC,
        qid: int | None = None,
        off: int | None = None,
        handle: str | None = None,
    ) -> tuple[int, str]:
        resp = env.call(
            RequestCode.ACK_MESSAGE,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": m.queue_id if qid is None else qid,
                "offset": m.queue_offset if off is None else off,
                "extraInfo": m.handle if handle is None else handle,
            },
        )
        return resp.code, resp.remark or ""

    parts = m.handle.split(" ")
    forged_time = " ".join([parts[0], str(int(parts[1]) + 7), *parts[2:]])
    assert ack(handle="garbage")[0] == INVALID_PARAMETER
    assert ack(handle="1 2 3 4 9 x 0 0")[0] == INVALID_PARAMETER  # retry mark 9
    assert ack(handle=forged_time)[0] == NO_MESSAGE  # well formed, never handed out
    assert ack(off=m.queue_offset + 1000)[0] == INVALID_PARAMETER  # the header and the handle disagree
    code, remark = ack(group="GOTHER")  # another group's message
    assert code == NO_MESSAGE and "GOTHER" in remark
    assert ack(group="GNOPE")[0] == 26
    assert ack(topic="NoSuchTopic")[0] == 17
    assert ack(topic="%RETRY%GBAD_PopBad")[0] in (INVALID_PARAMETER, 17)
    # change of invisibility: out of range, and forged
    for bad in (-5, 0, 10**15):
        resp = env.call(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            {
                "consumerGroup": "GBAD",
                "topic": TOPIC,
                "queueId": m.queue_id,
                "offset": m.queue_offset,
                "extraInfo": m.handle,
                "invisibleTime": bad,
            },
        )
        assert resp.code == INVALID_PARAMETER, resp.remark
    resp = env.call(
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        {
            "consumerGroup": "GOTHER",
            "topic": TOPIC,
            "queueId": m.queue_id,
            "offset": m.queue_offset,
            "extraInfo": m.handle,
            "invisibleTime": 60_000,
        },
    )
    assert resp.code == NO_MESSAGE
    # Batch acks: 10 k entries, a giant bit set, malformed bodies, then offsets never popped.
    entry = {
        "c": "GBAD",
        "t": TOPIC,
        "r": "0",
        "q": m.queue_id,
        "so": int(parts[0]),
        "rq": 0,
        "pt": int(parts[1]),
        "it": int(parts[2]),
        "b": base64.b64encode(b"\xff" * 4).decode(),
    }
    resp = env.call(
        RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps({"brokerName": "x", "acks": [entry] * 10_000})
    )
    assert resp.code == INVALID_PARAMETER and "10000 BatchAck entries" in resp.remark
    huge = dict(entry, b=base64.b64encode(b"\xff" * 100_000).decode())
    resp = env.call(RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps({"acks": [huge]}))
    assert resp.code == NO_MESSAGE and "bits" in resp.remark
    for body in (b"{", b"[]", b'{"acks": 5}', b'{"acks": [1, {"c": "GBAD"}]}'):
        resp = env.call(RequestCode.BATCH_ACK_MESSAGE, {}, body)
        assert resp.code in (INVALID_PARAMETER, NO_MESSAGE), resp.remark
    foreign = dict(entry, c="GOTHER")
    resp = env.call(RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps({"acks": [foreign]}))
    assert resp.code == NO_MESSAGE and "acknowledged 0" in resp.remark
    # Nothing above acknowledged anything: all six come back after their invisible time.
    time.sleep(1.6)
    back = env.receive_all(c, 6, invisible=30)
    assert sorted(x.body for x in back) == sorted(x.body for x in msgs)
    # A batch ack naming the popped offsets and some never popped: the popped ones only.
    by_q: dict[tuple[int, str], list] = {}
    for x in back:
        by_q.setdefault((x.queue_id, x.handle.split(" ")[0]), []).append(x)
    acks = []
    for (qid, start), group in by_q.items():
        p = group[0].handle.split(" ")
        bits = 0
        for x in group:
            bits |= 1 << (x.queue_offset - int(start))
        bits |= 1 << 40  # never popped
        acks.append(
            {
                "c": "GBAD",
                "t": TOPIC,
                "r": p[4],
                "q": qid,
                "so": int(start),
                "rq": int(p[3]),
                "pt": int(p[1]),
                "it": int(p[2]),
                "b": base64.b64encode(bits.to_bytes((bits.bit_length() + 7) // 8, "little")).decode(),
            }
        )
    resp = env.call(
        RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps({"brokerName": "broker-pop", "acks": acks})
    )
    assert resp.code == NO_MESSAGE and f"acknowledged 6, refused {len(acks)}" in resp.remark
    # and a replay of the same batch acknowledges nothing more
    resp = env.call(RequestCode.BATCH_ACK_MESSAGE, {}, orjson.dumps({"acks": acks}))
    assert "acknowledged 0" in resp.remark
    # the broker still serves
    assert env.call(RequestCode.POP_MESSAGE, pop_fields()).code == 19


def test_acks_pipelined_on_one_connection_are_answered_one_by_one(env: PopEnv) -> None:
    """ACK_MESSAGEs read together are taken together (one revive-log record), but each answer is
    its own: a duplicate in the same run, a forged handle and an unknown group are refused alone."""
    from tidemq.client.admin import AdminClient
    from tidemq.remoting.command import RemotingCommand

    env.update_group("GPIPE")
    env.send("PopPipe", 6, "p")
    c = env.consumer("GPIPE", "PopPipe")
    msgs = env.receive_all(c, 6, invisible=30)
    assert len(msgs) == 6

    def fields(m, group: str = "GPIPE", handle: str | None = None) -> dict[str, object]:
        return {
            "consumerGroup": group,
            "topic": m.stored_topic,
            "queueId": m.queue_id,
            "offset": m.queue_offset,
            "extraInfo": m.handle if handle is None else handle,
        }

    parts = msgs[4].handle.split(" ")
    forged = " ".join([parts[0], str(int(parts[1]) + 3), *parts[2:]])
    batch = [
        fields(msgs[0]),
        fields(msgs[1]),
        fields(msgs[1]),  # the same message again, in the same run
        fields(msgs[2]),
        fields(msgs[4], handle=forged),
        fields(msgs[3], group="GNOPE"),
        {"consumerGroup": "GPIPE", "topic": "PopPipe"},  # fields missing
        fields(msgs[3]),
    ]

    async def go() -> list[RemotingCommand]:
        client = AdminClient(env.namesrv, timeout=15)
        try:
            return await asyncio.gather(
                *(
                    client.call(env.broker, RequestCode.ACK_MESSAGE, f, None, ok=tuple(range(-1, 1_000_000)))
                    for f in batch
                )
            )
        finally:
            await client.close()

    codes = [r.code for r in env.loop.run(go(), 30)]
    assert codes[0] == 0 and codes[3] == 0 and codes[7] == 0
    assert sorted(codes[1:3]) == [0, NO_MESSAGE]
    assert codes[4] == NO_MESSAGE and codes[5] == 26 and codes[6] == INVALID_PARAMETER
    # msgs[4] and msgs[5] are still in flight: their own handles acknowledge them, once.
    env.ack(c, msgs[4:6])
    again = env.call(RequestCode.ACK_MESSAGE, fields(msgs[0]))
    assert again.code == NO_MESSAGE
