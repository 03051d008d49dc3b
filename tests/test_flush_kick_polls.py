"""``[flush.sync] kick_polls`` / ``kick_min_messages``: a loop's round that would start the idle
compiled worker waits one more turn of the loop while it carries many messages (a batched put),
so puts made meanwhile share its ``fdatasync``; a sparse round (a lone send) starts at its kick.

What a producer relies on must not change: every put acknowledged only once the commit log's
flushed offset covers it, by the compiled worker and by the Python flush thread alike.  Real mmap
stores on real files.
"""

from __future__ import annotations

import asyncio
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


def _batch(n: int, tag: str) -> list[Any]:
    return [message(topic="Polls", body=f"{tag}{i}".encode()) for i in range(n)]


@compiled
@pytest.mark.parametrize("min_messages", [None, 0])
def test_a_lone_put_is_posted_to_the_worker_at_its_kick(tmp_path: Path, min_messages: int | None) -> None:
    """Sparse: the default options (``kick_polls = 1``) do not hold a one-message round; with
    ``kick_min_messages = 0`` (the ungated hold of kick_polls alone) the same put waits a turn."""
    options: dict[str, Any] = {"compiled_rounds": True}
    if min_messages is not None:
        options["kick_min_messages"] = min_messages
    store = _store(tmp_path / "s", **options)

    async def main() -> tuple[bool, Any]:
        native = store.flush_policy._native
        assert native is not None
        fut = store.put_message(message(topic="Polls", body=b"alone"))
        await asyncio.sleep(0)  # the put's kick ran on this turn
        posted_at_kick = bool(native.posted)
        (r,) = await acknowledged(store, fut)
        return posted_at_kick, r

    try:
        posted_at_kick, result = asyncio.run(main())
        policy = store.flush_policy
        assert result.queue_offset == 0
        if min_messages is None:
            assert store.flush_policy.options.kick_polls == 1
            assert posted_at_kick, "a lone put's round waited a loop turn"
            assert (policy.kicks_sparse, policy.kicks_held) == (1, 0)
        else:
            assert not posted_at_kick
            assert (policy.kicks_sparse, policy.kicks_held) == (0, 1)
    finally:
        store.shutdown()


@compiled
@pytest.mark.parametrize("polls", [None, 0])
def test_a_put_arriving_while_a_batched_rounds_kick_waits_shares_its_round(
    tmp_path: Path, polls: int | None
) -> None:
    """Dense: a batched put of 8 messages (the default options) waits one loop turn; a put made on
    that turn joins its round: one ``fdatasync`` for both.  With ``kick_polls = 0`` the batch is
    posted at its kick (the worker holds it in its slot, as if its ``fdatasync`` ran) and the
    second put needs a round of its own."""
    options: dict[str, Any] = {"compiled_rounds": True}
    if polls is not None:
        options["kick_polls"] = polls
    store = _store(tmp_path / "s", **options)

    async def main() -> tuple[int, list[Any]]:
        native = store.flush_policy._native
        assert native is not None
        worker = native.worker
        before = native.rounds
        worker.hold(0, True)
        try:
            first = store.put_messages(_batch(8, "batched"))
            await asyncio.sleep(0)  # the batch's kick ran on this turn
            if native.posted:
                wait_taken(worker)  # its round started: a later post cannot merge into it
            second = store.put_message(message(topic="Polls", body=b"second"))
        finally:
            worker.hold(0, False)
        results = await acknowledged(store, first, second)
        return native.rounds - before, results

    try:
        rounds, results = asyncio.run(main())
    finally:
        store.shutdown()
    assert [r.queue_offset for r in results] == [0, 8]
    assert [r.message_count for r in results] == [8, 1]
    if polls is None:
        assert rounds == 1, rounds  # the batch's round waited one turn: the second put joined it
    else:
        assert rounds == 2, rounds


@pytest.mark.parametrize("compiled_rounds", [True, False])
def test_batched_and_single_puts_are_acknowledged_alike_by_the_worker_and_the_thread(
    tmp_path: Path, compiled_rounds: bool
) -> None:
    """The Python flush thread (``compiled_rounds = false``, or ``TIDEMQ_NO_EXTENSIONS=1``) never
    holds a kick; both paths acknowledge the same puts with the same offsets, each once durable."""
    store = _store(tmp_path / "s", compiled_rounds=compiled_rounds)

    async def main() -> list[Any]:
        futures = []
        for i in range(6):
            futures.append(store.put_messages(_batch(8, f"b{i}-")))
            futures.append(store.put_message(message(topic="Polls", body=f"s{i}".encode())))
            if i % 2:
                await asyncio.sleep(0)
        return await acknowledged(store, *futures)

    try:
        results = asyncio.run(main())
        policy = store.flush_policy
        if policy._native is None:
            assert policy.kicks_held == policy.kicks_sparse == 0
    finally:
        store.shutdown()
    assert [r.queue_offset for r in results] == [i * 9 + (8 if k else 0) for i in range(6) for k in (0, 1)]
    assert [r.message_count for r in results] == [8, 1] * 6
