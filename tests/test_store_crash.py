"""SIGKILL a writer process mid-load under sync flush; every acknowledged message must survive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidemq.message import decode_message
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store

WRITER = r"""
import sys, threading
from tidemq.testing.store_contract import build_store, message

ROUND = int(sys.argv[3]) if len(sys.argv) > 3 else 0
LOOP = len(sys.argv) > 4 and sys.argv[4] == "loop"

def body(t, i):
    return b"%d-%d-%d-" % (ROUND, t, i) + bytes([65 + t]) * (i * 37 % 700)

store = build_store("mmap", sys.argv[1], flush="sync", store_options={
    "commitlog_file_size": 64 * 1024, "consumequeue_entries": 200,
    "transient_store_pool": sys.argv[2] == "1", "cq_flush_interval_ms": 50})
assert store.load()
store.start()
lock = threading.Lock()

def writer(t):
    i = 0
    while True:
        r = store.put_message(message(topic="Crash", body=body(t, i), queue_id=t % 3)).result()
        if r.ok:
            with lock:
                sys.stdout.write("%d %d %d %d %d\n" % (t, i, t % 3, r.queue_offset, r.wrote_offset))
                sys.stdout.flush()
        i += 1

async def loop_writer(t):
    # As the broker puts: from one event loop, each put awaited (group commit's loop batches).
    from tidemq.futures import resolved
    i = 0
    while True:
        r = await resolved(store.put_message(message(topic="Crash", body=body(t, i), queue_id=t % 3)))
        if r.ok:
            sys.stdout.write("%d %d %d %d %d\n" % (t, i, t % 3, r.queue_offset, r.wrote_offset))
            sys.stdout.flush()
        i += 1

if LOOP:
    import asyncio
    async def main():
        await asyncio.gather(*(loop_writer(t) for t in range(6)))
    asyncio.run(main())
for t in range(6):
    threading.Thread(target=writer, args=(t,), daemon=True).start()
threading.Event().wait()
"""


def body(t: int, i: int, rnd: int = 0) -> bytes:
    return b"%d-%d-%d-" % (rnd, t, i) + bytes([65 + t]) * (i * 37 % 700)


def run_and_kill(
    data: Path, transient: bool, min_acks: int, rnd: int = 0, loop: bool = False
) -> list[tuple[int, ...]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(data),
            "1" if transient else "0",
            str(rnd),
            "loop" if loop else "threads",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(lines) < min_acks and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    os.kill(proc.pid, signal.SIGKILL)
    rest, err = proc.communicate(timeout=30)
    lines.extend(rest.splitlines(keepends=True))
    assert len(lines) >= min_acks, err.decode()[-2000:]
    # A line cut by the kill was never a complete acknowledgement.
    return [tuple(int(x) for x in ln.split()) for ln in lines if ln.endswith(b"\n")]


@pytest.mark.parametrize(
    ("transient", "loop"),
    [(False, False), (True, False), (False, True)],
    ids=["mapped", "transient-pool", "mapped-event-loop-writers"],
)
def test_sigkill_keeps_every_acknowledged_message(tmp_path: Path, transient: bool, loop: bool) -> None:
    data = tmp_path / "store"
    acks = run_and_kill(data, transient, min_acks=400, loop=loop)
    assert (data / "abort").exists()  # it really died without a clean shutdown

    store = build_store(
        "mmap", data, store_options={"commitlog_file_size": 64 * 1024, "consumequeue_entries": 200}
    )
    assert store.load()
    store.start()
    try:
        for t, i, qid, qoff, wrote in acks:
            got = store.get_message("g", "Crash", qid, qoff, 1)
            assert got.status is GetStatus.FOUND, (t, i, qid, qoff, got)
            m = decode_message(got.buffers[0], check_crc=True)
            assert (m.body, m.commit_log_offset, m.queue_offset) == (body(t, i), wrote, qoff)
        # Everything served, acknowledged or not, is whole and CRC-valid, with gap-free offsets.
        served = 0
        for qid in range(3):
            offset = 0
            while True:
                got = store.get_message("g", "Crash", qid, offset, 32)
                if got.status is not GetStatus.FOUND:
                    assert got.status is GetStatus.OFFSET_OVERFLOW_ONE
                    break
                for qo, buf in zip(got.queue_offsets, got.buffers, strict=True):
                    m = decode_message(buf, check_crc=True)
                    assert m.queue_offset == qo and m.queue_id == qid
                    served += 1
                offset = got.next_begin_offset
        assert served >= len(acks)
        # The log continues after the recovered end.
        res = store.put_message(build_message(qid=0)).result(10)
        assert res.ok and res.queue_offset == store.get_max_offset_in_queue("Crash", 0) - 1
        assert res.wrote_offset >= max(a[4] for a in acks)
    finally:
        store.shutdown()


def test_repeated_crashes_lose_nothing_acknowledged(tmp_path: Path) -> None:
    """Crash, recover, write more, crash again: every round's acknowledgements survive."""
    data = tmp_path / "store"
    acked: list[tuple[int, ...]] = []
    for rnd in range(3):
        acked.extend((rnd, *a) for a in run_and_kill(data, False, min_acks=150, rnd=rnd))
    store = build_store(
        "mmap", data, store_options={"commitlog_file_size": 64 * 1024, "consumequeue_entries": 200}
    )
    assert store.load()
    store.start()
    try:
        seen: set[tuple[int, int]] = set()
        for rnd, t, i, qid, qoff, wrote in acked:
            assert (qid, qoff) not in seen  # no queue offset handed out twice across crashes
            seen.add((qid, qoff))
            got = store.get_message("g", "Crash", qid, qoff, 1)
            assert got.status is GetStatus.FOUND
            m = decode_message(got.buffers[0], check_crc=True)
            assert (m.body, m.commit_log_offset) == (body(t, i, rnd), wrote)
    finally:
        store.shutdown()


def build_message(qid: int):
    from tidemq.testing.store_contract import message

    return message(topic="Crash", body=b"after", queue_id=qid)
