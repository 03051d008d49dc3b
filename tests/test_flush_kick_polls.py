"""``[flush.sync] kick_polls``: a loop's round that would start the idle compiled worker waits
that many more turns of the loop, so puts made meanwhile share its ``fdatasync``.

What a producer relies on must not change: every put acknowledged only once the commit log's
flushed offset covers it.  Real mmap stores on real files, the compiled worker flushing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tidemq.futures import resolved
from tidemq.testing.store_contract import build_store, message
from tidemq_flush import native_rounds

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not native_rounds.available(), reason="the compiled flush worker is not built"),
]


def _store(data: Path, polls: int) -> Any:
    store = build_store(
        "mmap", data, flush="sync", flush_options={"compiled_rounds": True, "kick_polls": polls}
    )
    assert store.load()
    store.start()
    return store


def _two_puts_one_turn_apart(store: Any) -> tuple[int, list[Any]]:
    """A put, one turn of the loop, a second put; returns the worker's rounds for both and the
    results, checking at each acknowledgement that the flushed offset covers the put."""

    async def main() -> tuple[int, list[Any]]:
        native = store.flush_policy._native
        assert native is not None
        before = native.rounds
        first = store.put_message(message(topic="Polls", body=b"first"))
        await asyncio.sleep(0)  # the first put's kick runs on this turn
        second = store.put_message(message(topic="Polls", body=b"second"))
        results = []
        for fut in (first, second):
            r = await resolved(fut)
            assert r.ok and store.commitlog.flushed_where >= r.wrote_offset + r.wrote_bytes
            results.append(r)
        return native.rounds - before, results

    return asyncio.run(main())


@pytest.mark.parametrize("polls", [0, 1])
def test_a_put_made_while_the_round_waits_its_loop_turn_shares_its_fdatasync(
    tmp_path: Path, polls: int
) -> None:
    store = _store(tmp_path / "s", polls)
    try:
        rounds, results = _two_puts_one_turn_apart(store)
    finally:
        store.shutdown()
    assert [r.queue_offset for r in results] == [0, 1]
    if polls:
        assert rounds == 1, rounds  # the first put's round waited one turn: the second joined it
    else:
        # Posted at the first put's kick; the second is posted after it and merges only when
        # the worker thread had not woken up yet (a scheduler race): one round or two.
        assert rounds in (1, 2), rounds
