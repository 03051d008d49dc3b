"""POP consumption (issue 39) through real broker processes: receive, ack, invisibility, revive to
the retry topic, the DLQ after retryMaxTimes, restarts and crashes with messages in flight."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pop_support import PopEnv

from tidemq.client.errors import BrokerError


@pytest.fixture
def env(tmp_path: Path) -> Iterator[PopEnv]:
    """A broker of the test's own: for tests that restart it or read broker-wide figures."""
    e = PopEnv(tmp_path)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PopEnv]:
    """One broker for the tests that neither restart it nor read broker-wide figures: each has a
    topic and groups of its own (PopT<n>, GPOP<n>), so what one leaves in flight is not another's."""
    e = PopEnv(tmp_path_factory.mktemp("pop-shared"))
    try:
        yield e
    finally:
        e.close()


def bodies(msgs) -> list[bytes]:
    return sorted(m.body for m in msgs)


def test_unacknowledged_messages_come_back_after_their_invisible_time(shared: PopEnv) -> None:
    env = shared
    env.send("PopT", 10, "m")
    c = env.consumer("GPOP1", "PopT")
    first = env.receive_all(c, 10, invisible=1.5)
    assert bodies(first) == sorted(f"m-{i}".encode() for i in range(10))
    assert all(m.reconsume_times == 0 for m in first)
    acked, kept = first[:6], first[6:]
    env.ack(c, acked)
    # Invisible meanwhile: nobody of the group gets them.
    assert env.receive(c, 32, 1.0, 0.2) == []
    again = env.receive_all(c, 4, invisible=5, timeout=10)
    assert bodies(again) == bodies(kept)
    assert all(m.reconsume_times == 1 for m in again)
    assert all(m.stored_topic == "%RETRY%GPOP1_PopT" for m in again)
    assert {m.message_id for m in again} == {m.message_id for m in kept}
    env.ack(c, again)
    time.sleep(1.2)
    assert env.receive(c, 32, 1.0, 0.3) == []


def test_an_ack_handle_is_spent_once_and_stale_after_redelivery(shared: PopEnv) -> None:
    env = shared
    env.send("PopT2", 1, "s")
    c = env.consumer("GPOP2", "PopT2")
    [m] = env.receive_all(c, 1, invisible=1.0)
    time.sleep(1.6)
    [again] = env.receive_all(c, 1, invisible=5)
    with pytest.raises(BrokerError) as err:  # the first delivery's handle is stale now
        env.loop.run(c.ack(m))
    assert err.value.code == 208 and "no message in flight" in str(err.value)
    env.loop.run(c.ack(again))
    with pytest.raises(BrokerError) as err:  # replayed
        env.loop.run(c.ack(again))
    assert err.value.code == 208


def test_change_invisible_duration_gives_a_new_handle(shared: PopEnv) -> None:
    env = shared
    env.send("PopT3", 2, "c")
    c = env.consumer("GPOP3", "PopT3")
    msgs = env.receive_all(c, 2, invisible=1.0)
    old = msgs[0].handle
    longer = env.loop.run(c.change_invisible_duration(msgs[0], 4.0))
    assert longer.handle != old
    time.sleep(1.6)
    back = env.receive_all(c, 1, invisible=5, timeout=5)
    assert bodies(back) == [msgs[1].body]  # only the one whose invisibility was not extended
    env.loop.run(c.ack(longer))


def test_pop_and_classic_groups_on_one_topic_are_independent(shared: PopEnv) -> None:
    env = shared
    from tidemq.client import PullConsumer

    env.send("PopT4", 8, "i")
    c = env.consumer("GPOP4", "PopT4")
    env.ack(c, env.receive_all(c, 8))

    async def pull_all() -> int:
        async with PullConsumer("GCLASSIC4", env.namesrv) as pc:
            n = 0
            for mq in await pc.fetch_subscribe_queues("PopT4"):
                r = await pc.pull(mq, "*", 0, 32)
                n += len(r.messages)
            return n

    assert env.loop.run(pull_all()) == 8
    other = env.consumer("GPOP4B", "PopT4")
    got = env.receive_all(other, 8, invisible=1.0)
    assert len(got) == 8
    assert env.loop.run(other.ack_many(got)) == 8  # BATCH_ACK_MESSAGE
    time.sleep(1.3)
    assert env.receive(other, 32, 1.0, 0.3) == []


