"""Contract tests every key index plugin (role ``index``) must pass.

A plugin's test module subclasses :class:`KeyIndexContract` and names its plugin::

    from tidemq.testing.index_contract import KeyIndexContract

    class TestSqliteIndex(KeyIndexContract):
        index_name = "sqlite"
        index_options = {"cache_pages": 16}

pytest then runs every ``test_*`` method against it.  An index that keeps nothing on purpose
(``none``) sets ``indexes_keys = False``: its queries must then answer empty, never fail.  Override
:meth:`KeyIndexContract.plugin_manager` to build the index from a manager holding only your plugin.

What the contract asks of an index, beyond :class:`tidemq.index.KeyIndex`:

* every ``KEYS`` entry and the ``UNIQ_KEY`` of a message are found by ``query(topic, key, ...)``,
  scoped by topic, newest first, each offset once, at most ``max_num``;
* the time range is honoured to within one second (the broker re-checks exact times);
* messages with a rolled-back transaction type are not indexed;
* ``flush()`` returns a store timestamp no older than the last message dispatched before it;
* after ``shutdown()`` a new instance on the same directory answers the same;
* after an abnormal stop, ``load(False, checkpoint)`` followed by re-dispatching the messages
  stored since the checkpoint (or all of them: RocketMQ re-dispatches whole commit-log files)
  finds every key again, each offset once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tidemq.index import KeyIndex
from tidemq.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from tidemq.plugins import PluginManager, get_plugin_manager
from tidemq.store import DispatchRequest

#: A fixed store time base (2026-01-01T00:00:00Z) so time-range tests do not depend on the clock.
T0 = 1_767_225_600_000
FOREVER = 2**63 - 1


def request(
    offset: int,
    ts: int,
    *,
    topic: str = "TopicTest",
    keys: str = "",
    uniq_key: str | None = None,
    sys_flag: int = 0,
    size: int = 100,
) -> DispatchRequest:
    """A dispatch request as a store hands it over (only the fields an index reads matter)."""
    return DispatchRequest(
        topic=topic,
        queue_id=0,
        commit_log_offset=offset,
        msg_size=size,
        tags_code=0,
        store_timestamp=ts,
        queue_offset=offset // size,
        keys=keys,
        uniq_key=uniq_key,
        sys_flag=sys_flag,
    )


def keyed_messages(
    count: int, *, start_ts: int = T0, step_ms: int = 10, prefix: str = "K"
) -> list[DispatchRequest]:
    """``count`` messages, 100 bytes apart in the commit log, each with one key and a unique key."""
    return [
        request(i * 100, start_ts + i * step_ms, keys=f"{prefix}{i}", uniq_key=f"U{prefix}{i:08d}")
        for i in range(count)
    ]


class IndexBuilder:
    """Creates index instances of one plugin on one data directory, as a restarted broker would."""

    def __init__(self, manager: PluginManager, name: str, options: dict[str, Any], data_dir: Path) -> None:
        self.manager = manager
        self.name = name
        self.options = options
        self.data_dir = data_dir
        self._built: list[KeyIndex] = []

    def __call__(self) -> KeyIndex:
        index = self.manager.create("index", self.name, options=self.options, data_dir=self.data_dir)
        self._built.append(index)
        return index

    def abandon(self, index: KeyIndex) -> None:
        """Forget ``index`` without shutting it down: the process it stood for has died."""
        self._built.remove(index)

    def shutdown_all(self) -> None:
        for index in self._built:
            index.shutdown()
        self._built.clear()


class KeyIndexContract:
    """Subclass with ``index_name`` (and ``index_options``) set to run the contract."""

    index_name: ClassVar[str] = ""
    index_options: ClassVar[dict[str, Any]] = {}
    #: False for an index that stores nothing (queries must answer empty).
    indexes_keys: ClassVar[bool] = True
    #: Messages dispatched while two threads query (test_concurrent_dispatch_and_query); an index
    #: configured with tiny files (every query walks every file) may take fewer, keeping a few rolls.
    concurrent_messages: ClassVar[int] = 1500

    def plugin_manager(self) -> PluginManager:
        return get_plugin_manager()

    # ------------------------------------------------------------------ fixtures
    @pytest.fixture
    def data_dir(self, tmp_path: Path) -> Path:
        return tmp_path / "broker"

    @pytest.fixture
    def new_index(self, data_dir: Path) -> Iterator[IndexBuilder]:
        """Builds unloaded indexes on ``data_dir``; each is shut down afterwards unless abandoned."""
        builder = IndexBuilder(self.plugin_manager(), self.index_name, self.index_options, data_dir)
        yield builder
        builder.shutdown_all()

    @pytest.fixture
    def index(self, new_index: IndexBuilder) -> KeyIndex:
        idx = new_index()
        idx.load(True, 0)
        return idx

    def expect(self, offsets: list[int]) -> tuple[int, ...]:
        """What a query must answer: ``offsets`` for a real index, nothing for an index that is off."""
        return tuple(offsets) if self.indexes_keys else ()

    # ------------------------------------------------------------------ basics
    def test_implements_key_index(self, index: KeyIndex) -> None:
        assert isinstance(index, KeyIndex)

    def test_key_found_newest_first(self, index: KeyIndex) -> None:
        for i in range(3):
            index.dispatch(request(i * 100, T0 + i * 1000, keys="order-1"))
        index.dispatch(request(300, T0 + 3000, keys="order-2"))
        got = index.query("TopicTest", "order-1", 32, 0, FOREVER)
        assert got.phy_offsets == self.expect([200, 100, 0])

    def test_every_key_and_the_unique_key_are_indexed(self, index: KeyIndex) -> None:
        index.dispatch(request(0, T0, keys="a  b c", uniq_key="7F000001000000000000ABCD"))
        for key in ("a", "b", "c", "7F000001000000000000ABCD"):
            assert index.query("TopicTest", key, 32, 0, FOREVER).phy_offsets == self.expect([0]), key
        assert index.query("TopicTest", "a b", 32, 0, FOREVER).phy_offsets == ()
        assert index.query("TopicTest", "", 32, 0, FOREVER).phy_offsets == ()

    def test_keys_are_scoped_by_topic(self, index: KeyIndex) -> None:
        index.dispatch(request(0, T0, topic="A", keys="same"))
        index.dispatch(request(100, T0 + 1, topic="B", keys="same"))
        assert index.query("A", "same", 32, 0, FOREVER).phy_offsets == self.expect([0])
        assert index.query("B", "same", 32, 0, FOREVER).phy_offsets == self.expect([100])
        assert index.query("C", "same", 32, 0, FOREVER).phy_offsets == ()

    def test_missing_key_answers_empty(self, index: KeyIndex) -> None:
        for req in keyed_messages(50):
            index.dispatch(req)
        for key in ("K50", "k1", "nope", "K1 ", "UK00000001x"):
            assert index.query("TopicTest", key, 32, 0, FOREVER).phy_offsets == ()

    def test_empty_index_answers_empty(self, index: KeyIndex) -> None:
        assert index.query("TopicTest", "anything", 32, 0, FOREVER).phy_offsets == ()

    def test_max_num_limits_the_answer(self, index: KeyIndex) -> None:
        for i in range(20):
            index.dispatch(request(i * 100, T0 + i, keys="hot"))
        got = index.query("TopicTest", "hot", 5, 0, FOREVER).phy_offsets
        assert got == self.expect([1900, 1800, 1700, 1600, 1500])
        assert index.query("TopicTest", "hot", 0, 0, FOREVER).phy_offsets == ()

    def test_each_offset_once(self, index: KeyIndex) -> None:
        # The same key twice in KEYS, and equal to the unique key: one message, one answer.
        index.dispatch(request(0, T0, keys="dup dup", uniq_key="dup"))
        assert index.query("TopicTest", "dup", 32, 0, FOREVER).phy_offsets == self.expect([0])

    def test_time_range(self, index: KeyIndex) -> None:
        for i in range(3):
            index.dispatch(request(i * 100, T0 + i * 10_000, keys="k"))
        assert index.query("TopicTest", "k", 32, T0 + 10_000, T0 + 10_000).phy_offsets == self.expect([100])
        assert index.query("TopicTest", "k", 32, T0 + 5_000, FOREVER).phy_offsets == self.expect([200, 100])
        assert index.query("TopicTest", "k", 32, 0, T0 + 15_000).phy_offsets == self.expect([100, 0])
        assert index.query("TopicTest", "k", 32, T0 + 21_000, FOREVER).phy_offsets == ()
        assert index.query("TopicTest", "k", 32, 0, T0 - 1_001).phy_offsets == ()
        assert index.query("TopicTest", "k", 32, T0 + 20_000, T0).phy_offsets == ()  # begin after end

    def test_transaction_types(self, index: KeyIndex) -> None:
        index.dispatch(request(0, T0, keys="half", sys_flag=TRANSACTION_PREPARED_TYPE))
        index.dispatch(request(100, T0 + 1, keys="done", sys_flag=TRANSACTION_COMMIT_TYPE))
        index.dispatch(request(200, T0 + 2, keys="undone", sys_flag=TRANSACTION_ROLLBACK_TYPE))
        assert index.query("TopicTest", "half", 32, 0, FOREVER).phy_offsets == self.expect([0])
        assert index.query("TopicTest", "done", 32, 0, FOREVER).phy_offsets == self.expect([100])
        assert index.query("TopicTest", "undone", 32, 0, FOREVER).phy_offsets == ()

    # ------------------------------------------------------------------ durability
    def test_flush_covers_what_was_dispatched(self, index: KeyIndex) -> None:
        index.dispatch(request(0, T0 + 500, keys="a"))
        first = index.flush()
        assert first >= T0 + 500
        index.dispatch(request(100, T0 + 900))  # no keys: still covered
        assert index.flush() >= T0 + 900
        assert index.flush() >= first

    def test_reload_after_clean_shutdown(self, new_index: IndexBuilder) -> None:
        reqs = keyed_messages(100)
        idx = new_index()
        idx.load(True, 0)
        for req in reqs:
            idx.dispatch(req)
        checkpoint = idx.flush()
        idx.shutdown()

        again = new_index()
        again.load(True, checkpoint)
        for i in (0, 42, 99):
            assert again.query("TopicTest", f"K{i}", 32, 0, FOREVER).phy_offsets == self.expect([i * 100])
            assert again.query("TopicTest", f"UK{i:08d}", 32, 0, FOREVER).phy_offsets == self.expect(
                [i * 100]
            )
        # New keys go on after the reloaded ones.
        again.dispatch(request(10_000, T0 + 5_000, keys="K0"))
        assert again.query("TopicTest", "K0", 32, 0, FOREVER).phy_offsets == self.expect([10_000, 0])

    @pytest.mark.parametrize("redispatch_all", [False, True], ids=["since-checkpoint", "everything"])
    def test_recovery_after_abnormal_stop(self, new_index: IndexBuilder, redispatch_all: bool) -> None:
        reqs = keyed_messages(200, step_ms=50)
        idx = new_index()
        idx.load(True, 0)
        for req in reqs[:120]:
            idx.dispatch(req)
        checkpoint = idx.flush()
        for req in reqs[120:]:
            idx.dispatch(req)
        # The process dies here: no flush, no shutdown.  A new instance opens the same files.
        new_index.abandon(idx)
        again = new_index()
        again.load(False, checkpoint)
        redo = reqs if redispatch_all else [r for r in reqs if r.store_timestamp >= checkpoint]
        for req in redo:
            again.dispatch(req)
        for i in range(0, 200, 7):
            assert again.query("TopicTest", f"K{i}", 32, 0, FOREVER).phy_offsets == self.expect([i * 100]), i
            assert again.query("TopicTest", f"UK{i:08d}", 32, 0, FOREVER).phy_offsets == self.expect(
                [i * 100]
            ), i
        assert again.flush() >= reqs[-1].store_timestamp

    def test_delete_expired_keeps_live_keys(self, index: KeyIndex) -> None:
        for req in keyed_messages(30):
            index.dispatch(req)
        index.delete_expired(0)
        assert index.query("TopicTest", "K29", 32, 0, FOREVER).phy_offsets == self.expect([2900])
        index.delete_expired(10**12)  # everything expired: never an error
        index.query("TopicTest", "K29", 32, 0, FOREVER)

    # ------------------------------------------------------------------ threads
    def test_concurrent_dispatch_and_query(self, index: KeyIndex) -> None:
        n = self.concurrent_messages
        reqs = keyed_messages(n, step_ms=1)
        errors: list[BaseException] = []
        done = threading.Event()

        def reader() -> None:
            try:
                while not done.is_set():
                    for i in (0, n // 2, n - 1):
                        got = index.query("TopicTest", f"K{i}", 8, 0, FOREVER).phy_offsets
                        assert got in ((), self.expect([i * 100]))
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in readers:
            t.start()
        try:
            for req in reqs:
                index.dispatch(req)
                if req.commit_log_offset % 50_000 == 0:
                    index.flush()
        finally:
            done.set()
            for t in readers:
                t.join()
        assert not errors, errors[0]
        for i in range(0, n, 47):
            assert index.query("TopicTest", f"K{i}", 8, 0, FOREVER).phy_offsets == self.expect([i * 100])
