"""KVConfigManager: the NameServer's namespace -> key -> value store (e.g. ORDER_TOPIC_CONFIG)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from tidemq.jsonfile import read_json, write_json

log = logging.getLogger(__name__)


class KVConfigManager:
    """In memory; persisted to ``path`` (RocketMQ's kvConfig.json layout) when one is given."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self._lock = threading.RLock()
        self._table: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        if self.path is None:
            return
        data = read_json(self.path, default=None)
        if isinstance(data, dict) and isinstance(data.get("configTable"), dict):
            with self._lock:
                self._table = {
                    str(ns): {str(k): str(v) for k, v in kv.items()}
                    for ns, kv in data["configTable"].items()
                    if isinstance(kv, dict)
                }
            log.info("loaded %d KV namespaces from %s", len(self._table), self.path)

    def _persist(self) -> None:
        if self.path is not None:
            write_json(self.path, {"configTable": self._table})

    def put(self, namespace: str, key: str, value: str) -> None:
        with self._lock:
            self._table.setdefault(namespace, {})[key] = value
            self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        with self._lock:
            return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        with self._lock:
            kv = self._table.get(namespace)
            if kv is not None and kv.pop(key, None) is not None:
                if not kv:
                    del self._table[namespace]
                self._persist()

    def namespace(self, namespace: str) -> dict[str, str] | None:
        with self._lock:
            kv = self._table.get(namespace)
            return dict(kv) if kv else None
