"""Transactional messages: half messages, END_TRANSACTION and the state check-back service.

As RocketMQ's TransactionalMessageServiceImpl / TransactionalMessageBridge:

* a prepared message (sysFlag TRANSACTION_PREPARED_TYPE, property TRAN_MSG=true) is stored as a
  plain record in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, its real topic and queue in REAL_TOPIC /
  REAL_QID, so no consumer of the real topic sees it;
* END_TRANSACTION commit re-puts it to the real topic (sysFlag TRANSACTION_COMMIT_TYPE); commit
  and rollback both append an op record to ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (tag ``d``, body = the
  half message's queue offset) marking the half message resolved;
* every ``transaction_check_interval_s`` the check service walks the half queue from its progress
  offset: resolved entries are skipped, entries younger than ``transaction_timeout_s`` (or their
  CHECK_IMMUNITY_TIME_IN_SECONDS) end the walk, entries checked ``transaction_check_max`` times are
  discarded, every other entry is appended again with TRANSACTION_CHECK_TIMES + 1 and a
  CHECK_TRANSACTION_STATE goes (oneway) to a live producer connection of its group, which answers
  with END_TRANSACTION for the re-appended copy.

Progress (half and op queue offsets) is kept as consumer offsets of the system group
``CID_RMQ_SYS_TRANS`` in consumerOffset.json, so pending transactions are checked after a restart.
The op record also carries the transaction id (property TRAN_ID) so a late END_TRANSACTION for an
already re-appended copy does not commit the message twice.

Both queues are read through the broker's :class:`~tidemq.broker.confirmed.ReadBound`: on a
controller SYNC master the walk stops at the confirm offset (RocketMQ 5 dispatches the half and op
queues only up to it), so no producer is asked about a half message a failover can cut and the
progress offsets slaves copy never pass the new master's log.  A master that takes over again
forgets what it resolved before (its log may have been cut since) and re-reads the op queue.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from tidemq.errors import CorruptDataError
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    MessageInner,
    Prop,
    decode_message,
    decode_message_id,
    encode_message,
    patch_record,
)
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import GetStatus, PutResult
from tidemq.tasks import supervise
from tidemq.transport import Connection

# A private generator: the process's global `random` state stays the application's.
_random = random.Random()

if TYPE_CHECKING:
    from tidemq.context import BrokerContext

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SYS_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"
#: Property of op records naming the resolved transaction (tidemq addition, ignored by others).
TRAN_ID = "TRAN_ID"
READ_BATCH = 32
CHECK_SEND_TIMEOUT_S = 3.0
#: Transaction ids remembered as resolved (bounded: duplicates beyond it are RocketMQ's behaviour).
RESOLVED_MEMORY = 100_000


@attrs.frozen
class TransactionCheck:
    """A check of one pending transaction, as the broker asks its producer (CHECK_TRANSACTION_STATE
    without the wire): the half message as the producer sent it (real topic and queue) and what
    the producer's END_TRANSACTION names it by."""

    producer_group: str
    #: The message: its real topic and queue, the re-appended copy's offsets and store time.
    message: MessageExt
    #: Queue offset of the re-appended half message (``tranStateTableOffset``).
    tran_state_offset: int
    #: Its commit-log offset (``commitLogOffset``), and its offset message id.
    commit_log_offset: int
    offset_msg_id: str
    #: The producer's id of the transaction (the message's UNIQ_KEY).
    transaction_id: str


@runtime_checkable
class TransactionCheckTarget(Protocol):
    """A producer connection that takes a check as a value (a gRPC producer's Telemetry stream)
    instead of a CHECK_TRANSACTION_STATE request: the check service calls it when the connection
    it picked for the group implements it."""

    async def check_transaction(self, check: TransactionCheck) -> None:
        """Hand ``check`` to the producer; the answer comes back as an end of transaction."""


def is_half_request(properties: dict[str, str], sys_flag: int) -> bool:
    """Whether a send is a transaction's prepared (half) message."""
    return (
        properties.get(Prop.TRANSACTION_PREPARED, "").lower() == "true"
        or sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_PREPARED_TYPE
    )


