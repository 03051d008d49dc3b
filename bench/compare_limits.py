"""Physical limits for ``bench/compare.py``, measured in the same run on the same disk and loopback.

* sequential write bandwidth with ``fdatasync`` (1 MiB writes, a sync every 8 MiB and at the end);
* ``fdatasync`` latency of a 4 KiB append (what one sync-flushed send cannot beat);
* loopback TCP bandwidth: one socket pair, 1 MiB ``sendall`` against ``recv_into`` (both release
  the GIL, so two threads keep both ends busy).
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def disk_write(directory: Path, total: int) -> dict[str, Any]:
    path = directory / "limits-write.bin"
    chunk = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < total:
            written += os.write(fd, chunk)
            if written % (8 * MiB) == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"bytes": written, "seconds": round(elapsed, 3), "mb_per_s": round(written / elapsed / 1e6, 1)}


def fsync_latency(directory: Path, count: int) -> dict[str, Any]:
    path = directory / "limits-fsync.bin"
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    samples = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    samples.sort()
    return {
        "count": count,
        "p50_us": round(samples[len(samples) // 2] * 1e6, 1),
        "p99_us": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
        "syncs_per_s": round(1 / statistics.fmean(samples), 1),
    }


def loopback_tcp(seconds: float) -> dict[str, Any]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    received = [0]

    def sink() -> None:
        conn, _ = server.accept()
        buf = bytearray(MiB)
        view = memoryview(buf)
        with conn:
            while True:
                n = conn.recv_into(view)
                if not n:
                    break
                received[0] += n

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    payload = os.urandom(MiB)
    with socket.create_connection(("127.0.0.1", port)) as out:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            out.sendall(payload)
        out.shutdown(socket.SHUT_WR)
        t.join(10)
        elapsed = time.perf_counter() - t0
    server.close()
    return {
        "bytes": received[0],
        "seconds": round(elapsed, 3),
        "mb_per_s": round(received[0] / elapsed / 1e6, 1),
    }


def measure(directory: Path, quick: bool) -> dict[str, Any]:
    """All three limits; ``quick`` writes 64 MiB instead of 512 MiB and takes fewer samples."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "disk_write_fdatasync": disk_write(directory, (64 if quick else 512) * MiB),
        "fsync_4k": fsync_latency(directory, 100 if quick else 500),
        "loopback_tcp": loopback_tcp(1.0 if quick else 3.0),
    }