def test_past_retry_max_times_a_message_goes_to_the_dlq(shared: PopEnv) -> None:
    env = shared
    env.update_group("GPOP5", retryMaxTimes=1)
    env.send("PopT5", 1, "d")
    c = env.consumer("GPOP5", "PopT5")
    assert len(env.receive_all(c, 1, invisible=0.5)) == 1
    time.sleep(0.8)
    [again] = env.receive_all(c, 1, invisible=0.5)
    assert again.reconsume_times == 1
    time.sleep(1.0)
    assert env.receive(c, 32, 1.0, 0.5) == []
    dlq = env.consumer("GDLQ5", "%DLQ%GPOP5")
    env.update_group("GDLQ5")
    from tidemq.remoting.codes import RequestCode

    resp = env.call(RequestCode.GET_MAX_OFFSET, {"topic": "%DLQ%GPOP5", "queueId": 0})
    assert resp.ext_fields["offset"] == "1"
    del dlq


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "sigkill"])
def test_in_flight_messages_survive_a_restart_or_a_crash(env: PopEnv, sig: int) -> None:
    env.send("PopT6", 20, "k")
    c = env.consumer("GPOP6", "PopT6")
    msgs = env.receive_all(c, 20, invisible=2.0)
    assert len(msgs) == 20
    acked, kept = msgs[:5], msgs[5:]
    env.ack(c, acked)
    # The auto-created topic's config reaches topics.json a moment later (any broker's matter,
    # not POP's): kill after that, so the topic is there after the restart.
    from conftest import wait_for

    topics = env.tmp / "data" / "config" / "topics.json"
    assert wait_for(lambda: topics.exists() and "PopT6" in topics.read_text(), 10)
    env.restart(sig)
    # Still invisible right after the restart; back after the invisible time, once each.
    back = env.receive_all(c, 15, invisible=10, timeout=20)
    assert bodies(back) == bodies(kept)
    assert env.receive(c, 32, 1.0, 0.5) == []


def test_in_flight_counts_in_consume_stats_and_runtime_info(env: PopEnv) -> None:
    import orjson

    from tidemq.remoting.codes import RequestCode

    env.call(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": "PopT7", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
    )
    env.send("PopT7", 5, "f")
    c = env.consumer("GPOP7", "PopT7")
    msgs = env.receive_all(c, 5, invisible=30)
    env.ack(c, msgs[:2])
    resp = env.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "GPOP7", "topic": "PopT7"})
    body = resp.body.decode()
    assert '"pullOffset":5' in body and '"inflightMsgCount":3' in body, body
    info = orjson.loads(env.call(RequestCode.GET_BROKER_RUNTIME_INFO, {}).body)["table"]
    assert info["popInFlight"] == "3" and info["popReviveLagMs"] == "0"
    from conftest import run_admin

    out = run_admin(env.namesrv, "consumerProgress", "-g", "GPOP7", cwd=env.tmp)
    assert "PopT7" in out.stdout, out.stdout


