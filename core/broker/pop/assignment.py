"""Server-side assignment (QUERY_ASSIGNMENT) and each group's request mode (SET_MESSAGE_REQUEST_MODE).

RocketMQ 5 keeps ``config/messageRequestMode.json`` (MessageRequestModeSerializeWrapper:
``{"messageRequestModeMap": {topic: {group: {topic, consumerGroup, mode, popShareQueueNum}}}}``);
so does tidemq.  A group in ``POP`` mode is assigned the whole topic of this broker as one queue
with id -1 (every client pops every queue); in ``PULL`` mode each client gets an even share of the
broker's queues (AllocateMessageQueueAveragely over the group's live clients).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tidemq.jsonfile import read_json, write_json

log = logging.getLogger(__name__)

MODES = ("PULL", "POP")
MAX_POP_SHARE_QUEUE_NUM = 1024


class RequestModeTable:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._table: dict[str, dict[str, dict[str, Any]]] = {}

    def load(self) -> None:
        data = read_json(self.path, {}) or {}
        table = data.get("messageRequestModeMap") if isinstance(data, dict) else None
        if isinstance(table, dict):
            self._table = {t: dict(g) for t, g in table.items() if isinstance(g, dict)}

    def set(self, topic: str, group: str, mode: str, pop_share_queue_num: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not PULL or POP")
        if not 0 <= pop_share_queue_num <= MAX_POP_SHARE_QUEUE_NUM:
            raise ValueError(
                f"popShareQueueNum {pop_share_queue_num} is out of range 0..{MAX_POP_SHARE_QUEUE_NUM}"
            )
        self._table.setdefault(topic, {})[group] = {
            "topic": topic,
            "consumerGroup": group,
            "mode": mode,
            "popShareQueueNum": pop_share_queue_num,
        }
        write_json(self.path, {"messageRequestModeMap": self._table})

    def get(self, topic: str, group: str) -> dict[str, Any] | None:
        return self._table.get(topic, {}).get(group)

    def mode(self, topic: str, group: str) -> str:
        entry = self.get(topic, group)
        return str(entry["mode"]) if entry else "PULL"


def allocate_averagely(queues: list[int], cids: list[str], cid: str) -> list[int]:
    """AllocateMessageQueueAveragely: ``cid``'s share of ``queues`` among sorted ``cids``."""
    if cid not in cids or not queues:
        return []
    index = cids.index(cid)
    n, m = len(queues), len(cids)
    mod = n % m
    size = (n // m + (1 if index < mod else 0)) if n > m else 1
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))] if start < n else []
