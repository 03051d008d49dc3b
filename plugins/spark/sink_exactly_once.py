"""The exactly-once streaming sink: each micro-batch as RocketMQ transactional (half) messages.

``.option("deliveryGuarantee", "exactly-once")`` on ``writeStream.format("tidemq")``:

1. every write task sends its rows as half messages (stored, invisible to consumers), each tagged
   ``tidemqSparkTxn = <query>/<batch>/<token>`` with a token fresh for the task attempt, and
   returns where they were stored;
2. the driver's commit of batch ``N`` records the tokens of the tasks Spark accepted in the
   sink's commit log (``<checkpointLocation>/tidemq-sink``), then ends those half messages with
   COMMIT (END_TRANSACTION); an aborted batch's half messages are ended with ROLLBACK;
3. a half message nobody ended (a failed task attempt, a driver killed between the writers'
   prepare and the commit) is resolved when the broker checks back: the driver-side
   :class:`~tidemq_spark.checker.TransactionChecker` answers from the commit log.

If batch ``N`` was already recorded by an earlier run of the query (the driver died after the
record, before Spark's own commit), the re-run's messages are rolled back and the recorded ones
are delivered: either way every row arrives once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from tidemq.client import Message, MessageQueue, Producer, SendStatus
from tidemq.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, Prop, decode_message_id
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

from .checker import client_kwargs, ensure_checker
from .client import TidemqSession
from .options import TidemqSparkError
from .sink import (
    _STREAM_ARROW,
    _StreamWriterBase,
    batch_messages,
    check_sink_schema,
    choose_queue,
    sink_columns,
)
from .sink_options import SinkOptions
from .txnlog import TXN_PROPERTY, BatchRecord, SinkTransactionLog, TxnTag, local_path, query_key

log = logging.getLogger(__name__)

AT_LEAST_ONCE = "at-least-once"
EXACTLY_ONCE = "exactly-once"
#: Half messages sent concurrently by one write task (sends are single messages: RocketMQ refuses
#: transactional batches).
SEND_WINDOW = 256
#: END_TRANSACTION requests the driver keeps in flight.
END_WINDOW = 512
#: Spark's local property naming the micro-batch a task writes.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: Fault injection for tests: the commit of batch ``TIDEMQ_SPARK_EO_PAUSE_BATCH`` touches this
#: file and waits (``before-record`` or ``after-record``, per ``TIDEMQ_SPARK_EO_PAUSE_AT``).
PAUSE_FILE_ENV = "TIDEMQ_SPARK_EO_PAUSE_FILE"


def delivery_guarantee(options: Any) -> str:
    raw = str(options.get("deliveryGuarantee") or AT_LEAST_ONCE).strip().lower().replace("_", "-")
    if raw not in (AT_LEAST_ONCE, EXACTLY_ONCE):
        raise TidemqSparkError(
            f"option deliveryGuarantee = {raw!r}; choices: {AT_LEAST_ONCE}, {EXACTLY_ONCE}"
        )
    return raw


def default_group(query: str) -> str:
    """The transactional producer group of a query: one per query, so checks reach its checker."""
    return f"tidemq-spark-eo-{query}"


def log_dir(checkpoint: str) -> Path:
    return local_path(checkpoint) / "tidemq-sink"


@dataclass
class Half:
    """Where one half message was stored (what END_TRANSACTION needs)."""

    broker: str
    commit_log_offset: int
    queue_offset: int
    msg_id: str


@dataclass
class PreparedHalves(WriterCommitMessage):
    """One write task's half messages of one micro-batch."""

    batch: int
    token: str
    halves: list[Half] = field(default_factory=list)


