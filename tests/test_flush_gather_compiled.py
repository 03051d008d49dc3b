"""``[flush.sync] worker_gather_us``: the compiled flush worker gathers cohorts (sync128, session 11).

Closed-loop senders settle into two cohorts that alternate rounds: while cohort A's ``fdatasync``
runs, cohort B's sends are posted, and B's round starts the moment A's ends, before A's senders
(just answered) come back.  When a round of 64 messages or more ends with 64 or more posted and
waiting (that other cohort), the worker's next round waits (at most ``worker_gather_us``) until the
posted bytes reach what the ended round flushed plus what is waiting: A's next sends join B's round
and one ``fdatasync`` covers both (what ``loop_gather_us`` does on the Python flush thread).

What a producer relies on must not change: a put is acknowledged only once the commit log's
flushed offset covers it; a wait that times out still flushes.  Real mmap stores on real files;
the worker's ``hold`` keeps cohort A's round from starting its ``fdatasync`` while B is posted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from round_support import acknowledged, wait_taken

from tidemq.testing.store_contract import build_store, message
from tidemq_flush import native_rounds

pytestmark = [pytest.mark.timeout(60)]

compiled = pytest.mark.skipif(not native_rounds.available(), reason="the compiled flush worker is not built")


def _store(data: Path, **flush_options: Any) -> Any:
    store = build_store("mmap", data, flush="sync", flush_options=flush_options)
    assert store.load()
    store.start()
    return store


def _puts(store: Any, n: int, tag: str, size: int = 8) -> list[Any]:
    """``n`` batched puts of ``size`` messages each, made on one loop turn (one round's batch)."""
    return [
        store.put_messages([message(topic="Gather", body=f"{tag}{i:04d}.{j}".encode()) for j in range(size)])
        for i in range(n)
    ]


async def _two_cohorts(store: Any, size: int) -> tuple[list[Any], list[Any]]:
    """Cohort A's round held in the worker while cohort B is posted, then A's round let go and A
    acknowledged: returns B's futures (posted, waiting) and A's results."""
    native = store.flush_policy._native
    assert native is not None
    worker = native.worker
    worker.hold(0, True)
    try:
        a = _puts(store, 8, "a", size)
        for _ in range(3):  # the kick (held one turn when it carries 8 messages or more)
            await asyncio.sleep(0)
        wait_taken(worker)
        b = _puts(store, 8, "b", size)
        await asyncio.sleep(0)  # B's kick: posted behind A's round
        assert native.posted and len(native.posted) == 2
    finally:
        worker.hold(0, False)
    return b, await acknowledged(store, *a)


@compiled
def test_the_waiting_cohort_round_waits_for_the_answered_one_and_both_share_it(tmp_path: Path) -> None:
    """A's round ends with B (64 messages) waiting: B's round waits for A's next sends, and one
    ``fdatasync`` covers B and A's next cohort (two rounds for three cohorts)."""
    store = _store(tmp_path / "s", worker_gather_us=5_000_000)

    async def main() -> tuple[int, list[Any]]:
        worker = store.flush_policy._native.worker
        rounds = worker.rounds
        b, _a = await _two_cohorts(store, 8)
        await asyncio.sleep(0.05)
        assert worker.rounds == rounds + 1, "B's round started without gathering"
        assert not any(f.done() for f in b)
        a2 = _puts(store, 8, "c")
        results = await acknowledged(store, *(b + a2))
        return worker.rounds - rounds, results

    try:
        rounds, results = asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (1, 0)
        stats = store.flush_policy.round_stats()  # what runtime info and /metrics show
        assert (stats.worker_gathered, stats.worker_gather_timeouts) == (1, 0)
    finally:
        store.shutdown()
    assert rounds == 2, rounds
    assert [r.queue_offset for r in results] == list(range(64, 192, 8))


@compiled
def test_a_gathering_wait_that_times_out_still_flushes_and_acknowledges(tmp_path: Path) -> None:
    """A's senders do not come back: B's round starts at the bound with what is there."""
    store = _store(tmp_path / "s", worker_gather_us=20_000)

    async def main() -> list[Any]:
        b, _a = await _two_cohorts(store, 8)
        return await acknowledged(store, *b)

    try:
        results = asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (1, 1)
        stats = store.flush_policy.round_stats()
        assert (stats.worker_gathered, stats.worker_gather_timeouts) == (1, 1)
    finally:
        store.shutdown()
    assert [r.queue_offset for r in results] == list(range(64, 128, 8))


@compiled
@pytest.mark.parametrize("gather_us", [None, 0])
def test_single_sends_and_the_option_off_never_wait(tmp_path: Path, gather_us: int | None) -> None:
    """Cohorts of 8 single sends (8 messages a round, below 64) with the default bound, and
    64-message cohorts with ``worker_gather_us = 0``: no wait."""
    options = {} if gather_us is None else {"worker_gather_us": gather_us}
    store = _store(tmp_path / "s", **options)

    async def main() -> None:
        b, _a = await _two_cohorts(store, 1 if gather_us is None else 8)
        await acknowledged(store, *b)

    try:
        asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (0, 0)
    finally:
        store.shutdown()


@compiled
def test_a_backlog_of_single_sends_does_not_make_the_next_round_wait(tmp_path: Path) -> None:
    """A stream of single sends piled up behind a slow round: its round of 70 messages ends with
    nothing waiting, so the next put's round starts at once."""
    store = _store(tmp_path / "s", worker_gather_us=5_000_000)

    async def main() -> None:
        native = store.flush_policy._native
        worker = native.worker
        worker.hold(0, True)
        try:
            first = _puts(store, 1, "first", size=1)
            await asyncio.sleep(0)
            wait_taken(worker)
            backlog = []
            for i in range(70):
                backlog += _puts(store, 1, f"s{i}", size=1)
                await asyncio.sleep(0)  # its own kick: one post each
        finally:
            worker.hold(0, False)
        await acknowledged(store, *(first + backlog))
        started = time.monotonic()
        await acknowledged(store, *_puts(store, 1, "lone", size=1))
        assert time.monotonic() - started < 4.0

    try:
        asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (0, 0)
    finally:
        store.shutdown()


@pytest.mark.parametrize("compiled_rounds", [True, False])
def test_gathered_puts_are_acknowledged_alike_by_the_worker_and_the_thread(
    tmp_path: Path, compiled_rounds: bool
) -> None:
    """Two cohorts of batched puts with the defaults: the same offsets, each acknowledged once
    flushed, by the compiled worker and by the Python flush thread (also under
    ``TIDEMQ_NO_EXTENSIONS=1``)."""
    store = _store(tmp_path / "s", compiled_rounds=compiled_rounds)

    async def cohort(tag: str) -> list[int]:
        offsets: list[int] = []
        for turn in range(5):
            results = await acknowledged(store, *_puts(store, 8, f"{tag}{turn}"))
            offsets += [r.queue_offset for r in results]
        return offsets

    async def main() -> list[int]:
        a, b = await asyncio.gather(cohort("a"), cohort("b"))
        return sorted(a + b)

    try:
        offsets = asyncio.run(main())
    finally:
        store.shutdown()
    assert offsets == list(range(0, 640, 8))
