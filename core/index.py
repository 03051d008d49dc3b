"""Key index contract (role ``index``): lookups of messages by key and unique id."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from tidemq.store import DispatchRequest


@attrs.frozen
class QueryResult:
    """Commit-log offsets of candidate messages, newest first; the broker re-checks the key."""

    phy_offsets: tuple[int, ...]
    last_update_timestamp: int = 0
    last_update_phy_offset: int = 0


@runtime_checkable
class KeyIndex(Protocol):
    """Built from the store's dispatch, queried by QUERY_MESSAGE and admin tools."""

    def load(self, last_exit_ok: bool, checkpoint_timestamp_ms: int) -> None:
        """Open index files; after an abnormal stop drop those newer than the checkpoint."""

    def dispatch(self, request: DispatchRequest) -> None:
        """Index the KEYS and UNIQ_KEY of one stored message."""

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryResult:
        """Offsets of messages whose key may be ``key`` within the time range (ms)."""

    def flush(self) -> int:
        """Flush index files; returns the store timestamp covered (for the checkpoint)."""

    def delete_expired(self, min_phy_offset: int) -> None:
        """Delete index files whose entries all lie below the commit log's minimum offset."""

    def shutdown(self) -> None: ...
