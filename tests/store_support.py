"""An mmap store on a fixed clock for the store's byte-level tests, and its files as bytes."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from tidemq.testing.store_contract import build_store

#: The stores' first timestamp, in ms: each put's store timestamp is the next ms after it.
T0 = 1_764_300_000_123


def open_fixed_clock_store(path: Path, flush: str, monkeypatch: pytest.MonkeyPatch, file_size: int) -> Any:
    """An mmap store at ``path`` (``flush``: "sync" or "async"), started, with commit-log files of
    ``file_size`` bytes and a clock that gives each timestamp the next ms from :data:`T0`, so two
    stores fed the same puts write the same bytes."""
    import tidemq_store_mmap.store as store_module

    clock = iter(range(T0, T0 + 10_000_000))
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time_ns=lambda: next(clock) * 1_000_000))
    store = build_store(
        "mmap",
        path,
        flush=flush,
        store_options={
            "store_host": "10.1.2.3:10911",
            "commitlog_file_size": file_size,
            "consumequeue_entries": 10_000,
        },
    )
    assert store.load()
    store.start()
    return store


def files_of(root: Path) -> dict[str, bytes]:
    """The commit log's and consume queues' files under a store's ``root``, by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for sub in ("commitlog", "consumequeue")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }
