"""Options of the ``tidemq`` source and sink (modelled on Spark's Kafka connector) and offset JSON.

Offset JSON names each queue as ``"<broker name>:<queue id>"`` under its topic; values are
ConsumeQueue offsets (the next message to read), ``-2`` for earliest and ``-1`` for latest::

    {"TopicA": {"broker-a:0": 23, "broker-a:1": -2}, "TopicB": {"broker-b:0": -1}}

Queues a JSON does not name start at earliest (``startingOffsets``) or end at latest
(``endingOffsets``).  Streaming checkpoints store offsets in the same shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from tidemq.errors import TidemqError

EARLIEST = -2
LATEST = -1
DEFAULT_GROUP = "tidemq-spark"
DEFAULT_PRODUCER_GROUP = "tidemq-spark-writer"


class TidemqSparkError(TidemqError):
    """A tidemq Spark source or sink was misconfigured or hit unreadable data (one-line message)."""


class DataLossError(TidemqSparkError):
    """Offsets the query needs were already cleaned from the broker (``failOnDataLoss``)."""


@attrs.frozen(order=True)
class QueueKey:
    """One queue of one topic on one broker (by broker name: addresses may change)."""

    topic: str
    broker: str
    queue_id: int

    @property
    def name(self) -> str:
        return f"{self.broker}:{self.queue_id}"


Offsets = dict[QueueKey, int]


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key in sorted(offsets):
        out.setdefault(key.topic, {})[key.name] = int(offsets[key])
    return out


def parse_queue_name(topic: str, name: str, what: str) -> QueueKey:
    broker, sep, qid = str(name).rpartition(":")
    if not sep or not broker or not qid.isdigit():
        raise TidemqSparkError(f"{what}: queue {name!r} of topic {topic!r} is not '<broker name>:<queue id>'")
    return QueueKey(topic, broker, int(qid))


def offsets_from_json(data: Any, what: str) -> Offsets:
    """Parse offset JSON (a str or an already-decoded dict) into ``{QueueKey: offset}``."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise TidemqSparkError(f"{what} is neither earliest/latest nor JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TidemqSparkError(f'{what} JSON must be an object like {{"Topic": {{"broker-a:0": 5}}}}')
    out: Offsets = {}
    for topic, queues in data.items():
        if not isinstance(queues, dict):
            raise TidemqSparkError(f"{what}: topic {topic!r} must map queue names to offsets")
        for name, offset in queues.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise TidemqSparkError(
                    f"{what}: offset of {topic} {name} must be an integer >= 0, -2 (earliest) or -1 (latest)"
                )
            out[parse_queue_name(topic, name, what)] = offset
    return out


def rate_limit(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Cap the total offsets of a micro-batch at ``max_rows``, shared in proportion to each queue's backlog."""
    backlog = {k: end[k] - begin.get(k, 0) for k in end}
    total = sum(v for v in backlog.values() if v > 0)
    if total <= max_rows:
        return end
    out = dict(end)
    budget = max_rows
    taken: dict[QueueKey, int] = {}
    for k in sorted(backlog):
        lag = backlog[k]
        if lag <= 0:
            continue
        take = min(lag, max(1, max_rows * lag // total), budget)
        taken[k] = take
        budget -= take
    # Rounding down leaves rows of the budget unused: hand them out, most backlog first.
    for k in sorted(taken, key=lambda q: (taken[q] - backlog[q], q)):
        if budget <= 0:
            break
        more = min(backlog[k] - taken[k], budget)
        taken[k] += more
        budget -= more
    for k, take in taken.items():
        out[k] = begin.get(k, 0) + take
    return out


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise TidemqSparkError(f"option {key} = {raw!r} is not true or false")


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int = 0) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise TidemqSparkError(f"option {key} = {raw!r} is not an integer") from None
    if value < minimum:
        raise TidemqSparkError(f"option {key} = {value} must be >= {minimum}")
    return value


def _require(options: Mapping[str, str], key: str, where: str) -> str:
    value = options.get(key)
    if value is None or not str(value).strip():
        raise TidemqSparkError(f"{where} needs option {key!r}")
    return str(value).strip()
