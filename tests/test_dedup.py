"""The duplicate window on UNIQ_KEY (issue 37), over the wire against an in-process broker.

A resend within ``dedup_window_s`` is answered as its first send (msgId, queueId, queueOffset)
and not stored again; bad keys are stored normally or refused in one line; the window keeps its
bounds; it survives a restart (rebuilt from the commit log).  The official client's proofs are in
tests/compat/test_dedup_official.py, the SIGKILL and failover ones in tests/test_dedup_crash.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.broker import Broker
from tidemq.broker.dedup import PER_KEY_BYTES, PER_SEND_BYTES, DuplicateWindow
from tidemq.broker.dedup_sent import Sent
from tidemq.broker.dedup_table import hashes_of
from tidemq.config import NamesrvSettings, compose, parse_config
from tidemq.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    BatchItem,
    Prop,
    decode_message_id,
    encode_batch,
    properties_to_string,
)
from tidemq.namesrv import NameServer
from tidemq.plugins import get_plugin_manager
from tidemq.remoting import FrameDecoder
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

UNIQ = Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"


@contextlib.asynccontextmanager
async def broker_on(
    data: Path, plugins: dict[str, str] | None = None, **settings: Any
) -> AsyncIterator[tuple[Broker, Any]]:
    """A NameServer and a broker over ``data``: (broker, remoting client)."""
    transport = get_plugin_manager().create("transport", "tcp")
    ns = NameServer(NamesrvSettings(listen="127.0.0.1:0", data_dir=""), transport)
    await ns.start()
    raw: dict[str, Any] = {
        "broker": {
            "listen": "127.0.0.1:0",
            "namesrv": [ns.address],
            "data_dir": str(data),
            "register_interval_s": 5.0,
            **settings,
        }
    }
    if plugins:
        raw["plugins"] = plugins
    broker = Broker(compose(parse_config(raw)))
    await broker.start()
    client = transport.client()
    try:
        yield broker, client
    finally:
        await client.close()
        await broker.stop()
        await ns.stop()


def send_request(
    topic: str,
    body: bytes,
    props: dict[str, str],
    *,
    queue_id: int = 0,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    code: int = RequestCode.SEND_MESSAGE,
) -> RemotingCommand:
    fields = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": sys_flag,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_string(props),
        "reconsumeTimes": reconsume_times,
        "unitMode": False,
        "batch": code == RequestCode.SEND_BATCH_MESSAGE,
    }
    return RemotingCommand.request(code, fields, body)


async def send(client: Any, broker: Broker, topic: str, body: bytes, props: dict[str, str], **kw: Any) -> Any:
    return await client.invoke(broker.address, send_request(topic, body, props, **kw), 5.0)


async def send_batch(
    client: Any, broker: Broker, topic: str, items: list[tuple[bytes, dict[str, str]]], queue_id: int = 0
) -> Any:
    body = encode_batch([BatchItem(b, 0, p) for b, p in items])
    request = send_request(topic, body, {}, queue_id=queue_id, code=RequestCode.SEND_BATCH_MESSAGE)
    return await client.invoke(broker.address, request, 5.0)


def answer(resp: Any) -> tuple[int, str, str, str]:
    f = resp.ext_fields
    return resp.code, f.get("msgId", ""), f.get("queueId", ""), f.get("queueOffset", "")


def stored(broker: Broker, topic: str) -> int:
    """Messages stored in ``topic`` (every queue)."""
    store = broker.store
    return sum(store.get_max_offset_in_queue(topic, q) for q in store.topics().get(topic, []))


def key() -> str:
    return uuid.uuid4().hex.upper()


async def runtime(client: Any, broker: Broker) -> dict[str, str]:
    resp = await client.invoke(
        broker.address, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5.0
    )
    return dict(orjson.loads(resp.body)["table"])


# ---------------------------------------------------------------------------- the window


def test_a_resend_is_answered_as_the_first_send_and_stored_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            k = key()
            first = await send(client, broker, "Orders", b"pay 10", {UNIQ: k}, queue_id=1)
            # The client's retry picks another queue, as RocketMQ clients do: the answer is the first's.
            again = await send(client, broker, "Orders", b"pay 10", {UNIQ: k}, queue_id=3)
            assert first.code == ResponseCode.SUCCESS, first.remark
            assert answer(again) == answer(first)
            assert answer(first)[2:] == ("1", "0")
            assert stored(broker, "Orders") == 1
            other = await send(client, broker, "Orders", b"pay 10", {UNIQ: key()}, queue_id=1)
            assert answer(other)[3] == "1" and stored(broker, "Orders") == 2  # a new key is a new message
            # The same key on another topic is another message.
            elsewhere = await send(client, broker, "Refunds", b"pay 10", {UNIQ: k})
            assert elsewhere.code == ResponseCode.SUCCESS and stored(broker, "Refunds") == 1
            info = await runtime(client, broker)
            assert info["dedupDropped"] == "1" and info["dedupDroppedByTopic"] == "Orders:1"
            assert info["dedupEntries"] == "3"
            # The same figures as Prometheus families (the exporter reads the broker's view).
            from tidemq_metrics_prometheus.dedup_metrics import dedup_families

            families = {f.name: f for f in dedup_families(broker.figures)}
            (dropped,) = families["tidemq_dedup_dropped"].samples
            assert (dropped.name, dropped.labels, dropped.value) == (
                "tidemq_dedup_dropped_total",
                {"topic": "Orders"},
                1,
            )
            assert families["tidemq_dedup_entries"].samples[0].value == 3

    asyncio.run(main())


def test_a_batch_resend_gets_the_same_offsets_and_a_partial_one_stores_only_the_new(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            keys = [key() for _ in range(4)]
            items = [(f"m{i}".encode(), {UNIQ: keys[i]}) for i in range(3)]
            first = await send_batch(client, broker, "Batches", items, queue_id=2)
            again = await send_batch(client, broker, "Batches", items, queue_id=0)
            assert first.code == ResponseCode.SUCCESS, first.remark
            assert answer(again) == answer(first)
            assert len(answer(first)[1].split(",")) == 3
            assert stored(broker, "Batches") == 3
            # A batch that repeats one stored message and brings a new one: only the new is stored.
            mixed = await send_batch(
                client, broker, "Batches", [items[1], (b"m3", {UNIQ: keys[3]})], queue_id=2
            )
            assert mixed.code == ResponseCode.SUCCESS, mixed.remark
            assert stored(broker, "Batches") == 4
            assert mixed.ext_fields["queueOffset"] == "3"
            # A single resend of one message of the batch is answered with that message's own id.
            single = await send(client, broker, "Batches", b"m1", {UNIQ: keys[1]})
            assert answer(single)[1:] == (answer(first)[1].split(",")[1], "2", "1")
            assert stored(broker, "Batches") == 4

    asyncio.run(main())


def test_a_resend_in_the_same_read_waits_for_its_first_copy(tmp_path: Path) -> None:
    """Both requests reach the broker in one read: the second finds the first still being stored
    (sync flush: its put is not done when the read is prepared) and is answered once it is."""

    def pipelined(address: str, requests: list[RemotingCommand]) -> list[RemotingCommand]:
        import socket

        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"".join(encode_bytes(r) for r in requests))
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < len(requests):
                data = sock.recv(65536)
                assert data, "the broker closed the connection"
                got += decoder.feed(data)
        by_opaque = {r.opaque: r for r in got}
        return [by_opaque[r.opaque] for r in requests]

    async def main() -> None:
        async with broker_on(tmp_path / "b", plugins={"flush": "sync"}) as (broker, _):
            k = key()
            one = send_request("Pipelined", b"x", {UNIQ: k}, queue_id=0)
            two = send_request("Pipelined", b"x", {UNIQ: k}, queue_id=1)
            three = send_request("Pipelined", b"x", {UNIQ: k}, queue_id=2)
            a, b, c = await asyncio.to_thread(pipelined, broker.address, [one, two, three])
            assert a.code == ResponseCode.SUCCESS, a.remark
            assert answer(a) == answer(b) == answer(c)
            assert stored(broker, "Pipelined") == 1
            assert broker.dedup.dropped == {"Pipelined": 2}

    asyncio.run(main())


def test_bad_keys_are_stored_normally_or_refused_in_one_line(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            for topic, props in (
                ("NoKey", {"TAGS": "t"}),
                ("EmptyKey", {UNIQ: ""}),
                ("LongKey", {UNIQ: "A" * 10240}),
            ):
                for _ in range(2):
                    resp = await send(client, broker, topic, b"same body", props)
                    assert resp.code == ResponseCode.SUCCESS, (topic, resp.remark)
                assert stored(broker, topic) == 2, topic  # not windowed: both stored
            # Any text is a key (RocketMQ's are hex, nothing requires it).
            odd = {UNIQ: "not hex: héllo ✓ \t"}
            a = await send(client, broker, "OddKey", b"b", odd)
            b = await send(client, broker, "OddKey", b"b", odd)
            assert answer(a) == answer(b) and stored(broker, "OddKey") == 1
            # The same key with another body is another message (a reused Message object).
            c = await send(client, broker, "OddKey", b"other body", odd)
            assert c.code == ResponseCode.SUCCESS and stored(broker, "OddKey") == 2
            # A batch giving two messages one key is refused, saying why.
            k = key()
            refused = await send_batch(client, broker, "BadBatch", [(b"1", {UNIQ: k}), (b"2", {UNIQ: k})])
            assert refused.code == ResponseCode.MESSAGE_ILLEGAL
            assert "repeats UNIQ_KEY" in refused.remark and stored(broker, "BadBatch") == 0
            # A batch with a keyless message is stored as it is, every time.
            loose = [(b"1", {UNIQ: key()}), (b"2", {})]
            for _ in range(2):
                resp = await send_batch(client, broker, "LooseBatch", loose)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert stored(broker, "LooseBatch") == 4
            assert broker.dedup.entries <= broker.settings.dedup_max_entries

    asyncio.run(main())


def test_the_window_keeps_its_bounds_and_evicts_the_oldest_first(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b", dedup_max_entries=8) as (broker, client):
            keys = [key() for _ in range(20)]
            for i, k in enumerate(keys):
                resp = await send(client, broker, "Bounded", f"m{i}".encode(), {UNIQ: k})
                assert resp.code == ResponseCode.SUCCESS
                assert broker.dedup.entries <= 8
            assert broker.dedup.entries == 8 and broker.dedup.evicted == 12
            await send(client, broker, "Bounded", b"m0", {UNIQ: keys[0]})  # evicted: stored again
            await send(client, broker, "Bounded", b"m19", {UNIQ: keys[19]})  # kept: answered
            assert stored(broker, "Bounded") == 21
        async with broker_on(tmp_path / "c", dedup_max_bytes=4096) as (broker, client):
            for i in range(50):
                await send(client, broker, "BoundedBytes", b"x", {UNIQ: f"{i:0128d}"})
                assert broker.dedup.nbytes <= 4096
            assert 0 < broker.dedup.entries < 50

    asyncio.run(main())


def test_a_key_leaves_the_window_after_its_seconds_and_the_window_can_be_off(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b", dedup_window_s=0.3) as (broker, client):
            k = key()
            await send(client, broker, "Short", b"x", {UNIQ: k})
            await send(client, broker, "Short", b"x", {UNIQ: k})
            assert stored(broker, "Short") == 1
            await asyncio.sleep(0.5)
            await send(client, broker, "Short", b"x", {UNIQ: k})
            assert stored(broker, "Short") == 2
        async with broker_on(tmp_path / "c", dedup_window_s=0) as (broker, client):
            k = key()
            for _ in range(2):
                await send(client, broker, "Off", b"x", {UNIQ: k})
            assert stored(broker, "Off") == 2 and broker.dedup.entries == 0

    asyncio.run(main())


def test_content_keys_catch_a_client_that_renews_uniq_key_on_each_attempt(tmp_path: Path) -> None:
    """rocketmq-client-cpp (and so ``rocketmq==0.4.4``) sends each attempt with a new UNIQ_KEY."""

    async def main() -> None:
        async with broker_on(tmp_path / "b", dedup_key="content") as (broker, client):
            props = {"KEYS": "order-7", "WAIT": "true"}
            first = await send(client, broker, "Cpp", b"pay 7", {**props, UNIQ: key()}, queue_id=0)
            again = await send(client, broker, "Cpp", b"pay 7", {**props, UNIQ: key()}, queue_id=3)
            assert answer(again) == answer(first) and stored(broker, "Cpp") == 1
            other = await send(client, broker, "Cpp", b"pay 8", {**props, UNIQ: key()})
            assert other.code == ResponseCode.SUCCESS and stored(broker, "Cpp") == 2
        async with broker_on(tmp_path / "b", dedup_key="content") as (broker, client):
            # Rebuilt from the commit log with the same keys: still caught after a restart.
            again = await send(client, broker, "Cpp", b"pay 7", {**props, UNIQ: key()}, queue_id=1)
            assert answer(again) == answer(first) and stored(broker, "Cpp") == 2

    asyncio.run(main())


# ---------------------------------------------------------------------------- edges


def test_retry_topics_are_not_windowed(tmp_path: Path) -> None:
    """A consumer's retries are redeliveries on purpose: a 4.x client's fallback send-back
    re-sends the same UNIQ_KEY on each attempt."""

    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            k = key()
            for attempt in range(2):
                resp = await send(
                    client, broker, "%RETRY%Workers", b"job", {UNIQ: k}, reconsume_times=attempt
                )
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert stored(broker, "%RETRY%Workers") == 2

    asyncio.run(main())


def test_delayed_timer_and_transactional_sends_are_windowed_on_their_topic(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            # A delay level: parked in SCHEDULE_TOPIC_XXXX, answered with the parked record.
            k = key()
            delayed = {UNIQ: k, Prop.DELAY_TIME_LEVEL: "3"}
            a = await send(client, broker, "Delayed", b"later", delayed, queue_id=1)
            b = await send(client, broker, "Delayed", b"later", delayed, queue_id=2)
            assert a.code == ResponseCode.SUCCESS and answer(a) == answer(b)
            assert stored(broker, SCHEDULE_TOPIC) == 1
            delayed_first = a
            # A timer message: parked in rmq_sys_wheel_timer; the resend gets the same recall handle.
            t = {UNIQ: key(), "TIMER_DELAY_SEC": "30"}
            a = await send(client, broker, "Timed", b"at 30s", t)
            b = await send(client, broker, "Timed", b"at 30s", t)
            assert a.code == ResponseCode.SUCCESS and answer(a) == answer(b)
            assert (
                a.ext_fields["recallHandle"]
                and b.ext_fields.get("recallHandle") == a.ext_fields["recallHandle"]
            )
            assert stored(broker, TIMER_TOPIC) == 1
            timed_first = a
            # A transactional half: the resend is answered with the half (its id names the half's offset).
            half = {UNIQ: key(), Prop.TRANSACTION_PREPARED: "true", Prop.PRODUCER_GROUP: "PG"}
            a = await send(client, broker, "Tx", b"pay", half, sys_flag=TRANSACTION_PREPARED_TYPE)
            b = await send(client, broker, "Tx", b"pay", half, sys_flag=TRANSACTION_PREPARED_TYPE)
            assert a.code == ResponseCode.SUCCESS and answer(a) == answer(b)
            assert stored(broker, HALF_TOPIC) == 1
            commit = {
                "producerGroup": "PG",
                "tranStateTableOffset": a.ext_fields["queueOffset"],
                "commitLogOffset": str(decode_message_id(a.ext_fields["msgId"])[1]),
                "commitOrRollback": str(TRANSACTION_COMMIT_TYPE),
                "fromTransactionCheck": "false",
                "msgId": half[UNIQ],
                "transactionId": half[UNIQ],
            }
            done = await client.invoke(
                broker.address, RemotingCommand.request(RequestCode.END_TRANSACTION, commit), 5.0
            )
            assert done.code == ResponseCode.SUCCESS, done.remark
            assert stored(broker, "Tx") == 1  # the commit is not a producer's send: not checked
            c = await send(client, broker, "Tx", b"pay", half, sys_flag=TRANSACTION_PREPARED_TYPE)
            assert answer(c) == answer(a) and stored(broker, HALF_TOPIC) == 1
        # After a restart: the parked records give the keys back under their producer's topic.
        async with broker_on(tmp_path / "b") as (broker, client):
            again = await send(client, broker, "Delayed", b"later", delayed, queue_id=3)
            assert answer(again) == answer(delayed_first) and stored(broker, SCHEDULE_TOPIC) == 1
            again = await send(client, broker, "Timed", b"at 30s", t)
            assert answer(again) == answer(timed_first) and stored(broker, TIMER_TOPIC) == 1
            assert again.ext_fields.get("recallHandle") == timed_first.ext_fields["recallHandle"]
            c = await send(client, broker, "Tx", b"pay", half, sys_flag=TRANSACTION_PREPARED_TYPE)
            assert answer(c) == answer(a) and stored(broker, HALF_TOPIC) == 1
            assert stored(broker, "Tx") == 1

    asyncio.run(main())


# ---------------------------------------------------------------------------- durability


def test_a_clean_restart_keeps_the_window(tmp_path: Path) -> None:
    async def main() -> None:
        data = tmp_path / "b"
        k = key()
        bkeys = [key() for _ in range(3)]
        items = [(f"b{i}".encode(), {UNIQ: bkeys[i]}) for i in range(3)]
        async with broker_on(data) as (broker, client):
            first = await send(client, broker, "Durable", b"x", {UNIQ: k}, queue_id=2)
            batch = await send_batch(client, broker, "Durable", items, queue_id=1)
            assert first.code == batch.code == ResponseCode.SUCCESS
        async with broker_on(data) as (broker, client):
            assert broker.dedup.entries == 4 and broker.dedup.rebuilt_records == 4
            again = await send(client, broker, "Durable", b"x", {UNIQ: k}, queue_id=0)
            assert answer(again) == answer(first)  # the same msgId: the record's own store host
            again_batch = await send_batch(client, broker, "Durable", items, queue_id=3)
            assert answer(again_batch) == answer(batch)
            assert stored(broker, "Durable") == 4
            info = await runtime(client, broker)
            assert info["dedupRebuildRecords"] == "4" and float(info["dedupRebuildSeconds"]) >= 0
        # A restart past the window forgets: only the last window_s of the log is read.
        async with broker_on(data, dedup_window_s=0.001) as (broker, client):
            assert broker.dedup.entries == 0

    asyncio.run(main())


def test_a_rebuild_reads_no_more_records_than_the_window_keeps(tmp_path: Path) -> None:
    async def main() -> None:
        data = tmp_path / "b"
        keys = [key() for _ in range(6)]
        async with broker_on(data) as (broker, client):
            for i, k in enumerate(keys):
                await send(client, broker, "Busy", f"m{i}".encode(), {UNIQ: k})
                await asyncio.sleep(0.01)  # the tail is cut by store time, to the millisecond
        async with broker_on(data, dedup_max_entries=2) as (broker, client):
            assert broker.dedup.rebuilt_records <= 3 and broker.dedup.entries == 2
            newest = await send(client, broker, "Busy", b"m5", {UNIQ: keys[5]})
            assert newest.code == ResponseCode.SUCCESS and stored(broker, "Busy") == 6
            oldest = await send(client, broker, "Busy", b"m0", {UNIQ: keys[0]})
            assert oldest.code == ResponseCode.SUCCESS and stored(broker, "Busy") == 7

    asyncio.run(main())


# ---------------------------------------------------------------------------- memory


def test_the_byte_estimate_covers_what_the_window_holds() -> None:
    """The bound in bytes is kept on an estimate: it must not be below what the keys cost, nor
    much above (an operator's cap would hold fewer sends than it says: single sends were counted
    384 bytes each against 283 held, a 128 MiB cap full at 87 MB)."""
    for batch in (1, 32):
        window = DuplicateWindow(120, 10**7, 1 << 40)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(0, 20_000, batch):
            keys = [uuid.uuid4().hex.upper() for _ in range(batch)]
            sent = window.record("T", hashes_of(keys), None, 120)
            assert sent is not None
            sent.msg_id = ",".join(f"7F00000100002A9F{i + j:016X}" for j in range(batch))
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert window.nbytes >= used, (batch, window.nbytes, used, PER_KEY_BYTES, PER_SEND_BYTES)
        assert window.nbytes <= 1.25 * used, (batch, window.nbytes, used, PER_KEY_BYTES, PER_SEND_BYTES)


# ---------------------------------------------------------------------------- the key table


def test_the_compiled_key_table_agrees_with_its_python_reference() -> None:
    """Random puts, gets and removals (backward-shift deletes, growth) on both tables."""
    import random
    from array import array

    from tidemq.broker import dedup_table

    if not dedup_table.COMPILED:
        pytest.skip("the compiled key table is not built")
    rng = random.Random(37)
    compiled, reference = dedup_table.HashTable(), dedup_table._PyHashTable()
    values = [object() for _ in range(40)]
    hashes = [rng.randrange(-(2**63), 2**63) for _ in range(5000)] + [0, 1, -1]
    for _ in range(100_000):
        h, v, op = rng.choice(hashes), rng.choice(values), rng.random()
        if op < 0.45:
            assert compiled.put(h, v) is reference.put(h, v)
        elif op < 0.6:
            batch = array("q", rng.sample(hashes, 8))
            assert compiled.put_many(batch, v) == reference.put_many(batch, v)
        elif op < 0.8:
            assert compiled.get(h) is reference.get(h)
            batch = array("q", rng.sample(hashes, 4))
            assert compiled.any_of(batch) == reference.any_of(batch)
        else:
            batch = array("q", [h, rng.choice(hashes)])
            assert compiled.remove_many(batch, v) == reference.remove_many(batch, v)
        assert len(compiled) == len(reference)
    assert all(compiled.get(h) is reference.get(h) for h in hashes)
    # The batch key reader: the same keys, hashes, repeats and refusals.
    from tidemq.broker._dedup_table import batch_keys

    secrets = dedup_table._compiled.secrets_for_tests()

    def twin_hash(key: str) -> int:
        return dedup_table.py_key_hash(key, secrets)

    from tidemq.message import MessageInner

    for _ in range(300):
        msgs = []
        for _ in range(rng.randrange(1, 12)):
            props = {"TAGS": "t"}
            kind = rng.random()
            if kind < 0.9:
                props[UNIQ] = rng.choice(["", "A" * 129, "A" * 128, *(f"K{i}" for i in range(20))])
            msgs.append(MessageInner("T", b"", properties=props))
        twin = dedup_table._py_batch_keys(msgs, UNIQ, 128, twin_hash)
        assert batch_keys(msgs, UNIQ, 128) == twin


def test_the_window_on_the_python_key_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the compiled table (no compiler at install) the window behaves the same."""
    from tidemq.broker import dedup, dedup_table

    class PySent(dedup_table._PySentFields):  # Sent's methods on the reference's fields
        __slots__ = ()

    for name in ("__init__", "answer", "position", "from_put", "put_future"):
        setattr(PySent, name, Sent.__dict__[name])
    monkeypatch.setattr(dedup, "HashTable", dedup_table._PyHashTable)
    monkeypatch.setattr(dedup, "Sent", PySent)
    window = DuplicateWindow(120, 5, 1 << 30)
    keys = [key() for _ in range(8)]
    first = window.record("T", hashes_of(keys[:3]), None, 120)
    assert first is not None and window.check("T", keys[1]) is first and first.position(keys[1]) == 1
    assert window.check_many("T", hashes_of([key()])) is None
    hits = window.check_many("T", hashes_of([keys[2], key()]))
    assert hits is not None and hits[0] is first and hits[1] is None
    for k in keys[3:]:
        window.record("T", hashes_of([k]), None, 120)
    assert window.entries == 5 and window.check("T", keys[0]) is None  # the oldest send evicted whole
    assert window.check("T", keys[7]) is not None
    last = window.check("T", keys[7])
    assert last is not None
    window.forget(last)
    assert window.check("T", keys[7]) is None and window.entries == 4


