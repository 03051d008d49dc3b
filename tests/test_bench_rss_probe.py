"""bench/rss_probe.py, what bench/load_test.py --probe reads: smaps by mapping, and the probe thread
a process runs when started with bench/rss_site on its PYTHONPATH (docs/operations.md, "Memory")."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import rss_probe  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_smaps_kinds_add_up_to_the_anonymous_memory() -> None:
    # An anonymous mapping of its own (a large bytearray may come from the heap instead: glibc
    # raises its mmap threshold after a large free, so in a process that ran other tests it did).
    ballast = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for page in range(0, len(ballast), 4096):
        ballast[page] = 1
    out = rss_probe.smaps_breakdown(os.getpid())
    total = sum(out["anon_kib_by_kind"].values())
    status = out["status_kib"]["RssAnon"]
    assert status > 8 << 10
    assert abs(total - status) <= max(1024, status // 20), (total, status)  # read a moment apart
    assert out["largest_anon_mmaps_kib"][0]["anon_kib"] >= 8 << 10
    ballast.close()


def _probe_child(tmp_path: Path, tracemalloc_frames: int) -> tuple[dict[str, Any], dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(BENCH / "rss_site"), TIDEMQ_RSS_PROBE_DIR=str(tmp_path))
    env["TIDEMQ_RSS_TRACEMALLOC"] = str(tracemalloc_frames)
    code = "import time\nkept = [bytes(100) for _ in range(20000)]\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        time.sleep(0.5)
        start = rss_probe.request(tmp_path, "start", timeout=30)
        idle = rss_probe.request(tmp_path, "idle", trim=True, timeout=30)
    finally:
        child.kill()
        child.wait()
    assert "error" not in start and "error" not in idle, (start, idle)
    assert "rss-probe" in start["threads"] and start["malloc"]["arena_count"] >= 1
    assert idle["malloc_trim_anon_kib"]["after"] > 0
    return start, idle


def test_the_probe_thread_answers_in_a_process_started_with_rss_site(tmp_path: Path) -> None:
    start, _ = _probe_child(tmp_path, 0)
    assert start["pymalloc"]["arenas_allocated_current"] >= 1  # pymalloc reports only untraced
    assert "tracemalloc" not in start


def test_the_probe_names_python_allocations_by_line_under_tracemalloc(tmp_path: Path) -> None:
    start, idle = _probe_child(tmp_path, 1)
    assert any(s["count"] >= 20000 for s in start["tracemalloc"]["top_by_line"])  # the child's list
    assert "growth_by_line" in idle["tracemalloc"]
