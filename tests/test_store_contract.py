"""The shared store contract, run against every built-in store plugin."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tidemq.store import MessageStore
from tidemq.testing.store_contract import StoreContract, build_store

# Small files so the suite crosses commit-log and ConsumeQueue file boundaries.
SMALL_MMAP = {"commitlog_file_size": 64 * 1024, "consumequeue_entries": 16}


@pytest.fixture(params=["mmap", "mmap-transient", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], MessageStore]:
    if request.param == "memory":
        return lambda: build_store("memory", tmp_path)
    options = dict(SMALL_MMAP, transient_store_pool=request.param == "mmap-transient")
    return lambda: build_store("mmap", tmp_path / "store", store_options=options)


class TestStoreContract(StoreContract):
    pass
