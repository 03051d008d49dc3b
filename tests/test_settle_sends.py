"""The compiled settlement of a read's sends (``_send_lane.settle_sends``, issue 38) fills every
send as the Python loop does (``put.settled_many_py``, the reference): the same status, remark,
epoch, message id and queue offset on each send, and the same answer kept by (or keys forgotten
from) the duplicate window's ``Sent``, for puts of one or several sends, batches, ids the store
gave too few of, transaction halves, failed statuses, a put the store refused and sends already
done.  The broker is a real one (its stats and replication answer the put's futures)."""

from __future__ import annotations

import asyncio
from array import array
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_broker_processors import running

from tidemq.broker.dedup import DuplicateWindow
from tidemq.broker.dedup_sent import Sent
from tidemq.broker.services import put
from tidemq.broker.services.put import PutGroup, Send
from tidemq.message import MessageInner
from tidemq.store import PutResult, PutStatus

lane = pytest.importorskip("tidemq._native._send_lane")
if put._settle_sends is None:  # TIDEMQ_NO_EXTENSIONS=1: the Python loop is all there is
    pytest.skip("the compiled settlement is switched off", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

_FIELDS = ("status", "remark", "epoch", "msg_id", "queue_offset")
_SENT_FIELDS = ("msg_id", "queue_id", "queue_offset", "step", "end", "live", "handle")

# A put: its sends' message counts, the store's status, how many ids it gave, the first message's
# sys flag (transaction kind), whether the store raised; and per send: done already, dedup kept.
_put = st.tuples(
    st.lists(st.integers(1, 3), min_size=1, max_size=4),
    st.sampled_from(
        [
            PutStatus.PUT_OK,
            PutStatus.PUT_OK,
            PutStatus.MESSAGE_ILLEGAL,
            PutStatus.OS_PAGECACHE_BUSY,
            PutStatus.FLUSH_DISK_TIMEOUT,
        ]
    ),
    st.integers(-2, 0),
    st.sampled_from([0, 4, 8, 12]),
    st.just(False),  # unused (a refused put: the test's raised set)
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=4, max_size=4),
    st.integers(0, 3),
)


def _message(topic: str, sys_flag: int) -> MessageInner:
    return MessageInner(topic, b"body", 0, 0, {}, sys_flag, 1, ("127.0.0.1", 1), ("127.0.0.1", 2), 0)


def _build(puts: list[Any], raised: set[int], window: DuplicateWindow) -> tuple[list[Send], list[bool]]:
    sends: list[Send] = []
    done: list[bool] = []
    wrote = 1000
    for p, (counts, status, id_short, sys_flag, _r, flags, error_kind) in enumerate(puts):
        group = PutGroup()
        mine = []
        for j, count in enumerate(counts):
            msgs = [_message("T", sys_flag) for _ in range(count)]
            send = Send("PG", msgs, count > 1, None, p % 4, 4 * count)
            if flags[j][1]:
                send.dedup = Sent(window, "T", array("Q", [p * 10 + j]), 0.0, send)
            group.add(send)
            mine.append(send)
        n = len(group.msgs)
        group.sends, group.nsends = [], len(mine)
        if p in raised:
            group.error = "disk on fire"
        else:
            ids = tuple(f"ID{p:02d}{i:04d}" for i in range(max(0, n + id_short)))
            future: Future[PutResult] = Future()
            future.set_result(
                PutResult(status, wrote, 40 * n, 7 * p, ids, 5, n, "" if error_kind else "note")
            )
            group.future = future
        wrote += 40 * n
        for j, send in enumerate(mine):
            sends.append(send)
            done.append(flags[j][0])
    # Interleave the puts' sends as a read's queues do.
    order = sorted(range(len(sends)), key=lambda i: (i % 3, i))
    return [sends[i] for i in order], [done[i] for i in order]


def _state(sends: list[Send], done: list[bool]) -> list[Any]:
    out: list[Any] = []
    for send, ready in zip(sends, done, strict=True):
        fields = tuple(getattr(send, name, "<unset>") for name in _FIELDS)
        sent = send.dedup
        kept = None if sent is None else tuple(getattr(sent, name, "<unset>") for name in _SENT_FIELDS)
        out.append((ready, fields, kept, None if sent is None else sent.send is None))
    return out


def test_compiled_settlement_fills_sends_as_the_python_loop(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, _client):
            ctx = broker

            @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
            @given(st.lists(_put, min_size=1, max_size=6), st.sets(st.integers(0, 5), max_size=2))
            def check(puts: list[Any], raised: set[int]) -> None:
                a_window = DuplicateWindow(60, 1000, 1 << 20)
                b_window = DuplicateWindow(60, 1000, 1 << 20)
                a_sends, a_done = _build(puts, raised, a_window)
                b_sends, b_done = _build(puts, raised, b_window)
                put.settled_many(ctx, a_sends, a_done)  # compiled
                put.settled_many_py(ctx, b_sends, b_done)  # the reference
                assert _state(a_sends, a_done) == _state(b_sends, b_done)
                assert (a_window.entries, a_window.nbytes) == (b_window.entries, b_window.nbytes)

            check()

    asyncio.run(main())


def test_a_pending_put_leaves_its_sends_undone(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, _client):
            ctx = broker
            group = PutGroup()
            send = Send("PG", [_message("T", 0)], False, None, 0, 4)
            group.add(send)
            group.sends, group.nsends = [], 1
            future: Future[PutResult] = Future()
            group.future = future
            done = [False]
            put.settled_many(ctx, [send], done)
            assert done == [False] and not hasattr(send, "status")
            future.set_result(PutResult(PutStatus.PUT_OK, 0, 40, 3, ("ID",), 5, 1))
            put.settled_many(ctx, [send], done)
            assert done == [True] and (send.msg_id, send.queue_offset) == ("ID", 3)

    asyncio.run(main())
