"""What a consumer tells an operator through the broker (RocketMQ 4.9's client side of 307, 309):
ConsumerRunningInfo (properties, subscriptions, per-queue ProcessQueueInfo, per-topic RT/TPS)
and ConsumeMessageDirectlyResult; plus the consumer's pull/consume statistics behind them and
MQVersion's names of client versions.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from tidemq.message import MessageExt
from tidemq.queues import MessageQueue

log = logging.getLogger(__name__)

# MQVersion.Version: 16 V3_0_0 pre-releases, then SNAPSHOT/release pairs per x.y.z.
_PRE = [
    "V3_0_0_SNAPSHOT",
    "V3_0_0_ALPHA1",
    *[f"V3_0_0_BETA{i}" for i in range(1, 6)],
    *[f"V3_0_0_BETA{i}{s}" for i in range(6, 10) for s in ("_SNAPSHOT", "")],
    "V3_0_0_FINAL",
]


def _versions() -> list[str]:
    out = list(_PRE)
    patches = {(3, 0): range(1, 16), (3, 1): range(10), (3, 2): range(10)}
    for major, minor in [(3, m) for m in range(10)] + [(x, m) for x in (4, 5) for m in range(10)]:
        zs = patches.get((major, minor), range(1, 10) if major == 3 else range(10))
        for z in zs:
            out += [f"V{major}_{minor}_{z}_SNAPSHOT", f"V{major}_{minor}_{z}"]
    return out


_VERSION_NAMES = _versions()


def version_desc(version: int) -> str:
    """MQVersion.getVersionDesc: the name of a client's version number (399 -> V4_9_3)."""
    if version < 0:
        return "UNKNOWN"
    return _VERSION_NAMES[min(version, len(_VERSION_NAMES) - 1)]


class ConsumeStats:
    """Per-topic pull and consume RT/TPS of one consumer (ConsumerStatsManager): TPS and RT over
    the last minute, failed messages over the last hour."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], deque[tuple[float, int, float]]] = {}
        self._lock = threading.Lock()

    def _add(self, kind: str, topic: str, count: int, rt_ms: float) -> None:
        now = time.monotonic()
        with self._lock:
            q = self._events.setdefault((kind, topic), deque())
            q.append((now, count, rt_ms))
            while q and now - q[0][0] > 3600:
                q.popleft()

    def pulled(self, topic: str, count: int, rt_ms: float) -> None:
        self._add("pull", topic, count, rt_ms)

    def consumed(self, topic: str, count: int, rt_ms: float, ok: bool) -> None:
        self._add("ok" if ok else "failed", topic, count, rt_ms)

    def _window(self, kind: str, topic: str, seconds: float) -> list[tuple[float, int, float]]:
        now = time.monotonic()
        with self._lock:
            return [e for e in self._events.get((kind, topic), ()) if now - e[0] <= seconds]

    def status(self, topic: str) -> dict[str, Any]:
        """ConsumeStatus of ``topic``."""
        pulls, oks = self._window("pull", topic, 60), self._window("ok", topic, 60)
        fails = self._window("failed", topic, 60)
        consumed = oks + fails

        def avg(events: list[tuple[float, int, float]]) -> float:
            return sum(e[2] for e in events) / len(events) if events else 0.0

        return {
            "consumeFailedMsgs": sum(e[1] for e in self._window("failed", topic, 3600)),
            "consumeFailedTPS": sum(e[1] for e in fails) / 60.0,
            "consumeOKTPS": sum(e[1] for e in oks) / 60.0,
            "consumeRT": avg(consumed),
            "pullRT": avg(pulls),
            "pullTPS": sum(e[1] for e in pulls) / 60.0,
        }


def epoch_ms(monotonic_s: float) -> int:
    """A ``time.monotonic()`` instant as epoch milliseconds (0 stays 0: never)."""
    if monotonic_s <= 0:
        return 0
    return int((time.time() - (time.monotonic() - monotonic_s)) * 1000)


def process_queue_info(commit_offset: int, pq: Any) -> dict[str, Any]:
    """ProcessQueueInfo of a push consumer's queue (fields in fastjson's order)."""
    cached = sorted(pq.msgs)
    consuming = sorted(pq.consuming)
    return {
        "cachedMsgCount": len(cached),
        "cachedMsgMaxOffset": cached[-1] if cached else 0,
        "cachedMsgMinOffset": cached[0] if cached else 0,
        "cachedMsgSizeInMiB": pq.msg_size // (1024 * 1024),
        "commitOffset": commit_offset,
        "droped": bool(pq.dropped),
        "lastConsumeTimestamp": epoch_ms(pq.last_consume_time),
        "lastLockTimestamp": epoch_ms(pq.last_lock_time),
        "lastPullTimestamp": epoch_ms(pq.last_pull_time),
        "locked": bool(pq.locked),
        "transactionMsgCount": len(consuming),
        "transactionMsgMaxOffset": consuming[-1] if consuming else 0,
        "transactionMsgMinOffset": consuming[0] if consuming else 0,
        "tryUnlockTimes": 0,
    }


def jstack() -> str:
    """Every thread's stack, as the Java client's jstack option gives the JVM's."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f'"{names.get(ident, ident)}"\n' + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def running_info(
    *,
    properties: dict[str, Any],
    subscriptions: list[dict[str, Any]],
    mq_table: dict[MessageQueue, dict[str, Any]],
    status_table: dict[str, dict[str, Any]],
    with_jstack: bool,
) -> dict[str, Any]:
    """A ConsumerRunningInfo body (encode with :func:`tidemq.mqjson.dumps`)."""
    body: dict[str, Any] = {
        "mqTable": dict(sorted(mq_table.items())),
        "properties": {k: str(v) for k, v in sorted(properties.items())},
        "statusTable": dict(sorted(status_table.items())),
        "subscriptionSet": sorted(subscriptions, key=lambda s: str(s.get("topic"))),
    }
    if with_jstack:
        body["jstack"] = jstack()
    return body


async def consume_directly(
    listener: Callable[[list[MessageExt]], Any],
    msg: MessageExt,
    *,
    orderly: bool,
    run_sync: Callable[[Callable[[list[MessageExt]], Any], list[MessageExt]], Any],
) -> dict[str, Any]:
    """ConsumeMessageDirectlyResult: hand one message to ``listener`` and report how it went."""
    from tidemq.client.push_consumer import ConsumeStatus

    begin = time.monotonic()
    remark = None
    try:
        if inspect.iscoroutinefunction(listener):
            result = await listener([msg])
        else:
            result = await run_sync(listener, [msg])
        # tidemq listeners commit on None (push_consumer._ok), so None is success here.
        if result is None or result is True or result is ConsumeStatus.SUCCESS:
            outcome = "CR_SUCCESS"
        elif result is False or result is ConsumeStatus.RECONSUME_LATER:
            outcome = "CR_LATER"
        else:
            outcome = "CR_RETURN_NULL"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        outcome, remark = "CR_THROW_EXCEPTION", f"{type(exc).__name__}: {exc}"
        log.warning("consumeMessageDirectly of %s: listener raised %s", msg.msg_id, remark)
    return {
        "autoCommit": True,
        "consumeResult": outcome,
        "order": orderly,
        "remark": remark,
        "spentTimeMills": int((time.monotonic() - begin) * 1000),
    }
