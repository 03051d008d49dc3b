"""Committed consumer offsets (ConsumerOffsetManager), persisted in ``config/consumerOffset.json``.

Commits only touch memory; the broker writes the file every few seconds and on shutdown, atomically,
so a crash loses at most the last interval (consumers then re-read a few messages, as with RocketMQ).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from tidemq.errors import CorruptDataError
from tidemq.jsonfile import read_offset_table, write_json
from tidemq.names import InvalidNameError, check_group_name, check_stored_topic_name

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager:
    """``topic@group`` -> queue id -> next offset to consume."""

    def __init__(self, path: Path):
        self.path = path
        self._table: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()
        self._dirty = False

    def load(self) -> None:
        table = read_offset_table(self.path, "consumer offsets")
        try:
            for key, queues in table.items():
                topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
                problem = check_stored_topic_name(topic) or check_group_name(group)
                if problem:
                    log.error("%s: offsets of %r ignored: %s", self.path, key[:200], problem)
                    continue
                self._table[key] = {int(q): int(o) for q, o in queues.items()}
        except (TypeError, ValueError, AttributeError) as exc:
            # Saving over it would lose every group's progress: refuse, naming the file.
            raise CorruptDataError(
                f"{self.path} does not hold consumer offsets ({exc}); restore it or move it away"
            ) from exc

    def serialize(self) -> dict[str, Any]:
        with self._lock:
            return {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in self._table.items()}}

    def persist(self, force: bool = False) -> bool:
        """Write the table when it changed since the last write; True when written."""
        if not (self._dirty or force):
            return False
        self._dirty = False
        write_json(self.path, self.serialize())
        return True

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"
        if key not in self._table:  # a new key: names checked once, not on every commit
            problem = check_stored_topic_name(topic) or check_group_name(group)
            if problem:
                raise InvalidNameError(problem)
        with self._lock:
            queues = self._table.setdefault(key, {})
            if queues.get(queue_id) != offset:
                queues[queue_id] = offset
                self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for the queue."""
        return self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {}).get(queue_id, -1)

    def query_all(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {}))

    def topics_of_group(self, group: str) -> set[str]:
        out = set()
        for key in list(self._table):
            topic, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if g == group:
                out.add(topic)
        return out

    def groups_of_topic(self, topic: str) -> set[str]:
        out = set()
        for key in list(self._table):
            t, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if t == topic:
                out.add(g)
        return out

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._table if k.rpartition(TOPIC_GROUP_SEPARATOR)[0] == topic]:
                del self._table[key]
                self._dirty = True

    def remove_group(self, group: str) -> None:
        """Forget every offset of ``group`` (DELETE_SUBSCRIPTIONGROUP with ``removeOffset``)."""
        with self._lock:
            for key in [k for k in self._table if k.rpartition(TOPIC_GROUP_SEPARATOR)[2] == group]:
                del self._table[key]
                self._dirty = True

    def clone_offset(self, src_group: str, dest_group: str, topic: str) -> bool:
        """Copy ``topic``'s offsets of ``src_group`` to ``dest_group`` (cloneOffset); False when
        the source has none."""
        src = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{src_group}")
        if src is None:
            return False
        dest = f"{topic}{TOPIC_GROUP_SEPARATOR}{dest_group}"
        if dest not in self._table:
            problem = check_stored_topic_name(topic) or check_group_name(dest_group)
            if problem:
                raise InvalidNameError(problem)
        with self._lock:
            self._table[dest] = dict(src)
            self._dirty = True
        return True

    def min_offset_in_all_groups(
        self, topic: str, exclude_groups: set[str], min_offsets: dict[int, int]
    ) -> dict[int, int]:
        """Per queue, the lowest offset any group (but ``exclude_groups``) committed on ``topic``,
        ignoring offsets below the queue's minimum (``min_offsets``): queryMinOffsetInAllGroup."""
        out: dict[int, int] = {}
        for key, queues in list(self._table.items()):
            t, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if t != topic or group in exclude_groups:
                continue
            for qid, offset in list(queues.items()):
                if offset >= min_offsets.get(qid, 0):
                    out[qid] = min(offset, out.get(qid, offset))
        return out
