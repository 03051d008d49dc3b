"""``[flush.sync] worker_gather_us``: the compiled flush worker gathers (sync128, session 11).

After a round of 64 messages or more, the worker's next round waits (at most ``worker_gather_us``) until
the posted bytes reach what that round flushed plus what was pending when it ended: the senders it
answered come back and share one ``fdatasync`` with those already waiting (what ``loop_gather_us``
does on the Python flush thread, which it keeps for its rounds).

What a producer relies on must not change: a put is acknowledged only once the commit log's
flushed offset covers it; a wait that times out still flushes.  Real mmap stores on real files.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tidemq.futures import resolved
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


async def _acknowledged(store: Any, futures: list[Any]) -> list[Any]:
    """Each put's result, checking at its acknowledgement that the flushed offset covers it."""
    results = []
    for fut in futures:
        r = await resolved(fut)
        assert r.ok and store.commitlog.flushed_where >= r.wrote_offset + r.wrote_bytes
        results.append(r)
    return results


@compiled
def test_after_a_round_of_many_puts_the_next_round_waits_for_the_answered_senders(tmp_path: Path) -> None:
    """A round of 8 puts of 8 messages, then one put: its round does not start while the bytes
    stay below the mark (the worker gathers); 8 more puts reach it and one ``fdatasync`` covers
    all nine."""
    store = _store(tmp_path / "s", worker_gather_us=5_000_000)

    async def main() -> tuple[int, list[Any]]:
        native = store.flush_policy._native
        assert native is not None
        worker = native.worker
        await _acknowledged(store, _puts(store, 8, "first"))
        rounds = worker.rounds
        lone = _puts(store, 1, "lone")
        await asyncio.sleep(0.05)  # its kick posted it (a sparse round: at once)
        assert native.posted
        assert worker.rounds == rounds, "the lone put's round started without gathering"
        assert not lone[0].done()
        rest = _puts(store, 8, "rest")
        results = await _acknowledged(store, lone + rest)
        return worker.rounds - rounds, results

    try:
        rounds, results = asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (1, 0)
    finally:
        store.shutdown()
    assert rounds == 1, rounds
    assert [r.queue_offset for r in results] == list(range(64, 136, 8))


@compiled
def test_a_gathering_wait_that_times_out_still_flushes_and_acknowledges(tmp_path: Path) -> None:
    """The senders do not come back: the round starts at the bound with what is there."""
    store = _store(tmp_path / "s", worker_gather_us=20_000)

    async def main() -> list[Any]:
        await _acknowledged(store, _puts(store, 8, "first"))
        started = time.monotonic()
        results = await _acknowledged(store, _puts(store, 1, "lone"))
        assert time.monotonic() - started >= 0.015
        return results

    try:
        (result,) = asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (1, 1)
    finally:
        store.shutdown()
    assert result.queue_offset == 64


@compiled
def test_a_round_of_few_messages_lets_the_next_start_at_once(tmp_path: Path) -> None:
    """Single sends (the defaults): a round of 8 one-message puts is below the mark, so the next
    round starts at its post (a sparse stream's latency is not held)."""
    store = _store(tmp_path / "s", worker_gather_us=5_000_000)

    async def main() -> None:
        await _acknowledged(store, _puts(store, 8, "first", size=1))
        started = time.monotonic()
        await _acknowledged(store, _puts(store, 1, "lone", size=1))
        assert time.monotonic() - started < 4.0

    try:
        asyncio.run(main())
        worker = store.flush_policy._native.worker
        assert (worker.gathered, worker.gather_timeouts) == (0, 0)
    finally:
        store.shutdown()


@compiled
def test_without_worker_gather_the_next_round_starts_at_once(tmp_path: Path) -> None:
    """``worker_gather_us = 0``: the lone put's round starts at its post."""
    store = _store(tmp_path / "s", worker_gather_us=0)

    async def main() -> None:
        await _acknowledged(store, _puts(store, 8, "first"))
        await _acknowledged(store, _puts(store, 1, "lone"))

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
    """Cohorts of puts with gathering on: the same offsets, each acknowledged once flushed,
    by the compiled worker and by the Python flush thread (also under ``TIDEMQ_NO_EXTENSIONS=1``)."""
    store = _store(tmp_path / "s", compiled_rounds=compiled_rounds)

    async def cohort(tag: str) -> list[int]:
        offsets: list[int] = []
        for turn in range(5):
            results = await _acknowledged(store, _puts(store, 8, f"{tag}{turn}"))
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