class ExactlyOnceStreamWriter(_StreamWriterBase):
    """``writeStream.format("tidemq").option("deliveryGuarantee", "exactly-once")``."""

    def __init__(self, opts: SinkOptions, schema: StructType, options: Any) -> None:
        check_sink_schema(schema, opts)
        self.opts = opts
        self.columns = sink_columns(schema)
        checkpoint = options.get("checkpointLocation")
        txlog = options.get("transactionLog")
        if not checkpoint and not txlog:
            raise TidemqSparkError(
                "deliveryGuarantee = exactly-once needs the query's checkpointLocation (or option transactionLog)"
            )
        self.query = query_key(str(checkpoint or txlog))
        self.log_dir = str(local_path(str(txlog)) if txlog else log_dir(str(checkpoint)))
        explicit = options.get("producerGroup")
        self.group = str(explicit) if explicit else default_group(self.query)

    # ------------------------------------------------------------------ executors
    def write(self, iterator: Iterator[Any]) -> PreparedHalves:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        raw = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        if raw is None or not str(raw).isdigit():
            raise TidemqSparkError("deliveryGuarantee = exactly-once works in streaming queries only")
        tag = TxnTag(self.query, int(raw), uuid.uuid4().hex)
        if not _STREAM_ARROW:  # pragma: no cover - PySpark < 4.1
            from .sink import _rows_to_batches

            iterator = _rows_to_batches(iterator, self.columns)
        loop = asyncio.new_event_loop()
        try:
            halves = loop.run_until_complete(self._send_halves(iterator, tag))
        finally:
            loop.close()
        return PreparedHalves(tag.batch, tag.token, halves)

    async def _send_halves(self, batches: Iterator[Any], tag: TxnTag) -> list[Half]:
        o = self.opts
        # The sending producer heartbeats under its own group: checks go to the query's checker
        # (the half messages name it in PGROUP), never to a write task that cannot answer.
        producer = Producer(
            f"{self.group}-writer",
            o.namesrv,
            send_timeout=o.timeout_s,
            retry_times=0,  # a retried send could store a second copy; a failed task is retried whole
            **client_kwargs(o.client),
        )
        await producer.start()
        halves: list[Half] = []
        pending: set[asyncio.Task[Any]] = set()
        extra = {
            Prop.TRANSACTION_PREPARED: "true",
            Prop.PRODUCER_GROUP: self.group,
            TXN_PROPERTY: tag.render(),
        }
        queues: dict[str, list[MessageQueue]] = {}
        # Rows of one key go to one queue in order: a keyed send waits for the key's queue's previous one.
        last: dict[MessageQueue, asyncio.Task[Any]] = {}

        async def send_after(prev: asyncio.Task[Any] | None, msg: Message, mq: MessageQueue) -> Any:
            if prev is not None:
                await asyncio.shield(prev)
            return await producer.send_to_queue(msg, mq)

        try:
            for batch in batches:
                for out in batch_messages(batch, self.columns, o):
                    msg = out.message
                    half = attrs.evolve(msg, properties={**msg.properties, **extra})
                    mq = None
                    if out.queue_id is not None or out.shard_key is not None:
                        if msg.topic not in queues:
                            queues[msg.topic] = await producer.publish_queues(msg.topic)
                        mq = choose_queue(out, queues[msg.topic])
                    if mq is None:
                        task = asyncio.ensure_future(producer.send(half))
                    else:
                        task = asyncio.ensure_future(send_after(last.get(mq), half, mq))
                        last[mq] = task
                    pending.add(task)
                    if len(pending) >= SEND_WINDOW:
                        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                        halves.extend(_half(t.result()) for t in done)
            if pending:
                done, pending = await asyncio.wait(pending)
                halves.extend(_half(t.result()) for t in done)
            return halves
        finally:
            for t in pending:
                t.cancel()
            await producer.shutdown()

    # ------------------------------------------------------------------ driver
    def _log(self) -> SinkTransactionLog:
        return SinkTransactionLog(self.log_dir)

    def commit(self, messages: Sequence[Any], batchId: int) -> None:
        txlog = self._log()
        ensure_checker(self.opts.namesrv, self.group, self.query, txlog, self.opts.client)
        prepared = [m for m in messages if isinstance(m, PreparedHalves)]
        mine = BatchRecord(
            batchId, frozenset(m.token for m in prepared), sum(len(m.halves) for m in prepared)
        )
        self._pause("before-record", batchId)
        stands = txlog.record(mine)
        self._pause("after-record", batchId)
        halves = [h for m in prepared for h in m.halves]
        if stands.tokens == mine.tokens:
            self._end(halves, TRANSACTION_COMMIT_TYPE)
            log.info("exactly-once sink: batch %d committed, %d messages", batchId, len(halves))
        else:
            # An earlier run of this query recorded batch N: its messages are the ones delivered
            # (by its driver or by the check-back); this re-run's copies go away.
            self._end(halves, TRANSACTION_ROLLBACK_TYPE)
            log.warning(
                "exactly-once sink: batch %d was already recorded by an earlier run; "
                "its %d messages stand, this run's %d are rolled back",
                batchId,
                stands.messages,
                len(halves),
            )

    def abort(self, messages: Sequence[Any], batchId: int) -> None:
        halves = [h for m in messages if isinstance(m, PreparedHalves) for h in m.halves]
        log.warning(
            "exactly-once sink: batch %d aborted; rolling back %d half messages", batchId, len(halves)
        )
        try:
            self._end(halves, TRANSACTION_ROLLBACK_TYPE)
        except Exception as exc:  # the check-back rolls back whatever this misses
            log.warning("exactly-once sink: rollback of batch %d incomplete: %s", batchId, exc)

    def _end(self, halves: list[Half], kind: int) -> None:
        if not halves:
            return
        o = self.opts

        async def end_all(session: TidemqSession) -> None:
            sem = asyncio.Semaphore(END_WINDOW)

            async def end(h: Half) -> None:
                fields = {
                    "producerGroup": self.group,
                    "tranStateTableOffset": str(h.queue_offset),
                    "commitLogOffset": str(h.commit_log_offset),
                    "commitOrRollback": str(kind),
                    "fromTransactionCheck": "false",
                    "msgId": h.msg_id,
                    "transactionId": h.msg_id,
                }
                request = RemotingCommand.request(RequestCode.END_TRANSACTION, fields)
                async with sem:
                    resp = await session.api.invoke(h.broker, request, o.timeout_s)
                if resp.code != ResponseCode.SUCCESS:
                    raise TidemqSparkError(
                        f"END_TRANSACTION of {h.msg_id} on {h.broker} refused: {resp.code} {resp.remark or ''}".strip()
                    )

            await asyncio.gather(*(end(h) for h in halves))

        with TidemqSession(o.namesrv, o.timeout_s, o.client) as session:
            session.run(end_all(session))

    @staticmethod
    def _pause(point: str, batch: int) -> None:
        path = os.environ.get(PAUSE_FILE_ENV)
        if not path or os.environ.get("TIDEMQ_SPARK_EO_PAUSE_AT", "before-record") != point:
            return
        if str(batch) != os.environ.get("TIDEMQ_SPARK_EO_PAUSE_BATCH", "1"):
            return
        Path(path).write_text(f"{point} {batch} {os.getpid()}\n")
        log.warning("exactly-once sink: paused at %s of batch %d (%s)", point, batch, PAUSE_FILE_ENV)
        while True:  # until the test kills the driver
            time.sleep(1)


def _half(result: Any) -> Half:
    if result.status is not SendStatus.SEND_OK:
        raise TidemqSparkError(f"half message {result.msg_id} stored as {result.status.value}")
    return Half(
        result.broker_address,
        decode_message_id(result.offset_msg_id)[1],
        result.queue_offset,
        result.msg_id,
    )
