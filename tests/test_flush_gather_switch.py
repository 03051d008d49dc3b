"""The compiled worker's cohort gathering (``[flush.sync] worker_gather_us``) at a commit-log file
switch (syncp50, session 12; the defect sync128 left).

After a round of 64 messages or more that ends with another cohort posted and waiting, the worker's
next round waits (at most ``worker_gather_us``) for the answered cohort's next sends.  When those
sends land in the next commit-log file, the worker cannot take their round (the previous file is
not flushed yet): the Python flush thread flushes them, and the waiting cohort's round must start
at once rather than wait for the whole bound for bytes that never reach the worker.
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

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not native_rounds.available(), reason="the compiled flush worker is not built"),
]

#: A batched put of 8 of these messages takes 832 bytes of the commit log.
BATCH_BYTES = 832
FILE_SIZE = 16 << 10
#: Filler batches first, so that the two cohorts (16 batches) end less than a batch before the
#: file's end and the next cohort's first put opens the next file.
FILLER = (FILE_SIZE - 16 * BATCH_BYTES) // BATCH_BYTES
GATHER_US = 3_000_000


def _puts(store: Any, n: int, tag: str) -> list[Any]:
    return [
        store.put_messages([message(topic="Gather", body=f"{tag}{i:04d}.{j}".encode()) for j in range(8)])
        for i in range(n)
    ]


def test_a_gathering_round_does_not_wait_for_sends_that_went_to_the_next_file(tmp_path: Path) -> None:
    store = build_store(
        "mmap",
        tmp_path / "s",
        flush="sync",
        flush_options={"worker_gather_us": GATHER_US},
        store_options={"commitlog_file_size": FILE_SIZE},
    )
    assert store.load()
    store.start()

    async def main() -> tuple[float, list[Any], list[Any]]:
        native = store.flush_policy._native
        assert native is not None
        worker = native.worker
        filler = await acknowledged(store, *_puts(store, FILLER, "f"))
        assert filler[-1].wrote_offset + BATCH_BYTES <= FILE_SIZE
        worker.hold(0, True)
        try:
            a = _puts(store, 8, "a")
            for _ in range(3):  # the kick (held one turn: it carries 8 messages or more)
                await asyncio.sleep(0)
            wait_taken(worker)
            b = _puts(store, 8, "b")
            await asyncio.sleep(0)  # B's kick: posted behind A's round
            assert len(native.posted) == 2
        finally:
            worker.hold(0, False)
        done_a = await acknowledged(store, *a)
        # A's round ended with B waiting: B's round gathers for A's next sends, which open the
        # next file (the Python thread's round).
        started = time.monotonic()
        c = _puts(store, 8, "c")
        done = await acknowledged(store, *(b + c))
        return time.monotonic() - started, done, done_a

    try:
        took, done, done_a = asyncio.run(main())
        worker = store.flush_policy._native.worker
        gathered = worker.gathered
    finally:
        store.shutdown()
    assert done[7].wrote_offset + 2 * BATCH_BYTES > FILE_SIZE, "B does not end the first file"
    assert done[8].wrote_offset >= FILE_SIZE, "the third cohort stayed in the first file"
    assert gathered <= 1
    # Before: B's round waited the whole bound (3 s) for bytes posted to the Python thread.
    assert took < GATHER_US / 1e6 / 3, f"B waited {took:.2f} s"
    offsets = [r.queue_offset for r in done_a + done]
    assert offsets == list(range(FILLER * 8, FILLER * 8 + 24 * 8, 8))
