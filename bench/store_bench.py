"""Store throughput against the raw disk of the same machine, measured in the same run.

    /tmp/venv/bin/python bench/store_bench.py [--seconds 1.5] [--dir /path/on/the/disk] [--full]

Prints one JSON document on stdout (progress on stderr):

* ``raw_burst``: sequential ``write`` of 1 MiB chunks then ``fdatasync`` (MB/s);
* ``fsync_per_message``: ``pwrite`` of one 1 KiB record + ``fdatasync``, repeated (msgs/s), at the
  start of the run; ``fsync_around_sync_writers``: the same (``1k``), a 4 KiB append (``4k``,
  compare.py's one-fsync figure) and 32 KiB into reserved space (``32k_reserved``: one round of
  the 32 sync writers' flush without Python) just before and just after the sync writers, whose mean 1 KiB rate
  (``fsync_per_message_baseline_msgs_s``) is the "one fsync per message" of the sync ratios: the
  same file system (``machine``: device, mount, fs type), the same moment;
* ``append``: the mmap store's put throughput (msgs/s, MB/s of stored records) for 128 B, 1 KiB
  and 16 KiB bodies, single puts (each awaited) and batches of 32 (``put_messages``), under
  ``async`` and ``sync`` flush; ``durable_mb_s`` includes the final flush;
* ``read``: ``get_message`` pulls of 32 over what was appended (views into the mapped files);
* ``sync_concurrent``: 32 threads each awaiting single puts under ``sync`` (group commit), with
  the batching (messages per fsync) and the time per flush round next to the bare fsync time;
* ``sync_concurrent_asyncio``: the same 32 writers as asyncio tasks on one event loop (how the
  broker serves 32 producers: each send awaits its put through ``tidemq.futures.resolved``);
* ``async_concurrent_asyncio``: those 32 asyncio writers on the ``async`` store, where no put
  waits for a flush: the ceiling of any flush policy on this machine;
* ``async_concurrent``: the 32 writer threads on the ``async`` store: the same ceiling for
  ``sync_concurrent`` (a thread that waits for its flush costs a block and a wake-up per put);
* ``sync_latency``: single 1 KiB puts at a fixed rate (``--latency-rate``, open loop, from an
  asyncio loop as the broker makes them, spread over 8 queues, with the hash index) under
  ``sync`` flush: p50/p99/p99.9 from put to the awaiting task's resumption, against one
  ``pwrite`` + ``fdatasync`` of a 1 KiB record (p50/p99) measured just before, and against an
  ideal group commit on the same disk just before and after (``ideal_group_commit_*_latency``:
  the same arrivals served by back-to-back fsyncs with no overhead, whose tail is weighted by time);
* ``sustained``: raw disk and the store (async, batches of 32 x 1 KiB, with and without the
  transient store pool) over the same volume, alternated, each until durable;
* ``ceilings``: what pure Python can do on this machine, measured in the same run: the bare
  record encode loop (1 KiB, batches of 32, into a bytearray), the same bytes written into a fresh
  file through a mapping and with ``pwrite`` (what the store does), each plus fdatasync, and the
  CPU time of one single put;
* ``ratios`` and ``targets``: async batched 1 KiB durable MB/s over the disk's sustained MB/s
  (target ≥ 0.5), sync 32-writer msgs/s over fsync-per-message msgs/s (target ≥ 20), and the sync
  put p99 at a fixed rate over one fsync (the store's share of compare.py's latency target).

``raw_burst`` writes 256 MiB to a fresh file with ``write`` + ``fdatasync`` (median of three): on
a virtual disk that is the burst the host absorbs at memory speed, not the disk; the ``*_burst``
ratios compare the put path with it, which shows where the put path's CPU stands.  ``sustained``
is the disk (see its docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tidemq.futures import resolved
from tidemq.message import MessageInner
from tidemq.plugins import get_plugin_manager
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store

BODY_SIZES = (128, 1024, 16384)
BATCH = 32
WRITERS = 32
FILE_ALLOCATION = "sparse"  # the store's default; --file-allocation fallocate for comparison


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def raw_disk(directory: Path, total_mb: int, repeats: int = 3) -> dict[str, Any]:
    """Median of ``repeats`` runs: the figure moves a lot on shared virtual disks."""
    path = directory / "raw.bin"
    chunk = os.urandom(1 << 20)
    runs = []
    for _ in range(repeats):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            t0 = time.perf_counter()
            for _ in range(total_mb):
                os.write(fd, chunk)
            os.fdatasync(fd)
            runs.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
            path.unlink()
    elapsed = sorted(runs)[len(runs) // 2]
    return {
        "bytes": total_mb << 20,
        "seconds": round(elapsed, 3),
        "mb_s": round(total_mb * 1.048576 / elapsed, 1),
        "runs_mb_s": [round(total_mb * 1.048576 / r, 1) for r in runs],
    }


def _raw_write(path: Path, total_mb: int) -> float:
    """Seconds to write ``total_mb`` MiB sequentially (1 MiB chunks) and fdatasync them."""
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(total_mb):
            os.write(fd, chunk)
        os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()


def _store_write(directory: Path, total_mb: int, file_size: int, transient: bool) -> dict[str, Any]:
    """The mmap store under async flush: 1 KiB bodies in batches of 32 up to ``total_mb``, then durable.

    The messages of a batch differ (each its own UNIQ_KEY, as a client's batch): the store
    serializes every properties map, none is shared.
    """
    store = open_store(directory, "async", file_size, FILE_ALLOCATION, transient=transient)
    try:
        base = make_message(store, "BenchSustained", 1024)
        msgs = [
            MessageInner(
                topic=base.topic,
                body=base.body,
                properties={"TAGS": "bench", "UNIQ_KEY": f"{i:032X}"},
                born_timestamp=base.born_timestamp,
                born_host=base.born_host,
            )
            for i in range(BATCH)
        ]
        n, stored, acked, durable = put_until_durable(store, msgs, goal_bytes=total_mb << 20)
        return {
            "messages": n,
            "bytes": stored,
            "acked_mb_s": round(stored / acked / 1e6, 1),
            "durable_mb_s": round(stored / durable / 1e6, 1),
        }
    finally:
        store.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


def sustained(directory: Path, total_mb: int, repeats: int, file_size: int) -> dict[str, Any]:
    """Raw disk and the store over the same volume, alternated, each until its data is on disk.

    A virtual disk often takes a burst at memory speed and then settles at its real bandwidth
    (here: about 2 GB/s for the first ~250 MB, then ~300 MB/s).  ``raw_disk`` above, 256 MiB on a
    rested disk, measures the burst; this measures the disk.  Runs alternate (raw, store with the
    default mapping, store with the transient pool, ...) so each sees the same state of the host,
    and each ends with its bytes durable (fdatasync), so page-cache absorption counts for none.
    """
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], "mapped": [], "transient_pool": []}
    for r in range(repeats):
        progress(f"sustained {r + 1}/{repeats}: raw {total_mb} MiB ...")
        secs = _raw_write(directory / "sustained-raw.bin", total_mb)
        runs["raw"].append({"durable_mb_s": round(total_mb * 1.048576 / secs, 1)})
        for name, transient in (("mapped", False), ("transient_pool", True)):
            progress(f"sustained {r + 1}/{repeats}: store ({name}) {total_mb} MiB ...")
            runs[name].append(_store_write(directory / f"sustained-{name}", total_mb, file_size, transient))
            progress(f"  {runs[name][-1]['durable_mb_s']} MB/s durable")

    def median(name: str) -> float:
        values = sorted(x["durable_mb_s"] for x in runs[name])
        return values[len(values) // 2]

    raw = median("raw")
    return {
        "volume_mb": total_mb,
        "runs": runs,
        "raw_mb_s": raw,
        "mapped_durable_mb_s": median("mapped"),
        "transient_pool_durable_mb_s": median("transient_pool"),
        "mapped_vs_raw": round(median("mapped") / raw, 3),
        "transient_pool_vs_raw": round(median("transient_pool") / raw, 3),
    }


def fsync_per_message(
    directory: Path, seconds: float, size: int = 1024, *, reserved: bool = False
) -> dict[str, Any]:
    """``pwrite`` of ``size`` bytes at the end of what was written + ``fdatasync``, repeated.

    ``reserved``: into space ``posix_fallocate`` reserved first (the file does not grow), as the
    store writes its commit log.
    """
    path = directory / "fsync.bin"
    record = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = 0
    samples: list[float] = []
    try:
        if reserved:
            os.posix_fallocate(fd, 0, 64 << 20)
            os.fdatasync(fd)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        pos = 0
        while True:
            t = time.perf_counter()
            if t >= deadline:
                break
            os.pwrite(fd, record, pos)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t)
            pos += size
            n += 1
            if reserved and pos + size > 64 << 20:
                break
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {
        "messages": n,
        "msgs_s": round(n / elapsed, 1),
        "fsync_us": round(elapsed / n * 1e6, 1),
        "p50_us": percentile_us(samples, 0.5),
        "p99_us": percentile_us(samples, 0.99),
    }


def ideal_group_commit(directory: Path, seconds: float, rate: float, size: int = 1024) -> dict[str, Any]:
    """The put latency of a group commit with no overhead at all, on this disk at this moment.

    One thread appends ``size`` bytes and ``fdatasync`` s back to back for ``seconds``; a put
    arriving at time t (``rate`` per second, evenly spread) is durable at the end of the first
    fsync that starts after t (its bytes must be written before that fsync begins): it waits for
    the rest of the fsync in progress plus one whole fsync.  Arrivals are spread in time, so a
    long fsync delays every put that arrives during it: this tail is weighted by time, while one
    fsync's p99 counts each call once (a 200 ms stall is one sample of a few thousand calls, yet
    holds up 400 puts at 2 000/s).  ``sync_latency`` compares with both.
    """
    path = directory / "ideal.bin"
    record = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    spans: list[tuple[float, float]] = []
    try:
        t0 = time.perf_counter()
        pos = 0
        while (start := time.perf_counter()) - t0 < seconds:
            os.pwrite(fd, record, pos)
            os.fdatasync(fd)
            spans.append((start, time.perf_counter()))
            pos += size
    finally:
        os.close(fd)
        path.unlink()
    lat: list[float] = []
    i = 0
    t = spans[0][0]
    step = 1 / rate
    while True:
        while i < len(spans) and spans[i][0] < t:  # the first fsync that starts after t
            i += 1
        if i == len(spans):
            break
        lat.append(spans[i][1] - t)
        t += step
    return {
        "fsyncs": len(spans),
        "arrivals": len(lat),
        "p50_us": percentile_us(lat, 0.5),
        "p99_us": percentile_us(lat, 0.99),
        "p999_us": percentile_us(lat, 0.999),
        "fsync_p99_us": percentile_us([b - a for a, b in spans], 0.99),
    }


def filesystem_of(path: Path) -> dict[str, str]:
    """The mount (device, mount point, type) that holds ``path``: where every fsync here lands."""
    best = ("", "", "")
    real = str(path.resolve())
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
                    best = (dev, mnt, fstype)
    except OSError:
        pass
    return {"device": best[0], "mount": best[1], "fs": best[2]}


def fsync_baseline(directory: Path, seconds: float) -> dict[str, Any]:
    """One fsync per message, as the sync targets count it: the same file system, this moment.

    ``1k``: ``pwrite`` of a 1 KiB record at the end of a growing file + ``fdatasync`` (what one
    message per fsync costs); ``4k``: a 4 KiB ``O_APPEND`` write + ``fdatasync`` (compare.py's
    one-fsync figure, ``compare_limits.fsync_4k``); ``32k_reserved``: 32 KiB into reserved space +
    ``fdatasync``: one round of the 32 sync writers' flush as the store does it, without any
    Python (32 x its rate over ``1k``'s is the most the 32 writers could reach with puts that cost
    nothing: ``zero_cpu_32_writers_vs_fsync_per_message``).
    """
    return {
        "1k": fsync_per_message(directory, seconds / 2),
        "4k": fsync_per_message(directory, seconds / 2, 4096),
        "32k_reserved": fsync_per_message(directory, seconds / 2, 32768, reserved=True),
    }


def percentile_us(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (seconds), in microseconds."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e6, 1)


def make_message(store: Any, topic: str, size: int) -> MessageInner:
    return MessageInner(
        topic=topic,
        body=os.urandom(size),
        queue_id=0,
        properties={"TAGS": "bench", "UNIQ_KEY": "0" * 32},
        born_timestamp=int(time.time() * 1000),
        born_host=("127.0.0.1", 50000),
        store_host=store.store_host,
    )


def put_until_durable(
    store: Any, msgs: list[MessageInner], *, goal_bytes: int | None = None, seconds: float | None = None
) -> tuple[int, int, float, float]:
    """Put ``msgs`` (one put per batch) until ``goal_bytes`` are stored or ``seconds`` have passed,
    then commit and flush; returns (messages, bytes, seconds to the last ack, seconds to durable)."""
    n = stored = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds if seconds is not None else float("inf")
    goal = goal_bytes if goal_bytes is not None else float("inf")
    single = msgs[0] if len(msgs) == 1 else None
    while stored < goal and time.perf_counter() < deadline:
        res = (store.put_message(single) if single is not None else store.put_messages(msgs)).result(60)
        if not res.ok:
            raise RuntimeError(f"put failed: {res.status} {res.error}")
        n += res.message_count
        stored += res.wrote_bytes
    acked = time.perf_counter() - t0
    store.commitlog.commit(0)
    store.commitlog.flush(0)
    return n, stored, acked, time.perf_counter() - t0


def append_case(store: Any, flush: str, size: int, batch: int, seconds: float) -> dict[str, Any]:
    topic = f"Bench-{flush}-{size}-{batch}"
    msg = make_message(store, topic, size)
    n, stored, acked, durable = put_until_durable(store, [msg] * batch, seconds=seconds)
    return {
        "flush": flush,
        "body": size,
        "batch": batch,
        "messages": n,
        "msgs_s": round(n / acked, 1),
        "mb_s": round(stored / acked / 1e6, 2),
        "durable_mb_s": round(stored / durable / 1e6, 2),
        "record_bytes": stored // max(n, 1),
        "topic": topic,
    }


def read_case(store: Any, case: dict[str, Any], seconds: float) -> dict[str, Any]:
    topic = case["topic"]
    n = 0
    size = 0
    offset = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        got = store.get_message("bench", topic, 0, offset, 32, None, 1 << 30)
        if got.status is not GetStatus.FOUND:
            if got.status is GetStatus.OFFSET_OVERFLOW_ONE and offset > 0:
                offset = 0  # wrap around for a stable figure on small data sets
                continue
            break
        # Materialize the records as a pull response body would (one copy), not just the views.
        size += len(b"".join(got.buffers))
        n += got.message_count
        offset = got.next_begin_offset
    elapsed = time.perf_counter() - t0
    return {
        "flush": case["flush"],
        "body": case["body"],
        "batch": case["batch"],
        "messages": n,
        "msgs_s": round(n / elapsed, 1),
        "mb_s": round(size / elapsed / 1e6, 2),
    }


def sync_concurrent(store: Any, seconds: float, writers: int, size: int = 1024) -> dict[str, Any]:
    counts = [0] * writers
    stop = threading.Event()
    failures: list[str] = []

    def writer(w: int) -> None:
        msg = make_message(store, "BenchConcurrent", size)
        msg.queue_id = w % 8
        while not stop.is_set():
            res = store.put_message(msg).result(60)
            if not res.ok:
                failures.append(f"{res.status}")
                return
            counts[w] += 1

    policy = store.flush_policy
    fsyncs0 = store.commitlog.queue.flush_calls()
    cpu0 = time.process_time()
    rounds0 = policy.flush_rounds
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    total = sum(counts)
    fsyncs = store.commitlog.queue.flush_calls() - fsyncs0
    return {
        "writers": writers,
        "body": size,
        "messages": total,
        "msgs_s": round(total / elapsed, 1),
        "fsyncs": fsyncs,
        "messages_per_fsync": round(total / max(fsyncs, 1), 1),
        "flush_rounds": policy.flush_rounds - rounds0,
        # A round is one fsync plus the Python work of its batch; compare with fsync_per_message.
        "round_us": round(elapsed / max(fsyncs, 1) * 1e6, 1),
        "process_cpu_us_per_msg": round(cpu / max(total, 1) * 1e6, 2),
        "failures": failures[:3],
    }


def sync_concurrent_asyncio(store: Any, seconds: float, writers: int, size: int = 1024) -> dict[str, Any]:
    """``writers`` asyncio tasks on one loop, each awaiting its put as the broker does (``resolved``).

    Run on an ``async`` store it gives the ceiling of any flush policy: the same writers with no
    flush to wait for.
    """
    counts = [0] * writers
    failures: list[str] = []

    async def writer(w: int, stop_at: float) -> None:
        msg = make_message(store, "BenchConcurrentAsync", size)
        msg.queue_id = w % 8
        while time.perf_counter() < stop_at:
            res = await resolved(store.put_message(msg))
            if not res.ok:
                failures.append(f"{res.status}")
                return
            counts[w] += 1

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w, t0 + seconds) for w in range(writers)))
        return time.perf_counter() - t0

    policy = store.flush_policy
    flush_s = getattr(policy, "flush_seconds", None)
    flush0 = (flush_s.count, flush_s.total) if flush_s is not None else (0, 0.0)
    fsyncs0 = store.commitlog.queue.flush_calls()
    cpu0 = time.process_time()
    elapsed = asyncio.run(run())
    cpu = time.process_time() - cpu0
    total = sum(counts)
    fsyncs = store.commitlog.queue.flush_calls() - fsyncs0
    rounds = flush_s.count - flush0[0] if flush_s is not None else 0
    return {
        "writers": writers,
        "body": size,
        "messages": total,
        "msgs_s": round(total / elapsed, 1),
        "fsyncs": fsyncs,
        "messages_per_fsync": round(total / max(fsyncs, 1), 1),
        "round_us": round(elapsed / max(fsyncs, 1) * 1e6, 1),
        # The flush itself (commit + fdatasync) per round; the rest of round_us is CPU and wake-ups.
        "flush_us": round((flush_s.total - flush0[1]) / rounds * 1e6, 1) if rounds else None,
        "round_minus_flush_us": (
            round(elapsed / max(fsyncs, 1) * 1e6 - (flush_s.total - flush0[1]) / rounds * 1e6, 1)
            if rounds
            else None
        ),
        "process_cpu_us_per_msg": round(cpu / max(total, 1) * 1e6, 2),
        "failures": failures[:3],
    }


def sync_latency(store: Any, rate: float, seconds: float, size: int = 1024) -> dict[str, Any]:
    """Single puts at ``rate`` per second (open loop) from an asyncio loop, each awaited as the broker
    awaits a send (``resolved``); the latency of each from the put to its task's resumption.

    Puts are started on a 1 ms tick (compare.py's generator does the same), spread over 8 queues
    with a fresh key each (the key index sees new keys, as from a real producer).
    """
    lat: list[float] = []
    failures: list[str] = []
    base = make_message(store, "BenchLatency", size)

    async def one(i: int) -> None:
        msg = MessageInner(
            topic=base.topic,
            body=base.body,
            queue_id=i % 8,
            properties={"TAGS": "bench", "UNIQ_KEY": f"{i:032X}"},
            born_timestamp=base.born_timestamp,
            born_host=base.born_host,
        )
        t0 = time.perf_counter()
        res = await resolved(store.put_message(msg))
        lat.append(time.perf_counter() - t0)
        if not res.ok:
            failures.append(f"{res.status}")

    async def run() -> None:
        tasks: set[asyncio.Task[None]] = set()
        t0 = time.perf_counter()
        started = 0
        while (now := time.perf_counter()) - t0 < seconds:
            for _ in range(int((now - t0) * rate) - started):
                task = asyncio.ensure_future(one(started))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                started += 1
            await asyncio.sleep(0.001)
        if tasks:
            await asyncio.gather(*tasks)

    fsyncs0 = store.commitlog.queue.flush_calls()
    asyncio.run(run())
    fsyncs = store.commitlog.queue.flush_calls() - fsyncs0
    return {
        "rate": rate,
        "seconds": seconds,
        "messages": len(lat),
        "fsyncs": fsyncs,
        "p50_us": percentile_us(lat, 0.5),
        "p90_us": percentile_us(lat, 0.9),
        "p99_us": percentile_us(lat, 0.99),
        "p999_us": percentile_us(lat, 0.999),
        "failures": failures[:3],
    }


def ceilings(directory: Path, seconds: float, size: int = 1024) -> dict[str, Any]:
    """Pure-Python limits of this machine for the async batched 1 KiB case."""
    from tidemq.message import RecordEncoder

    encoder = RecordEncoder(("127.0.0.1", 10911))
    msg = MessageInner(
        topic="Bench",
        body=os.urandom(size),
        properties={"TAGS": "bench", "UNIQ_KEY": "0" * 32},
        born_host=("127.0.0.1", 50000),
    )
    msgs = [msg] * BATCH
    batch = encoder.prepare(msgs)
    buf = bytearray(batch.total)
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        b = encoder.prepare(msgs)
        encoder.write_into(buf, 0, b, 0, 0, 0)
        n += BATCH
    encode_s = time.perf_counter() - t0
    # The same bytes into a fresh file, then fdatasync: through the mapping (a page fault per
    # fresh page) and with pwrite (what the store does).  The medium's own ceiling.
    total = 256 << 20
    data = bytes(buf)
    medium: dict[str, float] = {}
    for how in ("mmap", "pwrite"):
        path = directory / f"ceiling-{how}.bin"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total)
            t0 = time.perf_counter()
            pos = 0
            while pos + len(data) <= total:
                if how == "mmap":
                    mm[pos : pos + len(data)] = data
                else:
                    os.pwrite(fd, data, pos)
                pos += len(data)
            os.fdatasync(fd)
            medium[how] = round(pos / (time.perf_counter() - t0) / 1e6, 1)
            mm.close()
        finally:
            os.close(fd)
            path.unlink()
    return {
        "encode_loop_msgs_s": round(n / encode_s, 1),
        "encode_loop_mb_s": round(n * batch.total / BATCH / encode_s / 1e6, 1),
        "mmap_copy_fdatasync_mb_s": medium["mmap"],
        "pwrite_fdatasync_mb_s": medium["pwrite"],
    }


def put_cpu_us(store: Any, count: int = 20000, size: int = 1024) -> float:
    """CPU time of one awaited single put (async flush): what bounds group-commit throughput."""
    msg = make_message(store, "BenchCpu", size)
    for _ in range(500):
        store.put_message(msg).result(60)
    t0 = time.thread_time()
    for _ in range(count):
        store.put_message(msg).result(60)
    return round((time.thread_time() - t0) / count * 1e6, 2)


def open_store(
    directory: Path,
    flush: str,
    file_size: int,
    allocation: str = FILE_ALLOCATION,
    *,
    transient: bool = False,
    index: bool = False,
) -> Any:
    """An mmap store as the broker composes it (``index``: with the ``hash`` key index)."""
    key_index = get_plugin_manager().create("index", "hash", data_dir=directory) if index else None
    store = build_store(
        "mmap",
        directory,
        flush=flush,
        index=key_index,
        store_options={
            "commitlog_file_size": file_size,
            "cq_flush_interval_ms": 1000,
            "file_allocation": allocation,
            "transient_store_pool": transient,
        },
    )
    if not store.load():
        raise RuntimeError("store did not load")
    store.start()
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="duration of each timed case")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--raw-mb", type=int, default=256, help="MiB written for the raw disk figure")
    ap.add_argument("--file-size", type=int, default=256 << 20, help="commit-log file size")
    ap.add_argument("--full", action="store_true", help="longer cases (5 s) and 1 GiB raw write, 1 GiB files")
    ap.add_argument("--file-allocation", default=FILE_ALLOCATION, choices=("fallocate", "sparse"))
    ap.add_argument("--sustained-mb", type=int, default=1024, help="MiB per sustained run (raw and store)")
    ap.add_argument("--sustained-repeats", type=int, default=3, help="alternated sustained runs of each")
    ap.add_argument("--latency-rate", type=float, default=2000.0, help="puts/s of the sync_latency case")
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="duration of the sync_latency case")
    ap.add_argument(
        "--only",
        choices=("all", "sync"),
        default="all",
        help="sync: only the sync-flush figures (fsync per message, 32 writers, latency) and their ceilings",
    )
    args = ap.parse_args()
    if args.full:
        args.seconds, args.raw_mb, args.file_size, args.sustained_mb = 5.0, 1024, 1 << 30, 2048
    base = Path(tempfile.mkdtemp(prefix="tidemq-bench-", dir=args.dir))
    out: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "dir": str(base),
            **filesystem_of(base),
            "load_average": list(os.getloadavg()),
        },
        "seconds_per_case": args.seconds,
        "file_allocation": args.file_allocation,
    }
    try:
        if args.only == "all":
            progress(f"raw sequential write of {args.raw_mb} MiB + fdatasync ...")
            out["raw_burst"] = raw_disk(base, args.raw_mb)
        progress("one fdatasync per 1 KiB message ...")
        out["fsync_per_message"] = fsync_per_message(base, args.seconds)
        baselines: list[dict[str, Any]] = []
        appends: list[dict[str, Any]] = []
        reads: list[dict[str, Any]] = []
        cpu_us = 0.0
        for flush in ("async", "sync"):
            store = open_store(base / flush, flush, args.file_size, args.file_allocation)
            try:
                cases = []
                for size in BODY_SIZES if args.only == "all" else ():
                    for batch in (1, BATCH):
                        progress(f"append {flush} body={size} batch={batch} ...")
                        case = append_case(store, flush, size, batch, args.seconds)
                        cases.append(case)
                        progress(f"  {case['msgs_s']} msgs/s {case['mb_s']} MB/s")
                for case in cases:
                    reads.append(read_case(store, case, min(args.seconds, 1.0)))
                if flush == "async":
                    progress("CPU time of one single put ...")
                    cpu_us = put_cpu_us(store)
                    progress(f"async flush, {WRITERS} concurrent writers (threads): no flush to wait for ...")
                    out["async_concurrent"] = sync_concurrent(store, args.seconds * 2, WRITERS)
                    progress(f"  {out['async_concurrent']['msgs_s']} msgs/s")
                    progress(
                        f"async flush, {WRITERS} concurrent writers (asyncio tasks): no flush to wait for ..."
                    )
                    out["async_concurrent_asyncio"] = sync_concurrent_asyncio(
                        store, args.seconds * 2, WRITERS
                    )
                    progress(f"  {out['async_concurrent_asyncio']['msgs_s']} msgs/s")
                if flush == "sync":
                    progress(
                        "one fdatasync per message (1 KiB and 4 KiB appends), before the sync writers ..."
                    )
                    baselines.append(fsync_baseline(base, args.seconds))
                    progress(f"sync flush, {WRITERS} concurrent writers (threads) ...")
                    out["sync_concurrent"] = sync_concurrent(store, args.seconds * 2, WRITERS)
                    progress(f"  {out['sync_concurrent']['msgs_s']} msgs/s")
                    progress(f"sync flush, {WRITERS} concurrent writers (asyncio tasks) ...")
                    out["sync_concurrent_asyncio"] = sync_concurrent_asyncio(store, args.seconds * 2, WRITERS)
                    progress(f"  {out['sync_concurrent_asyncio']['msgs_s']} msgs/s")
                    progress("one fdatasync per message, after the sync writers ...")
                    baselines.append(fsync_baseline(base, args.seconds))
                appends.extend(cases)
            finally:
                store.shutdown()
                shutil.rmtree(base / flush, ignore_errors=True)
        progress(
            f"sync flush, {args.latency_rate:.0f} single puts/s for {args.latency_seconds}s (latency) ..."
        )
        out["fsync_before_latency"] = fsync_per_message(base, min(args.seconds, 1.0))
        out["fsync_4k_before_latency"] = fsync_per_message(base, min(args.seconds, 1.0), 4096)
        progress("an ideal group commit on this disk (back-to-back fsyncs, arrivals spread in time) ...")
        out["ideal_group_commit_before_latency"] = ideal_group_commit(
            base, min(args.latency_seconds, 5.0), args.latency_rate
        )
        store = open_store(base / "latency", "sync", args.file_size, args.file_allocation, index=True)
        try:
            out["sync_latency"] = sync_latency(store, args.latency_rate, args.latency_seconds)
        finally:
            store.shutdown()
            shutil.rmtree(base / "latency", ignore_errors=True)
        lat = out["sync_latency"]
        progress(f"  p50 {lat['p50_us']} us, p99 {lat['p99_us']} us")
        progress("the ideal group commit again, after ...")
        out["ideal_group_commit_after_latency"] = ideal_group_commit(
            base, min(args.latency_seconds, 5.0), args.latency_rate
        )
        out["fsync_around_sync_writers"] = baselines
        # "One fsync per message": 1 KiB appends fdatasync'd one by one on this file system, the
        # mean of the runs just before and just after the sync writers (the disk drifts on a
        # shared host; the start-of-run figure alone is kept as fsync_per_message).
        per_msg = statistics.fmean(b["1k"]["msgs_s"] for b in baselines)
        out["fsync_per_message_baseline_msgs_s"] = round(per_msg, 1)
        one_fsync = out["fsync_before_latency"]
        ratios: dict[str, Any] = {
            "sync_32_writers_vs_fsync_per_message": round(out["sync_concurrent"]["msgs_s"] / per_msg, 2),
            "sync_32_asyncio_writers_vs_fsync_per_message": round(
                out["sync_concurrent_asyncio"]["msgs_s"] / per_msg, 2
            ),
            # The same writers with nothing to wait for (async flush): no flush policy can do better,
            # so below 20 they bound the sync target on this machine.
            "no_flush_32_writers_vs_fsync_per_message": round(out["async_concurrent"]["msgs_s"] / per_msg, 2),
            "no_flush_32_asyncio_writers_vs_fsync_per_message": round(
                out["async_concurrent_asyncio"]["msgs_s"] / per_msg, 2
            ),
            # How close group commit comes to that ceiling (1.0: the flush costs the writers nothing).
            "sync_vs_no_flush_32_writers": round(
                out["sync_concurrent"]["msgs_s"] / out["async_concurrent"]["msgs_s"], 3
            ),
            "sync_vs_no_flush_32_asyncio_writers": round(
                out["sync_concurrent_asyncio"]["msgs_s"] / out["async_concurrent_asyncio"]["msgs_s"], 3
            ),
            "single_put_cpu_ceiling_vs_fsync_per_message": round(1e6 / cpu_us / per_msg, 2),
            # The 32 writers' flush rounds alone, modelled without Python (32 KiB into reserved
            # space + fdatasync, beside the baseline) and as the store's own rounds measured them
            # (commit + fdatasync per round, flush_us): above 20 only if the disk leaves room for
            # the puts and hand-offs.  The model is a different file at a different moment: on a
            # shared disk either may be the lower.
            "zero_cpu_32_writers_vs_fsync_per_message": round(
                32 * statistics.fmean(b["32k_reserved"]["msgs_s"] for b in baselines) / per_msg, 2
            ),
            "flush_only_32_asyncio_writers_vs_fsync_per_message": (
                round(32 * 1e6 / out["sync_concurrent_asyncio"]["flush_us"] / per_msg, 2)
                if out["sync_concurrent_asyncio"]["flush_us"]
                else None
            ),
            # A put waits for the rest of the fsync in progress and its own: a p99 under two fsync
            # p99s is the disk's share; compare.py's target divides by the fsync p50.
            "sync_latency_p99_vs_fsync_p50": round(lat["p99_us"] / one_fsync["p50_us"], 2),
            "sync_latency_p99_vs_fsync_p99": round(lat["p99_us"] / one_fsync["p99_us"], 2),
            "sync_latency_p99_vs_fsync_4k_p99": round(
                lat["p99_us"] / out["fsync_4k_before_latency"]["p99_us"], 2
            ),
            "sync_latency_p50_vs_fsync_p50": round(lat["p50_us"] / one_fsync["p50_us"], 2),
            # Against a group commit with no overhead on the same disk, the same arrivals: what the
            # disk's own tail (weighted by time, as puts see it) leaves.
            # (the larger p99 of the runs just before and just after: the disk at its worse moment)
            "sync_latency_p99_vs_ideal_group_commit_p99": round(
                lat["p99_us"]
                / max(
                    out["ideal_group_commit_before_latency"]["p99_us"],
                    out["ideal_group_commit_after_latency"]["p99_us"],
                ),
                2,
            ),
        }
        out["ratios"] = ratios
        out["targets"] = {
            "sync_32_writers_ge_20x_fsync_per_message": ratios["sync_32_writers_vs_fsync_per_message"] >= 20,
        }
        if args.only == "all":
            progress("pure-Python ceilings ...")
            out["ceilings"] = {**ceilings(base, args.seconds), "single_put_cpu_us": cpu_us}
            for case in appends:
                case.pop("topic", None)
            out["append"] = appends
            out["read"] = reads
            out["sustained"] = sustained(base, args.sustained_mb, args.sustained_repeats, args.file_size)
            sus = out["sustained"]
            raw = out["raw_burst"]["mb_s"]
            async_batched = next(
                c for c in appends if c["flush"] == "async" and c["body"] == 1024 and c["batch"] == BATCH
            )
            ceil = out["ceilings"]
            ratios.update(
                {
                    # The target's figure: the disk's sustained bandwidth, same volume, alternated runs.
                    "async_batched_1k_durable_vs_raw_disk": sus["mapped_vs_raw"],
                    "async_batched_1k_transient_pool_durable_vs_raw_disk": sus["transient_pool_vs_raw"],
                    # Against the burst a rested virtual disk takes at memory speed (raw_disk): what
                    # the put path's CPU allows when the disk is not the limit.
                    "async_batched_1k_durable_vs_raw_burst": round(async_batched["durable_mb_s"] / raw, 3),
                    "async_batched_1k_acked_vs_raw_burst": round(async_batched["mb_s"] / raw, 3),
                    # Where the limits are: the encode loop alone against the disk.
                    "encode_loop_ceiling_vs_raw_burst": round(ceil["encode_loop_mb_s"] / raw, 3),
                }
            )
            out["targets"]["async_batched_1k_ge_50pct_raw"] = (
                ratios["async_batched_1k_durable_vs_raw_disk"] >= 0.5
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
