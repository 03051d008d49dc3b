"""A send's record in the duplicate window and a resend's answer (issue 37).

:class:`Sent`: the keys of one send with the answer it got (pending while its first copy is
being stored); :class:`Duplicate`: a send whose messages are all in the window, answered from
the first copies.  Their fields are :class:`~tidemq.broker.dedup_table.SentFields`, compiled
when built (typed C fields the compiled run and trim read directly, no object the cycle collector
walks).
"""

from __future__ import annotations

from array import array
from concurrent.futures import Future
from typing import TYPE_CHECKING

from tidemq.broker.dedup_table import SentFields, key_hash, untrack
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from tidemq.replication import ReplicaStatus
from tidemq.store import PutResult, PutStatus

if TYPE_CHECKING:
    from tidemq.broker.dedup import DuplicateWindow
    from tidemq.broker.services.put import Send
    from tidemq.broker.services.status import Status
    from tidemq.context import BrokerContext

__all__ = ["Duplicate", "Sent"]

_NOT_CONSUMABLE = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
_PUT_OK = PutStatus.PUT_OK


def _status() -> type[Status]:
    from tidemq.broker.services.status import Status

    return Status


class Sent(SentFields):
    """The keys of one send (or of consecutive records read back at a rebuild) and its answer.

    Pending while :attr:`send` is set (the first copy is being stored); answered once ``msg_id``
    is set (comma-separated for several messages), message ``i``'s queue offset being
    ``queue_offset + i * step``.  One object per send, shared by all its keys: recording a batch
    costs one table update, settling it no per-key work.  ``stored(send, result)`` (the put's
    outcome: keep the answer, or forget the keys when nothing was stored) is the fields' own
    method (compiled when built).  The compiled run
    (``_dedup_table.admit_run``) makes them without calling ``__init__``: it sets the same fields.
    """

    if not TYPE_CHECKING:  # the fields are the base's (mypy reads the annotations below)
        __slots__ = ()

    window: DuplicateWindow
    topic: str
    #: The keys' 64-bit hashes (:func:`~tidemq.broker.dedup_table.hashes_of`), in message order
    #: (the compiled record's: a copy read from its table, while the window holds it).
    hashes: array[int]
    #: The send's keys (one a message).
    nkeys: int
    deadline: float
    #: The send being stored (pending), else None.
    send: Send | None
    #: Set once answered, with ``queue_id``, ``queue_offset``, ``step``, ``end`` and ``handle``
    #: (kept as numbers by the compiled record, re-encoded when read: ``id_at``).
    msg_id: str
    #: Whether ``msg_id`` is set.
    answered: bool
    #: Still in the window (False once evicted or forgotten).
    live: bool
    #: A parked timer message's recall handle (its answer's ``recallHandle``), else None.
    handle: str | None
    #: Set once answered (with ``msg_id``, ``handle``): the first message's queue and offset,
    #: the offset step between messages (0: no consume-queue entry), the put's commit-log end.
    queue_id: int
    queue_offset: int
    step: int
    end: int
    #: Bytes counted for it in the window's bound.
    nbytes: int

    def __init__(
        self, window: DuplicateWindow, topic: str, hashes: array[int], deadline: float, send: Send | None
    ) -> None:
        self.window = window
        self.topic = topic
        # the reference keeps the array (untracked: not walked by the collector); the compiled
        # record only the keys' number (its table keeps the hashes: ``HashTable.put_record``)
        self.keep_hashes(untrack(hashes))
        self.deadline = deadline
        self.send = send
        self.msg_id = ""
        self.live = True
        self.handle = None

    def answer(self, pos: int) -> tuple[str, int, int]:
        """Message ``pos``'s (message id, queue id, queue offset), once answered."""
        msg_id = self.id_at(pos) if self.nkeys > 1 else self.msg_id
        return msg_id, self.queue_id, self.queue_offset + pos * self.step

    def position(self, key: str) -> int:
        """Where ``key`` is among this send's messages (0 for a single message)."""
        return self.index_of(key_hash(key)) if self.nkeys > 1 else 0

    def from_put(self) -> bool | None:
        """A pending send whose put is done: take its answer from the put (as its own outcome
        will); True when answered now, False when it is not done yet, None when it failed."""
        send = self.send
        if send is None:
            return True if self.answered else None
        group = send.group
        if group is None:
            return False
        future = group.future
        if future is None:  # the store raised
            self.send = None
            self.window.forget(self)
            return None
        if not future.done():
            return False
        result = None if future.exception() is not None else future.result()
        if result is None or result.status is not _PUT_OK:
            self.send = None
            self.window.forget(self)
            return None
        index = send.index
        ids = result.msg_ids
        count = len(send.msgs)
        if group.nsends == 1 and index == 0:
            self.msg_id = result.msg_id if count > 1 else (ids[0] if ids else result.msg_id)
        else:
            self.msg_id = ",".join(ids[index : index + count]) if index + count <= len(ids) else result.msg_id
        first = group.msgs[0]
        consumable = first.sys_flag & TRANSACTION_TYPE_MASK not in _NOT_CONSUMABLE
        self.step = 1 if consumable else 0
        self.queue_offset = result.queue_offset + (index if consumable else 0)
        self.queue_id = send.queue_id
        self.handle = send.recall_handle
        self.end = result.wrote_offset + result.wrote_bytes
        self.send = None
        return True

    def put_future(self) -> Future[PutResult] | None:
        """The pending send's put, to wait for (None when there is nothing to wait for)."""
        send = self.send
        group = send.group if send is not None else None
        return group.future if group is not None else None


