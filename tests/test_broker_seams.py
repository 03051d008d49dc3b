"""The broker's seams (issue 35): what the composition root hands out, and what the kernel names.

* StoreIntrospection: the figures admin, runtime info and metrics read, from both built-in stores;
* the metrics exporter gets a read-only figures view, not the broker;
* the kernel's hook contract and published context import nothing of the broker's services (the
  import circle hookspecs -> broker.context -> broker services -> broker.context is gone).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.broker import Broker
from tidemq.config import DEFAULT_PLUGINS, BrokerSettings, Config, compose
from tidemq.flush import FlushStatistics
from tidemq.message import tags_hash_code
from tidemq.store import MessageStore, StoreIntrospection, store_introspection
from tidemq.testing.store_contract import build_store, message, put

SMALL_MMAP = {"commitlog_file_size": 64 * 1024, "consumequeue_entries": 16}


@pytest.fixture(params=["mmap", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MessageStore]:
    options = SMALL_MMAP if request.param == "mmap" else None
    s = build_store(request.param, tmp_path / "store", store_options=options)
    assert s.load()
    s.start()
    yield s
    s.shutdown()


def test_both_stores_have_the_capability(store: MessageStore) -> None:
    assert isinstance(store, StoreIntrospection)
    assert store_introspection(store) is store
    assert store_introspection(object()) is None  # a store without it: the callers fall back


def test_queue_entries_name_the_stored_records(store: MessageStore) -> None:
    assert isinstance(store, StoreIntrospection)
    first = put(store, message("Intro", b"a" * 10, TAGS="red"))
    second = put(store, message("Intro", b"b" * 20, TAGS="blue"))
    phy, size, code = store.queue_entry("Intro", 0, 1) or (-1, -1, -1)
    assert phy == second.wrote_offset == store.get_commit_log_offset("Intro", 0, 1)
    assert size == second.wrote_bytes
    assert code == tags_hash_code("blue")
    assert store.queue_entry("Intro", 0, 0) == (first.wrote_offset, first.wrote_bytes, tags_hash_code("red"))
    # Outside the queue, or a queue that does not exist: nothing.
    assert store.queue_entry("Intro", 0, 2) is None
    assert store.queue_entry("Intro", 0, -1) is None
    assert store.queue_entry("Intro", 5, 0) is None
    assert store.queue_entry("NoSuchTopic", 0, 0) is None


def test_a_sync_flushed_put_is_dispatched_and_on_disk(store: MessageStore) -> None:
    assert isinstance(store, StoreIntrospection)
    put(store, message("Intro"))
    end = store.get_max_phy_offset()
    # The put resolved under the sync flush policy: its record is dispatched and flushed.
    assert store.dispatched_offset() == end
    assert store.flushed_offset() == end
    assert store.clean_expired_queues() == 0  # nothing expired: no queue dropped


def test_flush_statistics_count_the_rounds(store: MessageStore) -> None:
    assert isinstance(store, StoreIntrospection)
    stats = store.flush_statistics()
    if stats is None:  # the memory store keeps nothing on disk
        assert type(store).__name__ == "MemoryMessageStore"
        return
    assert isinstance(stats, FlushStatistics)
    before = stats.flush_rounds, stats.requests
    put(store, message("Intro"))
    assert stats.flush_rounds > before[0]
    assert stats.requests > before[1]
    assert stats.batch_sizes is not None  # group commit (sync flush) batches


def _imports(module: str) -> set[str]:
    """Every module ``module``'s source imports, TYPE_CHECKING blocks included."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_hook_contract_names_no_broker_module() -> None:
    assert not {m for m in _imports("tidemq.hookspecs") if m.startswith("tidemq.broker")}


def test_the_published_context_imports_no_broker_service() -> None:
    """Only the broker's value types, for type checkers; no module that takes a BrokerContext back."""
    broker_modules = {m for m in _imports("tidemq.context") if m.startswith("tidemq.broker")}
    assert broker_modules <= {"tidemq.broker.clients", "tidemq.broker.stats", "tidemq.broker.subscriptions"}
    for module in broker_modules:
        assert not {m for m in _imports(module) if m in ("tidemq.context", "tidemq.broker.context")}


def test_the_metrics_exporter_gets_a_read_only_view(tmp_path: Path) -> None:
    settings = BrokerSettings(listen="127.0.0.1:0", namesrv=[], data_dir=str(tmp_path))
    broker = Broker(compose(Config(broker=settings, plugins=dict(DEFAULT_PLUGINS))))
    figures = broker.figures
    assert figures.store is broker.store and figures.stats is broker.stats
    assert figures.metrics_companions is broker.metrics_companions  # standalone adds its NameServer
    broker.acl_refusals = 3
    assert figures.acl_refusals == 3  # read through, not copied
    for member in ("topics", "groups", "transactions", "spawn", "client"):
        assert not hasattr(figures, member), member
    with pytest.raises(AttributeError):
        figures.store = broker.store  # type: ignore[misc]