def test_operators_set_a_topic_s_window_with_update_topic_attributes(tmp_path: Path) -> None:
    """``updateTopic -a +dedup.window.seconds=0`` turns the window off for one topic, and
    ``+dedup.key=content`` keys it on content; a bad value is refused in one line."""

    async def update(client: Any, broker: Broker, topic: str, attributes: str) -> Any:
        fields = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": 4,
            "writeQueueNums": 4,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
            "attributes": attributes,
        }
        request = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        return await client.invoke(broker.address, request, 5.0)

    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            assert (await update(client, broker, "Loose", "+dedup.window.seconds=0")).code == 0
            assert (await update(client, broker, "ByBody", "+dedup.key=content")).code == 0
            k = key()
            for _ in range(2):
                await send(client, broker, "Loose", b"x", {UNIQ: k})
            assert stored(broker, "Loose") == 2  # the window is off for this topic only
            for _ in range(2):
                await send(client, broker, "ByBody", b"same", {UNIQ: key()})
            assert stored(broker, "ByBody") == 1  # keyed on content
            for _ in range(2):
                await send(client, broker, "Strict", b"x", {UNIQ: k})
            assert stored(broker, "Strict") == 1  # the broker's default elsewhere
            for bad in ("+dedup.window.seconds=-1", "+dedup.window.seconds=x", "+dedup.key=body"):
                refused = await update(client, broker, "Loose", bad)
                assert refused.code != 0 and "value is not" in (refused.remark or ""), bad

    asyncio.run(main())


