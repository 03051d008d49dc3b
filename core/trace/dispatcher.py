"""The asynchronous trace dispatcher (RocketMQ's AsyncTraceDispatcher).

Recorders :meth:`~TraceDispatcher.append` contexts to a bounded queue without waiting; a
background task takes them in batches (up to ``batch_size`` contexts, about ``max_msg_size``
bytes of text or ``max_wait_s`` after the first one) and sends each batch as one message to the
trace topic through an internal producer of group ``_INNER_TRACE_PRODUCER-<group>-<kind>`` that
shares the traced client's instance (its connections and routes).  The message's KEYS are the
traced message ids and keys, so a query by key on the trace topic finds it.

Tracing never slows or fails the traced client: a full queue drops the context (counted in
:attr:`TraceDispatcher.dropped`), a failed trace send is logged and counted in
:attr:`TraceDispatcher.failed`; neither raises.  Shutdown sends what is queued, within a bounded
wait.  Every batch is also handed to the ``tidemq_trace_dispatched`` hook when a plugin
implements it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from tidemq.trace.format import DEFAULT_TRACE_TOPIC, TraceContext, encode_context, trace_keys

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.producer import Producer

log = logging.getLogger(__name__)

#: The trace producer's group prefix (TraceConstants.GROUP_NAME_PREFIX).
GROUP_NAME_PREFIX = "_INNER_TRACE_PRODUCER"
#: Most characters of KEYS in one trace message (AsyncTraceDispatcher's MAX_MSG_KEY_SIZE).
MAX_MSG_KEY_SIZE = 32767 - 10000
#: Seconds between two log lines about dropped or failed traces.
LOG_EVERY_S = 10.0


class TraceDispatcher:
    """Batches trace contexts and sends them to the trace topic in the background.

    ``kind`` is ``"PRODUCE"`` or ``"CONSUME"`` (TraceDispatcher.Type), part of the internal
    producer's group name.
    """

    def __init__(
        self,
        group: str,
        kind: str,
        instance: ClientInstance,
        *,
        trace_topic: str | None = None,
        queue_size: int = 2048,
        batch_size: int = 100,
        max_msg_size: int = 128_000,
        max_wait_s: float = 0.1,
        send_timeout: float = 5.0,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"trace queue size = {queue_size} must be >= 1")
        self.group = group
        self.kind = kind
        self.instance = instance
        self.trace_topic = trace_topic or DEFAULT_TRACE_TOPIC
        self.queue_size = queue_size
        self.batch_size = max(1, batch_size)
        self.max_msg_size = max_msg_size
        self.max_wait_s = max_wait_s
        self.send_timeout = send_timeout
        #: Contexts dropped because the queue was full.
        self.dropped = 0
        #: Contexts sent to the trace topic.
        self.sent = 0
        #: Contexts whose trace message could not be sent.
        self.failed = 0
        self._queue: asyncio.Queue[TraceContext] = asyncio.Queue(maxsize=queue_size)
        self._producer: Producer | None = None
        self._worker: asyncio.Task[None] | None = None
        self._busy = False
        self._closing = False
        self._last_log = {"drop": 0.0, "fail": 0.0}

    @property
    def producer_group(self) -> str:
        return f"{GROUP_NAME_PREFIX}-{self.group}-{self.kind}"

    # ------------------------------------------------------------------ recording
    def append(self, ctx: TraceContext) -> bool:
        """Queue ``ctx`` without waiting; ``False`` (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(ctx)
        except asyncio.QueueFull:
            self.dropped += 1
            self._log_limited(
                "drop", "trace queue full (%d): %d context(s) dropped so far", self.queue_size, self.dropped
            )
            return False
        return True

    def _log_limited(self, what: str, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_log[what] >= LOG_EVERY_S:
            self._last_log[what] = now
            log.warning(fmt, *args)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the internal producer (on the traced client's instance) and the batching task."""
        if self._worker is not None:
            return
        from tidemq.client.producer import Producer  # the producer module imports the recorders

        self._producer = Producer(
            self.producer_group,
            instance=self.instance,
            send_timeout=self.send_timeout,
            max_message_size=self.max_msg_size,
        )
        await self._producer.start()
        self._closing = False
        self._worker = asyncio.create_task(self._run(), name=f"tidemq-trace-{self.group}")

    async def shutdown(self, timeout: float = 3.0) -> None:
        """Send what is queued (waiting at most ``timeout`` seconds), then stop."""
        if self._worker is None:
            return
        self._closing = True
        deadline = time.monotonic() + timeout
        while (self._busy or not self._queue.empty()) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        left = self._queue.qsize()
        if left:
            log.warning("trace dispatcher of %s stopped with %d context(s) unsent", self.group, left)
        self._worker.cancel()
        await asyncio.gather(self._worker, return_exceptions=True)
        self._worker = None
        if self._producer is not None:
            await self._producer.shutdown()
            self._producer = None

    # ------------------------------------------------------------------ batching and sending
    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            self._busy = True
            try:
                await self._send(await self._collect(first))
            except Exception:  # the worker must outlive anything a batch does
                log.exception("trace dispatcher of %s failed on a batch", self.group)
            finally:
                self._busy = False

    async def _collect(self, first: TraceContext) -> list[tuple[TraceContext, str]]:
        """``first`` and what follows it, up to the count, size or time limit."""
        batch = [(first, encode_context(first))]
        size, keys = len(batch[0][1]), sum(len(k) + 1 for k in trace_keys(first))
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.batch_size and size < self.max_msg_size - 10_000 and keys < MAX_MSG_KEY_SIZE:
            if self._queue.empty():
                remaining = deadline - time.monotonic()
                if self._closing or remaining <= 0:
                    break
                try:
                    ctx = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                ctx = self._queue.get_nowait()
            text = encode_context(ctx)
            batch.append((ctx, text))
            size += len(text)
            keys += sum(len(k) + 1 for k in trace_keys(ctx))
        return batch

    async def _send(self, batch: list[tuple[TraceContext, str]]) -> None:
        contexts = [ctx for ctx, _ in batch]
        hook = self.instance.manager.hook.tidemq_trace_dispatched
        if hook.get_hookimpls():
            try:
                hook(contexts=contexts)
            except Exception:  # a plugin's error must not lose the batch
                log.exception("a tidemq_trace_dispatched plugin failed")
        text = "".join(t for _, t in batch)
        if not text or self._producer is None:
            return
        from tidemq.client.message import Message

        keys = list(dict.fromkeys(k for ctx in contexts for k in trace_keys(ctx)))
        try:
            await self._producer.send(Message(self.trace_topic, text.encode(), keys=keys or None))
        except Exception as exc:
            self.failed += len(batch)
            self._log_limited(
                "fail",
                "trace data to %s not sent (%d context(s) failed so far): %s",
                self.trace_topic,
                self.failed,
                exc,
            )
            return
        self.sent += len(batch)
