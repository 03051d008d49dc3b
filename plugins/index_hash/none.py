"""The ``none`` key index: index off.  Dispatch is accepted and dropped; queries find nothing."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import attrs

from tidemq.index import QueryResult
from tidemq.store import DispatchedPut, DispatchRequest


@attrs.define
class NoIndexOptions:
    """The ``[index.none]`` table: no options (a typo still gets a one-line error)."""


class NoIndex:
    """A :class:`tidemq.index.KeyIndex` that stores nothing, for brokers that never query by key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._covered_ts = 0

    def load(self, last_exit_ok: bool, checkpoint_timestamp_ms: int) -> None:
        self._covered_ts = checkpoint_timestamp_ms

    def dispatch(self, request: DispatchRequest) -> None:
        # Nothing to rebuild after a crash: every dispatched message counts as covered.
        with self._lock:
            self._covered_ts = max(self._covered_ts, request.store_timestamp)

    def dispatch_batch(
        self,
        topic: str,
        queue_id: int,
        properties: Sequence[Mapping[str, str]],
        commit_log_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        store_timestamp: int,
        queue_offset: int,
        sys_flags: Sequence[int],
    ) -> None:
        """:class:`tidemq.store.BatchDispatcher`: one timestamp per put, no request per message."""
        with self._lock:
            if store_timestamp > self._covered_ts:
                self._covered_ts = store_timestamp

    def dispatch_groups(self, puts: Sequence[DispatchedPut]) -> None:
        """:class:`tidemq.store.GroupDispatcher`: a store call's puts, one timestamp (the newest)."""
        newest = max((put[6] for put in puts), default=0)
        with self._lock:
            if newest > self._covered_ts:
                self._covered_ts = newest

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryResult:
        return QueryResult(())

    def flush(self) -> int:
        return self._covered_ts

    def delete_expired(self, min_phy_offset: int) -> None:
        return None

    def shutdown(self) -> None:
        return None
