"""Acknowledging popped messages: ACK_MESSAGE (one, or every one of a read together),
BATCH_ACK_MESSAGE entries and CHANGE_MESSAGE_INVISIBLETIME.

A handle is checked against the open checkpoint it names (group, stored topic, queue,
ckQueueOffset, popTime, invisible time); a position already acknowledged is refused.  An ack is
written to the revive log before it is taken in memory: a write the store refuses leaves the
message in flight (and the client's retry is not refused as a replay).  :meth:`Acks.ack_many`
takes the ACK_MESSAGEs of one read with one revive-log record for all of them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tidemq.broker.pop.checkpoints import CheckpointTable
from tidemq.broker.pop.checks import Checks
from tidemq.broker.pop.handle import ORDER_REVIVE_QUEUE, HandleError, real_topic, retry_mark, split_handle
from tidemq.broker.pop.journal import Checkpoint, ack_record
from tidemq.broker.pop.polling import PopWaiters
from tidemq.broker.pop.results import INVALID_PARAMETER, PopError, now_ms
from tidemq.broker.pop.revive_log import ReviveLogError
from tidemq.remoting.codes import ResponseCode

Handle = tuple[int, int, int, int, str, str, int, int]
#: One ACK_MESSAGE: (group, stored topic, queue id, offset, extraInfo).
AckRequest = tuple[str, str, int, int, str]


def _no_message(group: str, topic: str, queue_id: int, offset: int) -> PopError:
    return PopError(
        ResponseCode.NO_MESSAGE,
        f"no message in flight for this handle of group {group} ({topic}:{queue_id}@{offset}): "
        "expired and redelivered with a new handle, acknowledged already, or never popped",
    )


def parse(extra_info: str) -> Handle:
    try:
        return split_handle(extra_info)
    except HandleError as exc:
        raise PopError(INVALID_PARAMETER, str(exc)) from None


class Acks:
    def __init__(self, table: CheckpointTable, checks: Checks, waiters: PopWaiters) -> None:
        self.table = table
        self.checks = checks
        self.waiters = waiters

    def find(
        self, group: str, topic: str, queue_id: int, handle: Handle, offset: int
    ) -> tuple[Checkpoint, int]:
        """The open checkpoint and position ``handle`` names; raises :class:`PopError`."""
        ck_offset, pop_time, invisible, _rqid, retry, _broker, h_qid, h_offset = handle
        if retry_mark(topic) != retry:
            raise PopError(
                INVALID_PARAMETER, f"the handle names retry mark {retry}, the request topic {topic}"
            )
        if h_qid != queue_id or h_offset != offset:
            raise PopError(
                INVALID_PARAMETER,
                f"the handle names queue {h_qid} offset {h_offset}, the request queue {queue_id} offset {offset}",
            )
        ck = self.table.by_key.get((group, topic, queue_id, ck_offset, pop_time))
        if ck is None or ck.invisible_ms != invisible:
            raise _no_message(group, topic, queue_id, offset)
        i = bisect.bisect_left(ck.offsets, offset)
        if i >= len(ck.offsets) or ck.offsets[i] != offset:
            raise PopError(ResponseCode.NO_MESSAGE, f"offset {offset} was not popped with this handle")
        if ck.acked >> i & 1:
            raise PopError(ResponseCode.NO_MESSAGE, f"{topic}:{queue_id}@{offset} is acknowledged already")
        return ck, i

    def ack(self, group: str, topic: str, queue_id: int, offset: int, extra_info: str) -> None:
        """Acknowledge one popped message (ACK_MESSAGE); ``topic`` is the stored (retry) topic."""
        handle = parse(extra_info)
        self.checks.check_group(group)
        self.checks.check_topic(topic, queue_id, any_queue=False)
        ck, i = self.find(group, topic, queue_id, handle, offset)
        self.set_acked(ck, 1 << i)

    def ack_many(self, acks: Sequence[AckRequest]) -> list[PopError | None]:
        """The ACK_MESSAGEs of one read: each checked as :meth:`ack` does, all taken with one
        revive-log record; per request None (acknowledged) or its refusal, in order."""
        out: list[PopError | None] = []
        bits: dict[int, int] = {}  # checkpoint id -> positions taken in this run
        cks: dict[int, Checkpoint] = {}
        groups: set[str] = set()
        queues: set[tuple[str, int]] = set()
        checks = self.checks
        for group, topic, queue_id, offset, extra_info in acks:
            try:
                handle = parse(extra_info)
                if group not in groups:
                    checks.check_group(group)
                    groups.add(group)
                if (topic, queue_id) not in queues:
                    checks.check_topic(topic, queue_id, any_queue=False)
                    queues.add((topic, queue_id))
                ck, i = self.find(group, topic, queue_id, handle, offset)
                bit = 1 << i
                taken = bits.get(ck.id, 0)
                if taken & bit:
                    raise PopError(
                        ResponseCode.NO_MESSAGE, f"{topic}:{queue_id}@{offset} is acknowledged already"
                    )
                bits[ck.id] = taken | bit
                cks[ck.id] = ck
                out.append(None)
            except PopError as exc:
                out.append(exc)
        if bits:
            try:
                self.table.log.append(b"".join(ack_record(ck_id, b) for ck_id, b in bits.items()))
            except ReviveLogError as exc:
                refusal = PopError(ResponseCode.SYSTEM_ERROR, str(exc))
                return [refusal if r is None else r for r in out]
            for ck_id, b in bits.items():
                self._take(cks[ck_id], b)
        return out

    def set_acked(self, ck: Checkpoint, bits: int) -> None:
        bits &= ~ck.acked
        try:
            self.table.log.append(ack_record(ck.id, bits))  # first: an ack the store refused is not taken
        except ReviveLogError as exc:
            raise PopError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        self._take(ck, bits)

    def _take(self, ck: Checkpoint, bits: int) -> None:
        ck.acked |= bits
        self.table.count(ck, -bits.bit_count())
        if ck.done:
            if ck.revive_qid == ORDER_REVIVE_QUEUE:
                self.waiters.notify(ck.topic)  # the FIFO queue is free for the next batch
                # kept until the next pop of the queue retires it (its offsets stay the queue's progress)
                self.table.by_key.pop((ck.group, ck.topic, ck.queue_id, ck.start, ck.pop_time), None)
            else:
                self.table.retire(ck, record=False)  # a full mask retires it at replay too

    def batch_ack(
        self,
        group: str,
        topic: str,
        retry: str,
        queue_id: int,
        start_offset: int,
        pop_time: int,
        invisible_ms: int,
        revive_qid: int,
        offsets: Sequence[int],
    ) -> tuple[int, int]:
        """One BatchAck entry: acknowledge ``offsets`` of a checkpoint; (acknowledged, refused)."""
        try:
            stored = real_topic(topic, group, retry)
        except ValueError as exc:
            raise PopError(INVALID_PARAMETER, str(exc)) from None
        self.checks.check_group(group)
        self.checks.check_topic(stored, queue_id, any_queue=False)
        if retry_mark(stored) != retry:
            raise PopError(INVALID_PARAMETER, f"retry mark {retry} does not name {stored}")
        ck = self.table.by_key.get((group, stored, queue_id, start_offset, pop_time))
        if ck is None or ck.invisible_ms != invisible_ms:
            return 0, len(offsets)
        bits = 0
        for off in offsets:
            i = bisect.bisect_left(ck.offsets, off)
            if i < len(ck.offsets) and ck.offsets[i] == off and not ck.acked >> i & 1:
                bits |= 1 << i
        done = bits.bit_count()
        if bits:
            self.set_acked(ck, bits)
        return done, len(offsets) - done

    def change_invisible(
        self, group: str, topic: str, queue_id: int, offset: int, extra_info: str, invisible_ms: int
    ) -> tuple[int, int, int]:
        """Make a popped message invisible ``invisible_ms`` from now; (popTime, invisibleTime, reviveQid)
        of its new handle (the old one is spent)."""
        handle = parse(extra_info)
        self.checks.check_invisible(invisible_ms)
        self.checks.check_group(group)
        self.checks.check_topic(topic, queue_id, any_queue=False)
        ck, i = self.find(group, topic, queue_id, handle, offset)
        table = self.table
        pop_time = now_ms()
        while (group, topic, queue_id, offset, pop_time) in table.by_key:
            pop_time += 1
        new = Checkpoint(
            table.next_id,
            group,
            topic,
            queue_id,
            pop_time,
            invisible_ms,
            ck.revive_qid,
            -1,
            ck.attempt,
            (offset,),
        )
        # The new checkpoint and the old one's ack in one record: both, or neither, survive a crash.
        bits = (1 << i) & ~ck.acked
        try:
            table.log.append(new.record() + ack_record(ck.id, bits))
        except ReviveLogError as exc:
            raise PopError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        table.next_id += 1
        table.register(new)
        self._take(ck, bits)
        return pop_time, invisible_ms, ck.revive_qid