class Duplicate:
    """A send whose messages are all in the window: answered from the first copies, not stored.

    ``refs`` holds, per message, the :class:`Sent` that stored it and its position there.  The
    answer waits for a first copy still being stored, then for the replicas to hold the first
    copies (as the first answer did: a resend is acknowledged no sooner than its first copy).
    """

    __slots__ = ("refs", "replica")

    def __init__(self, refs: list[tuple[Sent, int]]) -> None:
        self.refs = refs
        self.replica: Future[ReplicaStatus] | None = None

    def settled(self, broker: BrokerContext, send: Send) -> bool:
        """Fill ``send``'s answer when every first copy is stored and replicated; else False."""
        end = 0
        for sent, _ in self.refs:
            state = sent.from_put()
            if state is None:
                _refuse(send, "the first copy of this message was not stored; send it again")
                return True
            if not state:
                return False
            end = max(end, sent.end)
        replica = self.replica
        if replica is None:
            replica = self.replica = broker.replication.wait_for_replicas(end)
        if not replica.done():
            return False
        self._fill(broker, send, None if replica.exception() is not None else replica.result())
        return True

    async def settle(self, broker: BrokerContext, send: Send) -> None:
        """Wait for the first copies' puts and replicas, then fill ``send``'s answer."""
        for sent, _ in self.refs:
            future = sent.put_future()
            if future is not None:
                try:
                    await resolved(future)
                except Exception:
                    pass  # from_put reads the failure
        if self.settled(broker, send):
            return
        replica = self.replica
        status: ReplicaStatus | None = None
        if replica is not None:
            try:
                status = await resolved(replica)
            except Exception:
                status = None
        self._fill(broker, send, status)

    def _fill(self, broker: BrokerContext, send: Send, replica: ReplicaStatus | None) -> None:
        ids = []
        queue_id = queue_offset = 0
        for i, (sent, pos) in enumerate(self.refs):
            msg_id, qid, qoffset = sent.answer(pos)
            ids.append(msg_id)
            if i == 0:
                queue_id, queue_offset = qid, qoffset
        st = _status()
        # (no replica status: the wait failed; typed without a ``type: ignore``, which one mypy
        # run needed and another reported unused)
        status = st.SYSTEM_ERROR
        if replica is not None:
            status = {
                ReplicaStatus.PUT_OK: st.SUCCESS,
                ReplicaStatus.FLUSH_SLAVE_TIMEOUT: st.FLUSH_SLAVE_TIMEOUT,
                ReplicaStatus.SLAVE_NOT_AVAILABLE: st.SLAVE_NOT_AVAILABLE,
                ReplicaStatus.NOT_MASTER: st.SERVICE_NOT_AVAILABLE,
            }.get(replica, st.SYSTEM_ERROR)
        send.status = status
        send.remark = None if status is st.SUCCESS else f"the first copy's replicas answered {replica}"
        role_aware = broker.role_aware
        send.epoch = role_aware.current_epoch() if role_aware is not None else None
        send.msg_id = ids[0] if len(ids) == 1 else ",".join(ids)
        send.queue_id = queue_id
        send.queue_offset = queue_offset
        send.recall_handle = self.refs[0][0].handle


def _refuse(send: Send, remark: str) -> None:
    send.status = _status().SYSTEM_ERROR
    send.remark = remark
    send.epoch = None
    send.msg_id = ""
    send.queue_offset = 0