@pytest.mark.slow
def test_sigkill_while_acks_stream_in_loses_no_message_and_revives_no_acknowledged_one(env: PopEnv) -> None:
    """3 000 in flight, acknowledged one by one from another thread when the broker is killed:
    every message without an answered ack comes back; none whose ack was answered does."""
    import threading

    env.send("PopT8", 3000, "z")
    c = env.consumer("GPOP8", "PopT8")
    msgs = env.receive_all(c, 3000, invisible=4.0, timeout=60)
    assert len(msgs) == 3000
    answered: set[str] = set()
    stop = threading.Event()

    def acker() -> None:
        for m in msgs:
            if stop.is_set():
                return
            try:
                env.loop.run(c.ack(m), 5)
            except Exception:
                return
            answered.add(m.message_id)

    t = threading.Thread(target=acker)
    t.start()
    time.sleep(0.3)
    env.broker_server.stop(signal.SIGKILL)
    stop.set()
    t.join()
    assert 0 < len(answered) < 3000, len(answered)
    env.restart(signal.SIGKILL)  # already dead: just start it again
    back: dict[str, int] = {}
    deadline = time.monotonic() + 20  # the invisible time is 4 s
    expected = {m.message_id for m in msgs} - answered
    while not expected <= set(back) and time.monotonic() < deadline:
        for m in env.receive(c, 32, 60.0, 0.5):
            back[m.message_id] = back.get(m.message_id, 0) + 1
    assert not set(back) & answered  # no answered ack is undone
    # the one ack in flight at the kill may have been stored without its answer
    assert len(expected - set(back)) <= 1
    assert all(n == 1 for n in back.values())


def test_redeliveries_survive_a_topic_table_that_lost_the_retry_topic(env: PopEnv) -> None:
    """A crash right after a revive can leave messages in %RETRY%<group>_<topic> whose config
    never reached topics.json: POP finds them all the same."""
    import orjson

    env.send("PopT9", 1, "r")
    c = env.consumer("GPOP9", "PopT9")
    [m] = env.receive_all(c, 1, invisible=0.5)
    time.sleep(1.2)  # revived into the retry topic

    def forget_retry_topic() -> None:
        path = env.tmp / "data" / "config" / "topics.json"
        data = orjson.loads(path.read_bytes())
        assert data["topicConfigTable"].pop("%RETRY%GPOP9_PopT9", None) is not None
        path.write_bytes(orjson.dumps(data))

    env.restart(signal.SIGTERM, forget_retry_topic)
    [again] = env.receive_all(c, 1, invisible=5)
    assert again.body == m.body and again.reconsume_times == 1


def test_a_journal_file_of_an_older_version_is_moved_into_the_revive_log(env: PopEnv) -> None:
    """Before the revive log the state was in <data>/pop/journal.log: at the first start it is
    read, written to the revive log and renamed; its expired checkpoints are revived."""
    env.send("PopT9", 8, "j")  # two per queue: offsets 0 and 1 of queues 0..3
    from conftest import wait_for

    topics = env.tmp / "data" / "config" / "topics.json"
    assert wait_for(lambda: topics.exists() and "PopT9" in topics.read_text(), 10)
    journal = env.tmp / "data" / "pop" / "journal.log"
    past = int(time.time() * 1000) - 60_000
    records = [f"C {q + 1} GPOP9 PopT9 {q} {past} 1000 0 2 0 0,1\n" for q in range(4)]
    records.append("A 1 2\n")  # queue 0's offset 1 was acknowledged

    def write_old_journal() -> None:
        journal.parent.mkdir(parents=True, exist_ok=True)
        journal.write_text("".join(records))

    env.restart(signal.SIGTERM, between=write_old_journal)
    c = env.consumer("GPOP9", "PopT9")
    back = env.receive_all(c, 7, invisible=30, timeout=15)
    assert len(back) == 7 and all(m.stored_topic == "%RETRY%GPOP9_PopT9" for m in back)
    assert env.receive(c, 32, 1.0, 0.5) == []  # the pop offsets came along: nothing else
    assert not journal.exists() and journal.with_suffix(".log.migrated").exists()
    # the snapshot written for it is where replay starts now (a consumer offset slaves copy too)
    offsets = env.tmp / "data" / "config" / "consumerOffset.json"
    assert wait_for(lambda: offsets.exists() and "CID_RMQ_SYS_REVIVE_LOG" in offsets.read_text(), 10)
    env.ack(c, back)
    env.restart(signal.SIGKILL)  # read once: not revived again from the file
    assert env.receive(c, 32, 1.0, 2.5) == []