def test_a_stopped_broker_s_window_is_freed_with_it(tmp_path: Path) -> None:
    """The window's records are out of the cycle collector and point back at the window: a window
    holding keys outlived its broker (a process that runs brokers one after another, as tests and
    embedders do, kept every full window).  The stop empties it, so it goes with the broker."""
    import gc
    import weakref

    async def main() -> weakref.ref[Any]:
        async with broker_on(tmp_path / "b") as (broker, client):
            for _ in range(3):
                assert (
                    await send(client, broker, "Orders", b"x", {UNIQ: key()})
                ).code == ResponseCode.SUCCESS
            window = weakref.ref(broker.dedup)
            assert broker.dedup.entries == 3
        return window

    window = asyncio.run(main())
    gc.collect()
    assert window() is None


def test_an_idle_window_releases_its_records_once_they_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that goes quiet drops its window's expired sends without a new send arriving
    (its housekeeping trims the window): it held its last window's records until the next send."""
    import tidemq.broker.broker as broker_module

    monkeypatch.setattr(broker_module, "HOUSEKEEPING_PERIOD_S", 0.05)

    async def main() -> None:
        async with broker_on(tmp_path / "b", dedup_window_s=0.3) as (broker, client):
            for _ in range(3):
                await send(client, broker, "Quiet", b"x", {UNIQ: key()})
            assert broker.dedup.entries == 3
            await asyncio.sleep(0.8)  # the window passes; nothing is sent
            assert broker.dedup.entries == 0 and broker.dedup.nbytes == 0
            assert len(broker.dedup._order) == 0 and not broker.dedup._topics
            assert (await runtime(client, broker))["dedupEntries"] == "0"

    asyncio.run(main())
