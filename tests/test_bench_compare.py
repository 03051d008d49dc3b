"""bench/compare.py's own machinery: latency histograms and the tidemq load generator against a real broker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
import compare_systems  # noqa: E402
from compare_load import bucket, bucket_value_us  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_histogram_percentiles_stay_within_the_bucket_width() -> None:
    latencies_us = [100.0] * 50 + [1000.0] * 49 + [50_000.0]
    hist: dict[int, int] = {}
    for us in latencies_us:
        b = bucket(us / 1e6)
        hist[b] = hist.get(b, 0) + 1
    p50, p99 = compare.percentiles(hist)
    assert abs(p50 - 100) / 100 < 0.02 and abs(p99 - 1000) / 1000 < 0.02
    # Histograms of several generator processes merge by adding counts.
    merged = compare.merge_hists(
        [{"hist": {"0": {"5": 2}}}, {"hist": {"0": {"5": 1, "7": 1}, "1": {"9": 4}}}]
    )
    assert merged == {0: {5: 3, 7: 1}, 1: {9: 4}}
    assert bucket_value_us(bucket(0.0005)) == pytest.approx(500, rel=0.02)


def test_tidemq_generator_produces_and_reads_back_every_message(tmp_path: Path) -> None:
    """Single and batched sends from two generator processes, then the pulls read back exactly those."""
    server = compare_systems.start_tidemq(tmp_path / "tidemq", "async")
    try:
        bench = compare.Bench(argparse.Namespace(procs=2, inflight=8, messages=0), server)
        bench.setup()
        single = bench.produce(1024, 1, 400)
        batch = bench.produce(1024, 32, 1280)
        assert (single["messages"], single["errors"]) == (400, 0)
        assert (batch["messages"], batch["errors"]) == (1280, 0)
        assert single["server_cpu_s"] > 0 and single["p99_us"] >= single["p50_us"] > 0
        stored = compare_systems.tidemq_max_offsets(server, "Bench1k", compare.QUEUES)
        assert sum(stored) == 1680 and min(stored) > 0  # spread over every queue
        read = bench.consume()
        assert read["messages"] == 1680 and "last_error" not in read
        assert read["mb_per_s"] > 0
    finally:
        server.stop()