class TransactionalMessageService:
    """Half/op queues, END_TRANSACTION and the periodic check-back."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.store = broker.store
        s = broker.settings
        self.check_interval_s = s.transaction_check_interval_s
        self.timeout_ms = int(s.transaction_timeout_s * 1000)
        self.check_max = s.transaction_check_max
        #: half queue offsets resolved by an op record (and not yet passed by the walk)
        self.done: set[int] = set()
        #: (op queue offset, half offset) in op order, to advance the op progress offset
        self._ops: collections.deque[tuple[int, int]] = collections.deque()
        self._op_read = 0
        self._resolved: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._resolving: set[int] = set()
        #: half offsets whose op record this broker wrote and the op queue has not served yet
        #: (past the confirm offset: a failover may cut it, so the walk waits there)
        self._unread_ops: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.checks_sent = 0
        self.discarded = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        # Promoted again after a demotion, the log may have been cut under what was learnt: the
        # op queue (from its progress) says again what is resolved.
        self.done.clear()
        self._ops.clear()
        self._resolved.clear()
        self._unread_ops.clear()
        self._op_read = self._progress(OP_TOPIC)
        self._read_ops()  # transactions resolved before a restart stay resolved
        if self.broker.is_master:
            self._tasks.append(supervise(self._check_loop, "tidemq-transaction-check"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def _progress(self, topic: str) -> int:
        offset = self.broker.offsets.query(SYS_GROUP, topic, 0)
        # Never past the queue's end: a deposed master's log was cut back (issue 25) under it.
        offset = min(offset, self.store.get_max_offset_in_queue(topic, 0))
        return max(offset, self.store.get_min_offset_in_queue(topic, 0), 0)

    # ------------------------------------------------------------------ prepare
    def to_half(self, msg: MessageInner) -> None:
        """Turn a prepared send into its half-queue record (TransactionalMessageBridge.parseHalfMessageInner)."""
        msg.properties[Prop.REAL_TOPIC] = msg.topic
        msg.properties[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
        msg.sys_flag = (msg.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_NOT_TYPE
        msg.topic = HALF_TOPIC
        msg.queue_id = 0

    # ------------------------------------------------------------------ END_TRANSACTION
    async def end(
        self,
        peer_address: str,
        producer_group: str,
        tran_state_offset: int,
        commit_log_offset: int,
        kind: int,
        from_check: bool,
        transaction_id: str,
    ) -> str | None:
        """END_TRANSACTION (without the wire, for :mod:`tidemq.broker.services.transactions`):
        commit or roll back the half message at ``commit_log_offset``; None when done (or when
        ``kind`` is UNKNOWN: the check service asks again later), else why it was refused."""
        if kind not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            log.info(
                "producer %s left transaction %s pending (from check: %s)",
                peer_address,
                transaction_id,
                from_check,
            )
            return None
        b = self.broker
        self._read_ops()
        half, error = self._find_half(producer_group, tran_state_offset, commit_log_offset)
        if error is not None:
            log.warning("END_TRANSACTION from %s refused: %s", peer_address, error)
            return error
        assert half is not None
        qoff = half.queue_offset
        tran_id = half.uniq_key or transaction_id or half.msg_id
        if qoff in self.done or qoff in self._resolving or tran_id in self._resolved:
            if qoff not in self.done and qoff not in self._resolving:
                await self._put_op(half, tran_id)  # mark this copy resolved too
            return None
        self._resolving.add(qoff)
        try:
            if kind == TRANSACTION_COMMIT_TYPE:
                real = self._real_message(half, commit_log_offset)
                if not b.timers.rewrite(real, strict=False):  # a timer starts at the commit
                    b.schedule.rewrite(real)
                result: PutResult = await resolved(self.store.put_message(real))
                if not result.ok:
                    return f"commit failed: {result.status.value} {result.error}".strip()
                b.stats.on_put(real.topic, 1, result.wrote_bytes)
            await self._put_op(half, tran_id)
        finally:
            self._resolving.discard(qoff)
        log.debug(
            "transaction %s %s", tran_id, "committed" if kind == TRANSACTION_COMMIT_TYPE else "rolled back"
        )
        return None

    def _find_half(
        self, producer_group: str, tran_state_offset: int, commit_log_offset: int
    ) -> tuple[MessageExt | None, str | None]:
        """The half message END_TRANSACTION names, checked as EndTransactionProcessor.checkPrepareMessage."""
        raw = self.store.look_message_by_offset(commit_log_offset)
        if raw is None:
            return None, f"find prepared transaction message failed: no record at offset {commit_log_offset}"
        try:
            half = decode_message(raw)
        except CorruptDataError as exc:
            return None, f"find prepared transaction message failed: {exc}"
        if half.topic != HALF_TOPIC:
            return None, f"the record at offset {commit_log_offset} is not a half message"
        if half.properties.get(Prop.PRODUCER_GROUP, "") != producer_group:
            return None, "the producer group wrong"
        if half.queue_offset != tran_state_offset:
            return None, "the transaction state table offset wrong"
        return half, None

    @staticmethod
    def _real_message(half: MessageExt, commit_log_offset: int) -> MessageInner:
        props = dict(half.properties)
        topic = props.pop(Prop.REAL_TOPIC, half.topic)
        try:
            queue_id = int(props.pop(Prop.REAL_QUEUE_ID, "0"))
        except ValueError:
            queue_id = 0
        props.pop(Prop.TRANSACTION_CHECK_TIMES, None)
        return MessageInner(
            topic=topic,
            body=half.body,
            queue_id=queue_id,
            flag=half.flag,
            properties=props,
            sys_flag=(half.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=half.store_host,
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=commit_log_offset,
        )

    async def _put_op(self, half: MessageExt, tran_id: str) -> None:
        op = MessageInner(
            topic=OP_TOPIC,
            body=str(half.queue_offset).encode(),
            queue_id=half.queue_id,
            properties={Prop.TAGS: REMOVE_TAG, TRAN_ID: tran_id, Prop.WAIT_STORE_MSG_OK: "false"},
            born_timestamp=int(time.time() * 1000),
            born_host=self.broker.store_host,
            store_host=self.broker.store_host,
        )
        result = await resolved(self.store.put_message(op))
        if not result.ok:
            # The half message stays unresolved; the check service asks the producer again.
            log.warning("cannot record the end of transaction %s: %s", tran_id, result.status.value)
            return
        self.done.add(half.queue_offset)
        self._unread_ops.add(half.queue_offset)
        self._remember(tran_id)

    def _remember(self, tran_id: str) -> None:
        if tran_id:
            self._resolved[tran_id] = None
            self._resolved.move_to_end(tran_id)
            while len(self._resolved) > RESOLVED_MEMORY:
                self._resolved.popitem(last=False)

    # ------------------------------------------------------------------ check service
    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check failed")

    def _read_ops(self) -> None:
        """Learn op records appended since the last look."""
        while True:
            res = self.broker.read_bound.get_message(SYS_GROUP, OP_TOPIC, 0, self._op_read, READ_BATCH)
            if res.status is not GetStatus.FOUND:
                if (
                    res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY)
                    and res.next_begin_offset != self._op_read
                ):
                    self._op_read = res.next_begin_offset
                    continue
                return
            for buf, qoff in zip(res.buffers, res.queue_offsets, strict=True):
                try:
                    op = decode_message(buf)
                    half_offset = int(op.body.decode())
                except (CorruptDataError, ValueError, UnicodeDecodeError):
                    log.error("unreadable transaction op record at offset %d skipped", qoff)
                    continue
                self.done.add(half_offset)
                self._unread_ops.discard(half_offset)
                self._ops.append((qoff, half_offset))
                self._remember(op.properties.get(TRAN_ID, ""))
            self._op_read = res.next_begin_offset

    async def check(self) -> None:
        """One walk over the half queue (TransactionalMessageServiceImpl.check)."""
        b = self.broker
        self._read_ops()
        start_ms = int(time.time() * 1000)
        offset = self._progress(HALF_TOPIC)
        bounded = b.read_bound.active
        walking = True
        while walking:
            res = self.broker.read_bound.get_message(SYS_GROUP, HALF_TOPIC, 0, offset, READ_BATCH)
            if res.status is not GetStatus.FOUND:
                if (
                    res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY)
                    and res.next_begin_offset != offset
                ):
                    offset = res.next_begin_offset
                    continue
                break
            for buf, qoff in zip(res.buffers, res.queue_offsets, strict=True):
                try:
                    half = decode_message(buf)
                except CorruptDataError as exc:
                    log.error("unreadable half message at offset %d skipped: %s", qoff, exc)
                    offset = qoff + 1
                    continue
                if bounded and qoff in self._unread_ops:
                    walking = False  # resolved by an op record not confirmed yet: not passed
                    break
                if qoff in self.done or (half.uniq_key and half.uniq_key in self._resolved):
                    self.done.discard(qoff)
                    offset = qoff + 1
                    continue
                if qoff in self._resolving or half.store_timestamp >= start_ms:
                    walking = False  # stored during this walk: the next one looks at it
                    break
                checks = _int(half.properties.get(Prop.TRANSACTION_CHECK_TIMES), 0)
                if checks >= self.check_max:
                    self.discarded += 1
                    log.warning(
                        "transaction %s of group %s discarded after %d checks",
                        half.uniq_key,
                        half.properties.get(Prop.PRODUCER_GROUP),
                        checks,
                    )
                    offset = qoff + 1
                    continue
                immunity_s = _int(half.properties.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS), -1)
                wait_ms = immunity_s * 1000 if immunity_s >= 0 else self.timeout_ms
                if start_ms - half.born_timestamp < wait_ms:
                    walking = False  # too young to ask about; younger ones follow
                    break
                if not b.is_master:
                    return  # demoted during the walk (issue 25): a slave appends nothing
                if not await self._check_one(half, checks + 1):
                    walking = False
                    break
                offset = qoff + 1
            else:
                offset = max(offset, res.next_begin_offset)
            b.offsets.commit(SYS_GROUP, HALF_TOPIC, 0, offset)
        b.offsets.commit(SYS_GROUP, HALF_TOPIC, 0, offset)
        # Ops for half messages behind the walk are no longer needed.
        op_offset = self._progress(OP_TOPIC)
        while self._ops and self._ops[0][1] < offset:
            op_qoff, half_offset = self._ops.popleft()
            self.done.discard(half_offset)
            op_offset = op_qoff + 1
        b.offsets.commit(SYS_GROUP, OP_TOPIC, 0, op_offset)

    async def _append_half(self, half: MessageExt, checks: int) -> tuple[PutResult, MessageInner]:
        """Append ``half`` to the half topic again, its check count set to ``checks``; the put's
        result and the message appended."""
        props = dict(half.properties)
        props[Prop.TRANSACTION_CHECK_TIMES] = str(checks)
        copy = MessageInner(
            topic=HALF_TOPIC,
            body=half.body,
            queue_id=half.queue_id,
            flag=half.flag,
            properties=props,
            sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=half.store_host,
            reconsume_times=half.reconsume_times,
        )
        result: PutResult = await resolved(self.store.put_message(copy))
        return result, copy

    async def _check_one(self, half: MessageExt, checks: int) -> bool:
        """Append the half message again with its check count and ask a producer about it."""
        result, copy = await self._append_half(half, checks)
        if not result.ok:
            log.warning("cannot re-append half message %s: %s", half.uniq_key, result.status.value)
            return False
        group = copy.properties.get(Prop.PRODUCER_GROUP, "")
        conn = self._producer_connection(group)
        if conn is None:
            log.info(
                "no live producer of group %s to check transaction %s (check %d/%d)",
                group,
                half.uniq_key,
                checks,
                self.check_max,
            )
            return True
        self.checks_sent += 1
        request = self._check_request(copy, result)
        if isinstance(conn, TransactionCheckTarget):
            check = TransactionCheck(
                group,
                decode_message(request.body or b""),
                result.queue_offset,
                result.wrote_offset,
                request.ext_fields.get("offsetMsgId", ""),
                request.ext_fields.get("transactionId", ""),
            )
            self.broker.spawn(self._hand_check(conn, check))
        else:
            self.broker.spawn(self._send_check(conn, request, group))
        return True

    async def resume_check(self, msg_id: str) -> str | None:
        """RESUME_CHECK_HALF_MESSAGE: append the half message ``msg_id`` names again with its check
        count at 0, so the check service asks its producer again; the error remark, None when done."""
        try:
            _host, offset = decode_message_id(msg_id)
        except ValueError as exc:
            return f"RESUME_CHECK_HALF_MESSAGE: {exc}"
        raw = self.store.look_message_by_offset(offset)
        if raw is None:
            return f"RESUME_CHECK_HALF_MESSAGE: no message at commit-log offset {offset} (msgId {msg_id})"
        try:
            half = decode_message(raw)
        except CorruptDataError as exc:
            return f"RESUME_CHECK_HALF_MESSAGE: {exc}"
        # RocketMQ re-appends whatever record the id names; only a half message makes sense here.
        if half.topic != HALF_TOPIC:
            return f"RESUME_CHECK_HALF_MESSAGE: message {msg_id} is in topic {half.topic}, not a half message"
        result, _ = await self._append_half(half, 0)
        if not result.ok:
            log.error("cannot put half message %s back: %s", msg_id, result.status.value)
            return "Put message back to RMQ_SYS_TRANS_HALF_TOPIC failed."
        log.info(
            "half message %s put back for checking (real topic %s)",
            msg_id,
            half.properties.get(Prop.REAL_TOPIC),
        )
        return None

    def _producer_connection(self, group: str) -> Any:
        channels = [
            ch.conn for ch in self.broker.producers.groups.get(group, {}).values() if not ch.conn.closed
        ]
        return _random.choice(channels) if channels else None

    def _check_request(self, copy: MessageInner, result: PutResult) -> RemotingCommand:
        """CHECK_TRANSACTION_STATE with the message (real topic and queue) as its body."""
        props = dict(copy.properties)
        topic = props.get(Prop.REAL_TOPIC, copy.topic)
        queue_id = _int(props.get(Prop.REAL_QUEUE_ID), 0)
        view = MessageInner(
            topic=topic,
            body=copy.body,
            queue_id=queue_id,
            flag=copy.flag,
            properties=props,
            sys_flag=copy.sys_flag,
            born_timestamp=copy.born_timestamp,
            born_host=copy.born_host,
            store_host=copy.store_host,
            reconsume_times=copy.reconsume_times,
        )
        body = encode_message(view, max_size=1 << 30)
        patch_record(body, result.queue_offset, result.wrote_offset, result.store_timestamp)
        offset_msg_id = result.msg_ids[0] if result.msg_ids else ""
        fields = {
            "tranStateTableOffset": str(result.queue_offset),
            "commitLogOffset": str(result.wrote_offset),
            "msgId": offset_msg_id,
            "offsetMsgId": offset_msg_id,
            "transactionId": props.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, offset_msg_id),
        }
        request = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, fields, bytes(body))
        request.mark_oneway()
        return request

    async def _send_check(self, conn: Connection, request: RemotingCommand, group: str) -> None:
        try:
            await asyncio.wait_for(conn.invoke_oneway(request), CHECK_SEND_TIMEOUT_S)
        except Exception as exc:
            log.info(
                "cannot ask producer %s of group %s about a transaction: %s", conn.remote_address, group, exc
            )

    async def _hand_check(self, conn: TransactionCheckTarget, check: TransactionCheck) -> None:
        try:
            await asyncio.wait_for(conn.check_transaction(check), CHECK_SEND_TIMEOUT_S)
        except Exception as exc:
            log.info("cannot ask a producer of group %s about a transaction: %s", check.producer_group, exc)


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default
