"""POP FIFO for consumeMessageOrderly groups, long polling, NOTIFICATION / POLLING_INFO and TAG /
SQL92 filters on POP (issue 39)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from conftest import run_admin
from pop_support import PopEnv

from tidemq.remoting.codes import RequestCode


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PopEnv]:
    e = PopEnv(tmp_path_factory.mktemp("popfifo"), "enable_property_filter = true\n")
    try:
        yield e
    finally:
        e.close()


def test_fifo_group_gets_a_queues_next_messages_only_after_the_ack(env: PopEnv) -> None:
    run_admin(env.namesrv, "updateSubGroup", "-b", env.broker, "-g", "GFIFO", "-o", "true", cwd=env.tmp)
    resp = env.call(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": "FifoT", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
    )
    assert resp.code == 0, resp.remark
    env.send("FifoT", 6, "f")
    c = env.consumer("GFIFO", "FifoT")
    first = env.receive(c, 2, 1.0, 0.3)
    assert [m.body for m in first] == [b"f-0", b"f-1"]
    # The queue is blocked while the batch is in flight.
    assert env.receive(c, 2, 1.0, 0.2) == []
    env.ack(c, first[:1])
    assert env.receive(c, 2, 1.0, 0.2) == []  # f-1 is still in flight
    # f-1's invisibility runs out: it comes back first, in order, with its attempt count.
    again = env.receive_all(c, 1, invisible=5, timeout=5)
    assert [m.body for m in again][:1] == [b"f-1"] and again[0].reconsume_times == 1
    assert [m.body for m in again] == [b"f-1", b"f-2", b"f-3", b"f-4", b"f-5"][: len(again)]
    env.ack(c, again)
    rest = env.receive_all(c, 5 - len(again), invisible=5, timeout=5) if len(again) < 5 else []
    assert [m.body for m in again + rest] == [b"f-1", b"f-2", b"f-3", b"f-4", b"f-5"]


def test_a_waiting_pop_is_answered_when_a_message_arrives(env: PopEnv) -> None:
    c = env.consumer("GPOLL", "PollT")
    env.send("PollT", 1, "warm")  # the topic exists
    env.ack(c, env.receive_all(c, 1))
    timer = threading.Timer(0.8, lambda: env.send("PollT", 1, "late"))
    timer.start()
    start = time.monotonic()
    got = env.loop.run(c.receive(4, 5.0, 4.0), 30)
    took = time.monotonic() - start
    timer.join()
    assert [m.body for m in got] == [b"late-0"]
    assert 0.6 < took < 3.0, took


def test_notification_and_polling_info(env: PopEnv) -> None:
    env.send("NotifT", 1, "n")
    fields = {"consumerGroup": "GNOTIF", "topic": "NotifT", "queueId": -1, "pollTime": 0, "bornTime": 0}
    resp = env.call(RequestCode.NOTIFICATION, fields)
    assert resp.code == 0 and resp.ext_fields["hasMsg"] == "true"
    c = env.consumer("GNOTIF", "NotifT")
    env.ack(c, env.receive_all(c, 1))
    start = time.monotonic()
    resp = env.call(RequestCode.NOTIFICATION, dict(fields, pollTime=500))
    assert resp.ext_fields["hasMsg"] == "false" and time.monotonic() - start >= 0.45
    resp = env.call(RequestCode.POLLING_INFO, {"consumerGroup": "GNOTIF", "topic": "NotifT", "queueId": 0})
    assert resp.code == 0 and resp.ext_fields["pollingNum"] == "0"


def test_tag_and_sql92_filters(env: PopEnv) -> None:
    env.send("FiltT", 3, "a", tags="TagA")
    env.send("FiltT", 3, "b", tags="TagB")
    c = env.consumer("GFILT", "FiltT", "TagB")
    got = env.receive_all(c, 3)
    assert sorted(m.body for m in got) == [b"b-0", b"b-1", b"b-2"]
    assert env.receive(c, 32, 1.0, 0.2) == []
    s = env.consumer("GFILTSQL", "FiltT", "TAGS = 'TagA'", expression_type="SQL92")
    got = env.receive_all(s, 3)
    assert sorted(m.body for m in got) == [b"a-0", b"a-1", b"a-2"]


def test_set_consume_mode_and_query_assignment(env: PopEnv) -> None:
    import orjson

    env.send("AssignT", 1, "q")
    body = orjson.dumps({"topic": "AssignT", "consumerGroup": "GASSIGN", "clientId": "c1"})
    resp = env.call(RequestCode.QUERY_ASSIGNMENT, {}, body)
    assigned = orjson.loads(resp.body)["messageQueueAssignments"]
    assert resp.code == 0 and {a["mode"] for a in assigned} == {"PULL"}
    assert sorted(a["messageQueue"]["queueId"] for a in assigned) == [0, 1, 2, 3]
    out = run_admin(
        env.namesrv,
        "setConsumeMode",
        "-b",
        env.broker,
        "-t",
        "AssignT",
        "-g",
        "GASSIGN",
        "-m",
        "POP",
        cwd=env.tmp,
    )
    assert "success" in out.stdout
    resp = env.call(RequestCode.QUERY_ASSIGNMENT, {}, body)
    assigned = orjson.loads(resp.body)["messageQueueAssignments"]
    assert [(a["mode"], a["messageQueue"]["queueId"]) for a in assigned] == [("POP", -1)]
    bad = run_admin(
        env.namesrv,
        "setConsumeMode",
        "-b",
        env.broker,
        "-t",
        "AssignT",
        "-g",
        "GASSIGN",
        "-m",
        "PUSH",
        cwd=env.tmp,
        ok=False,
    )
    assert bad.returncode != 0 and "PULL or POP" in bad.stderr
    resp = env.call(RequestCode.QUERY_ASSIGNMENT, {}, b"[1]")
    assert resp.code == 29
    resp = env.call(
        RequestCode.SET_MESSAGE_REQUEST_MODE,
        {},
        orjson.dumps({"topic": "NoSuch", "consumerGroup": "G", "mode": "POP"}),
    )
    assert resp.code == 17


def test_peek_shows_what_a_pop_would_read_and_takes_nothing(env: PopEnv) -> None:
    from tidemq.message import iter_messages

    env.send("PeekT", 3, "p")
    fields = {"consumerGroup": "GPEEK", "topic": "PeekT", "queueId": -1, "maxMsgNums": 32, "bornTime": 0}
    for _ in range(2):  # twice: peeking moves nothing
        resp = env.call(RequestCode.PEEK_MESSAGE, fields)
        assert resp.code == 0, resp.remark
        assert sorted(m.body for m in iter_messages(resp.body)) == [b"p-0", b"p-1", b"p-2"]
        assert resp.ext_fields["restNum"] == "3"
    c = env.consumer("GPEEK", "PeekT")
    env.ack(c, env.receive_all(c, 3))
    resp = env.call(RequestCode.PEEK_MESSAGE, fields)
    assert resp.code == 19 and resp.ext_fields["restNum"] == "0"
    assert env.call(RequestCode.PEEK_MESSAGE, dict(fields, maxMsgNums=0)).code == 29
