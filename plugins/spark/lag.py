"""Kafka's lag metrics (``min/max/avgOffsetsBehindLatest``) for streaming queries reading ``tidemq``.

PySpark's Python stream readers have no custom-metrics hook, so the figures are computed from
the query progress instead: the source reports its latest offsets (``reportLatestOffset``, PySpark
>= 4.2, shown as the progress source's ``latestOffset``), and the lag of each queue is that
minus the micro-batch's ``endOffset``.  :class:`LagListener` does this for every progress event::

    listener = LagListener()
    spark.streams.addListener(listener)
    ...
    listener.lag(query.id)  # {"minOffsetsBehindLatest": 0, "maxOffsetsBehindLatest": 40, ...}
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)

MIN, MAX, AVG = "minOffsetsBehindLatest", "maxOffsetsBehindLatest", "avgOffsetsBehindLatest"


def _offsets(value: Any) -> dict[tuple[str, str], int] | None:
    """``{topic: {"broker:queueId": offset}}`` (JSON text or decoded) flattened; None if not that shape."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    out: dict[tuple[str, str], int] = {}
    for topic, queues in value.items():
        if not isinstance(queues, Mapping):
            return None
        for name, offset in queues.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                return None
            out[(str(topic), str(name))] = offset
    return out


def _field(source: Any, name: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def queue_lags(progress_source: Any) -> dict[tuple[str, str], int] | None:
    """Offsets behind latest per (topic, queue) of one progress source, or None without a latestOffset."""
    latest = _offsets(_field(progress_source, "latestOffset"))
    end = _offsets(_field(progress_source, "endOffset"))
    if latest is None or end is None:
        return None
    # a queue the batch has not reached yet (new queue) is behind from offset 0
    return {q: max(0, v - end.get(q, 0)) for q, v in latest.items()}


def _summary(lags: Mapping[Any, int]) -> dict[str, Any]:
    if not lags:
        return {}
    values = list(lags.values())
    return {MIN: min(values), MAX: max(values), AVG: sum(values) / len(values)}


def offsets_behind_latest(progress_source: Any) -> dict[str, Any]:
    """Kafka's ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` (ints) and ``avgOffsetsBehindLatest``
    (float) of one progress source (a ``SourceProgress`` or a ``lastProgress["sources"]`` dict);
    ``{}`` when the source reports no latestOffset or is not a tidemq source."""
    lags = queue_lags(progress_source)
    return _summary(lags) if lags is not None else {}


def query_lag(sources: Iterable[Any]) -> dict[str, Any]:
    """The figures over every tidemq source of one progress (queues of all of them together)."""
    lags: dict[tuple[str, str], int] = {}
    for source in sources:
        lags.update(queue_lags(source) or {})
    return _summary(lags)


class LagListener(StreamingQueryListener):
    """Computes the lag figures on every progress event and keeps the latest per query."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.level = level
        self._lock = threading.Lock()
        self._lags: dict[str, dict[str, Any]] = {}

    def lag(self, query_id: Any) -> dict[str, Any]:
        """The figures of the latest progress of ``query_id`` (a query's ``id``); ``{}`` before any."""
        with self._lock:
            return dict(self._lags.get(str(query_id), {}))

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        figures = query_lag(progress.sources)
        if not figures:
            return
        with self._lock:
            self._lags[str(progress.id)] = figures
        log.log(
            self.level,
            "query %s batch %s: offsets behind latest min %d max %d avg %.1f",
            progress.id,
            progress.batchId,
            figures[MIN],
            figures[MAX],
            figures[AVG],
        )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


__all__ = ["LagListener", "offsets_behind_latest", "query_lag"]
