"""The message store contract (role ``store``) and its value types.

The broker talks to storage only through :class:`MessageStore`.  Operations are synchronous and
thread-safe; durability is reported through a :class:`concurrent.futures.Future` so an asyncio
broker can ``await asyncio.wrap_future(...)`` it while a benchmark thread simply calls
``.result()``.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, TypeGuard, cast, runtime_checkable

import attrs

from tidemq.arrival import ARRIVAL_ROUND_S as ARRIVAL_ROUND_S  # re-exported: store plugins' helpers
from tidemq.arrival import ArrivalInterest as ArrivalInterest
from tidemq.arrival import ArrivalInterests as ArrivalInterests
from tidemq.arrival import ArrivalNotifier as ArrivalNotifier
from tidemq.arrival import arrival_interest as arrival_interest
from tidemq.filter import MessageFilter
from tidemq.message import MessageInner, Prop

if TYPE_CHECKING:
    from tidemq.broker.services.put import Send
    from tidemq.flush import FlushStatistics
    from tidemq.remoting.command import RemotingCommand

log = logging.getLogger(__name__)


class PutStatus(enum.Enum):
    """Outcome of storing a message (PutMessageStatus)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    DISK_FULL = "DISK_FULL"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


@attrs.frozen
class PutResult:
    """What :meth:`MessageStore.put_message` resolves to.

    ``wrote_offset`` is the commit-log offset of the first record, ``queue_offset`` the
    ConsumeQueue offset of the first message, ``msg_ids`` one offset message id per message.
    """

    status: PutStatus
    wrote_offset: int = -1
    wrote_bytes: int = 0
    queue_offset: int = -1
    msg_ids: tuple[str, ...] = ()
    store_timestamp: int = 0
    message_count: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    @property
    def msg_id(self) -> str:
        return ",".join(self.msg_ids)


class GetStatus(enum.Enum):
    """Outcome of reading a queue (GetMessageStatus)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.frozen
class GetResult:
    """What :meth:`MessageStore.get_message` returns.

    ``buffers`` hold the stored records byte for byte (memoryviews into the store where it can),
    ready to be written to a socket without re-encoding.  ``next_begin_offset`` is where the next
    pull should start.
    """

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: tuple[bytes | memoryview, ...] = ()
    queue_offsets: tuple[int, ...] = ()
    suggest_pulling_from_slave: bool = False
    #: Optional: the same bytes as ``buffers`` in fewer chunks (records that lie back to back in
    #: the store as one view), for the pull response; empty when the store does not merge them.
    wire: tuple[bytes | memoryview, ...] = ()

    @property
    def message_count(self) -> int:
        return len(self.buffers)

    @property
    def wire_parts(self) -> tuple[bytes | memoryview, ...]:
        """The records as chunks to write, byte for byte ``b"".join(buffers)``."""
        return self.wire or self.buffers

    @property
    def total_size(self) -> int:
        return sum(len(b) for b in self.wire_parts)


def check_queue_offset(offset: int, min_offset: int, max_offset: int) -> GetResult | None:
    """RocketMQ's answer for a pull offset outside ``[min_offset, max_offset)``, or ``None`` to read.

    Shared by store plugins so every store tells clients the same thing about an empty queue, an
    offset already cleaned (OFFSET_TOO_SMALL, moved to the minimum) or one past the end.
    """
    if max_offset == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
    if offset < min_offset:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
    if offset == max_offset:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
    if offset > max_offset:
        # To the end, as RocketMQ since 4.9.4 (ISSUE #4215): before, a queue whose minimum was
        # still 0 sent the consumer back to 0, and one ahead of a new master (it read the old
        # master's unreplicated tail) re-read its whole queue.
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, max_offset, min_offset, max_offset)
    return None


@attrs.frozen
class DispatchRequest:
    """One stored message as handed to dispatchers (ConsumeQueue builder, key index...)."""

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: str = ""
    uniq_key: str | None = None
    sys_flag: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = attrs.field(factory=dict)


#: ``accessMessageInMemoryMaxRatio``'s default (RocketMQ's): the percentage of the machine's memory
#: the store's newest records are taken to stay in (the page cache).
DEFAULT_IN_MEMORY_RATIO = 40


def physical_memory() -> int:
    """The machine's memory in bytes (RocketMQ's fallback of 24 GB when the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 24 << 30


def memory_for_messages(ratio_percent: int) -> int:
    """Bytes behind the commit log's end a record may lie and still count as in memory."""
    return physical_memory() * ratio_percent // 100


@runtime_checkable
class InMemoryWindow(Protocol):
    """A store that judges whether a pull reads from memory (``suggest_pulling_from_slave``): a
    record more than :attr:`memory_for_messages` bytes behind the commit log's end is on disk.
    The broker sets it from ``[broker] access_message_in_memory_max_ratio``."""

    memory_for_messages: int


@runtime_checkable
class Dispatcher(Protocol):
    """Something that wants to see every stored message, in commit-log order, one request each.

    Called by the store (through :func:`dispatch_messages`) for every record it stores or
    re-dispatches at recovery, with the store's lock held.  Dispatchers that also implement
    :class:`BatchDispatcher` get :meth:`BatchDispatcher.dispatch_batch` instead.
    """

    def dispatch(self, request: DispatchRequest) -> None: ...


@runtime_checkable
class BatchDispatcher(Protocol):
    """A dispatcher that takes the records of one put at once, as columns: no object per message.

    Who calls it, when: :func:`dispatch_messages`, which every store calls for each put (once per
    batch, all records of one topic and queue, consecutive in the commit log) and for each record
    re-dispatched at recovery or appended by replication; always with the store's lock held, so
    calls arrive in commit-log order and never concurrently with each other.  A dispatcher that
    implements this gets no :meth:`Dispatcher.dispatch` call for those records.

    What it must not do: it runs on the put path under the store's lock, so every microsecond it
    takes is taken from every producer.  No I/O, no waiting on other threads, no store call (the
    lock is not re-entrant); work that is not trivial is queued and done on the dispatcher's own
    thread (as the ``hash`` index does).  It may keep the columns it is given (the store does not
    change them after the call, nor the messages' property mappings), but must not mutate them.
    An exception is logged by :func:`dispatch_messages` and the put still succeeds.
    """

    def dispatch_batch(
        self,
        topic: str,
        queue_id: int,
        properties: Sequence[Mapping[str, str]],
        commit_log_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        store_timestamp: int,
        queue_offset: int,
        sys_flags: Sequence[int],
    ) -> None:
        """Records ``i = 0 .. len(commit_log_offsets) - 1`` of one put, all stored at ``store_timestamp``.

        ``properties[i]`` is record i's property mapping (KEYS, UNIQ_KEY, TAGS...), ``sys_flags[i]``
        its sys flag (transaction type bits included); the records' queue offsets are
        ``queue_offset + i``, or ``queue_offset`` is -1 when they have no ConsumeQueue entry
        (prepared and rolled-back transaction halves).
        """


#: One put as :meth:`BatchDispatcher.dispatch_batch` takes it: ``(topic, queue_id, properties,
#: commit_log_offsets, sizes, tags_codes, store_timestamp, queue_offset, sys_flags)``.
DispatchedPut = tuple[
    str,
    int,
    Sequence[Mapping[str, str]],
    Sequence[int],
    Sequence[int],
    Sequence[int],
    int,
    int,
    Sequence[int],
]


@runtime_checkable
class GroupDispatcher(BatchDispatcher, Protocol):
    """A batch dispatcher that also takes the puts of one store call at once (optional; issue 38,
    groupdispatch).

    Who calls it: a store that puts several groups in one call (:class:`GroupPut`; the ``mmap``
    store), once per call and dispatcher, with the call's puts in commit-log order, under the
    store's lock, instead of one :meth:`~BatchDispatcher.dispatch_batch` per put; only when every
    dispatcher of the store has it (else each gets ``dispatch_batch`` per put, as before).  The
    same rules as ``dispatch_batch``: no I/O, no waiting, no store call; an exception is logged and
    the puts stand.  ``dispatch_groups(puts)`` must leave the dispatcher as the calls
    ``dispatch_batch(*put)`` for each put in order would.  The ``hash`` index and the SQL92 bit map
    have it.
    """

    def dispatch_groups(self, puts: Sequence[DispatchedPut]) -> None:
        """The puts of one store call, each ``dispatch_batch``'s arguments, in commit-log order."""


def takes_groups(dispatcher: object) -> bool:
    """Whether ``dispatcher``'s class has :meth:`GroupDispatcher.dispatch_groups` (cached per class)."""
    cls = type(dispatcher)
    capable = _GROUP_CAPABLE.get(cls)
    if capable is None:
        capable = _GROUP_CAPABLE[cls] = callable(getattr(cls, "dispatch_groups", None)) and _takes_batches(
            dispatcher
        )
    return capable


#: Per dispatcher class: whether it implements :class:`GroupDispatcher`.
_GROUP_CAPABLE: dict[type, bool] = {}


#: Per dispatcher class: whether it implements :class:`BatchDispatcher` (isinstance on a
#: runtime-checkable Protocol costs microseconds; dispatch_messages runs once per put).
_BATCH_CAPABLE: dict[type, bool] = {}


def _takes_batches(dispatcher: object) -> TypeGuard[BatchDispatcher]:
    cls = type(dispatcher)
    capable = _BATCH_CAPABLE.get(cls)
    if capable is None:
        capable = _BATCH_CAPABLE[cls] = isinstance(dispatcher, BatchDispatcher)
    return capable


def dispatch_messages(
    dispatchers: Sequence[Dispatcher],
    msgs: Sequence[MessageInner],
    offsets: Sequence[int],
    sizes: Sequence[int],
    tags_codes: Sequence[int],
    store_timestamp: int,
    queue_offset: int,
    *,
    properties: list[dict[str, str]] | None = None,
    sys_flags: list[int] | None = None,
) -> None:
    """Hand messages just appended (one topic and queue, consecutive queue offsets) to every dispatcher.

    Shared by store plugins so all of them describe a message to dispatchers the same way; called
    with the store's lock held.  A :class:`BatchDispatcher` gets one
    :meth:`~BatchDispatcher.dispatch_batch` call for the whole batch; any other dispatcher one
    :class:`DispatchRequest` per message, built only when such a dispatcher is attached.  A
    failing dispatcher is logged and skipped: the message is stored whatever an index thinks.
    ``queue_offset`` is -1 for records without a ConsumeQueue entry.  ``properties`` and
    ``sys_flags``: the messages' columns when the store has them already (both or neither).
    """
    if not msgs:
        return
    per_request = False
    for d in dispatchers:
        if not _takes_batches(d):
            per_request = True
            continue
        if properties is None or sys_flags is None:
            properties = [m.properties for m in msgs]
            sys_flags = [m.sys_flag for m in msgs]
        first = msgs[0]
        try:
            d.dispatch_batch(
                first.topic,
                first.queue_id,
                properties,
                offsets,
                sizes,
                tags_codes,
                store_timestamp,
                queue_offset,
                sys_flags,
            )
        except Exception:
            log.exception("dispatcher %r failed", d)
    if not per_request:
        return
    for i, m in enumerate(msgs):
        req = DispatchRequest(
            topic=m.topic,
            queue_id=m.queue_id,
            commit_log_offset=offsets[i],
            msg_size=sizes[i],
            tags_code=tags_codes[i],
            store_timestamp=store_timestamp,
            queue_offset=queue_offset + i if queue_offset >= 0 else 0,
            keys=m.properties.get(Prop.KEYS, ""),
            uniq_key=m.properties.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
            sys_flag=m.sys_flag,
            prepared_transaction_offset=m.prepared_transaction_offset,
            properties=m.properties,
        )
        for d in dispatchers:
            if _takes_batches(d):
                continue
            try:
                d.dispatch(req)
            except Exception:
                log.exception("dispatcher %r failed", d)


@runtime_checkable
class MessageStore(Protocol):
    """The storage contract every store plugin implements."""

    @property
    def store_host(self) -> tuple[str, int]:
        """STOREHOSTADDRESS of new records: the broker sets it once its port is bound."""

    @store_host.setter
    def store_host(self, host: tuple[str, int]) -> None: ...

    def load(self) -> bool:
        """Open existing files and recover; ``False`` when the data cannot be used."""

    def start(self) -> None:
        """Start background services (flush, reput/dispatch, cleanup)."""

    def shutdown(self) -> None:
        """Flush, stop services and mark a clean exit."""

    def add_dispatcher(self, dispatcher: Dispatcher) -> None:
        """Hand every stored message to ``dispatcher`` too (before :meth:`start`)."""

    def add_arrival_listener(
        self,
        listener: Callable[[str, int, int], None],
        interested: Callable[[str, int], bool] | None = None,
    ) -> None:
        """Call ``listener(topic, queue_id, max_offset)`` after messages become readable.

        Called from the store's own thread; the broker's long polling wakes held pulls with it.
        ``interested(topic, queue_id)``, when given, is asked in the writer first (cheap, never
        blocking): arrivals it answers False for are not delivered (:class:`ArrivalNotifier`).
        """

    def put_message(self, msg: MessageInner) -> Future[PutResult]:
        """Append one message.

        The future resolves once the message is readable through :meth:`get_message` and the flush
        policy says it is durable (``FLUSH_DISK_TIMEOUT`` when the flush did not finish in time).
        Invalid input resolves with ``MESSAGE_ILLEGAL`` / ``PROPERTIES_SIZE_EXCEEDED`` and an error.
        """

    def put_messages(self, msgs: Sequence[MessageInner]) -> Future[PutResult]:
        """Append a batch to one queue atomically, queue offsets consecutive."""

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None = None,
        max_bytes: int = 256 * 1024,
    ) -> GetResult:
        """Read up to ``max_count`` messages of a queue starting at ConsumeQueue ``offset``."""

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """One past the last ConsumeQueue offset (0 for an empty queue)."""

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The first ConsumeQueue offset still stored."""

    def get_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is at or after ``timestamp_ms``."""

    def get_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """Store timestamp of the message at ``offset`` (-1 when absent)."""

    def get_commit_log_offset(self, topic: str, queue_id: int, offset: int) -> int:
        """Commit-log offset of the message at queue ``offset`` (-1 when absent)."""

    def look_message_by_offset(self, commit_log_offset: int, size: int = -1) -> bytes | None:
        """The raw record at a commit-log offset (message id lookups, index queries)."""

    def get_max_phy_offset(self) -> int:
        """End of the commit log."""

    def get_min_phy_offset(self) -> int:
        """Start of the oldest commit-log data still stored."""

    def topics(self) -> dict[str, list[int]]:
        """Topics with consume queues, and their queue ids."""

    def delete_topics(self, topics: Sequence[str]) -> None:
        """Drop the consume queues of the topics (their commit-log records age out)."""


@runtime_checkable
class RawCommitLogStore(MessageStore, Protocol):
    """A store whose commit log replication can stream and append as raw bytes (RocketMQ's HA)."""

    @property
    def commit_log_file_size(self) -> int:
        """Bytes per commit-log file: a replicated batch never crosses a file boundary."""

    def get_commit_log_data(self, offset: int) -> memoryview | None:
        """Raw bytes from ``offset`` to the end of its file (None past the end)."""

    def append_to_commit_log(self, start_offset: int, data: bytes | memoryview) -> bool:
        """Append replicated bytes at the log's end; False (nothing written) when the offset is off."""


@runtime_checkable
class TruncatableStore(RawCommitLogStore, Protocol):
    """A raw commit-log store that can also cut its log back: what an elected replica (controller
    mode) needs to drop what it holds past the point where it agrees with a new master."""

    def truncate_commit_log(self, offset: int) -> int:
        """Cut the commit log back to the last record boundary at or below ``offset``; returns the new end.

        Consume queues and the key index follow, and readers never see the cut bytes.  Called while
        nothing appends (the replication stopped its HA client; the broker takes no sends as a slave).
        """


@runtime_checkable
class StoreIntrospection(Protocol):
    """The figures of a store that admin requests, runtime info and metrics read.

    Implemented by both built-in stores (``mmap``, ``memory``); called by the broker's admin
    processors (GET_BROKER_RUNTIME_INFO's dispatch and flush figures, QUERY_CONSUME_QUEUE,
    CLEAN_EXPIRED_CONSUMEQUEUE) and the metrics exporter.  A store without it still serves; those
    requests then answer with what :class:`MessageStore` alone tells.  The commit-log range and the
    consume-queue ranges are :class:`MessageStore`'s ``get_min/max_phy_offset`` and
    ``get_min/max_offset_in_queue``.  None of these runs on the per-message path.
    """

    def dispatched_offset(self) -> int:
        """Commit-log offset up to which records are dispatched to consume queues and indexes (reput)."""

    def flushed_offset(self) -> int:
        """Commit-log offset up to which bytes are on disk."""

    def queue_entry(self, topic: str, queue_id: int, index: int) -> tuple[int, int, int] | None:
        """(commit-log offset, size, tags code) of consume-queue entry ``index``, None outside the queue."""

    def clean_expired_queues(self) -> int:
        """Drop the consume queues all of whose records are gone; returns how many were dropped."""

    def flush_statistics(self) -> FlushStatistics | None:
        """The flush policy's counters, None when it keeps none."""


#: Per store class: whether it implements :class:`StoreIntrospection` (an isinstance check on a
#: runtime-checkable Protocol costs microseconds; QUERY_CONSUME_QUEUE asks once per entry).
_INTROSPECTABLE: dict[type, bool] = {}


def store_introspection(store: object) -> StoreIntrospection | None:
    """``store`` as a :class:`StoreIntrospection`, or None when its class does not implement it."""
    cls = type(store)
    capable = _INTROSPECTABLE.get(cls)
    if capable is None:
        capable = _INTROSPECTABLE[cls] = isinstance(store, StoreIntrospection)
    return cast("StoreIntrospection", store) if capable else None


@runtime_checkable
class GroupPut(Protocol):
    """A store that takes several puts in one call (optional; issue 38, putmany).

    Who calls it: the broker's send path (``SendService.put`` and the read lane's compiled
    ``put_sends``), with the groups of one read (each the messages of one put: one topic and
    queue, what :meth:`MessageStore.put_messages` takes), instead of one ``put_messages`` per group.
    The ``mmap`` store offers it (one hold of its lock, the groups written with one ``pwrite``);
    a store without it gets one ``put_messages`` per group, as before.  Found on the store's class
    (:func:`group_put`): a wrapper that delegates attributes is not taken for one.
    """

    def put_message_groups(self, groups: Sequence[Sequence[MessageInner]]) -> list[Future[PutResult]]:
        """Put ``groups`` in order; one future per group put, each what ``put_messages(group)``
        would give when the groups are put one after the other: the same records (offsets, queue
        offsets, message ids, bytes), entries, dispatch and :class:`PutResult`, each future
        resolved once its group is durable.

        The list may be shorter than ``groups`` (never empty when ``groups`` is not): the store
        stops right after a group it refused for one of its messages (``MESSAGE_ILLEGAL``,
        ``PROPERTIES_SIZE_EXCEEDED``) and may stop earlier; the groups after the last future are
        not put, and the caller puts them (another call).  Raises only when nothing was put: the
        caller then puts the first group alone.
        """


#: Per store class: whether it implements :class:`GroupPut` (asked once per read on the send path).
_GROUP_PUT: dict[type, bool] = {}


def group_put(
    store: object,
) -> Callable[[Sequence[Sequence[MessageInner]]], list[Future[PutResult]]] | None:
    """``store``'s :meth:`GroupPut.put_message_groups`, or None when its class does not have it."""
    cls = type(store)
    capable = _GROUP_PUT.get(cls)
    if capable is None:
        capable = _GROUP_PUT[cls] = callable(getattr(cls, "put_message_groups", None))
    return cast(GroupPut, store).put_message_groups if capable else None


# --------------------------------------------------------------------------- request lanes
@runtime_checkable
class SendLane(Protocol):
    """A store's request lane for the send codes (issue 38: SEND_MESSAGE, _V2, SEND_BATCH_MESSAGE): a read's
    sends prepared in one call.

    Offered by a store through :class:`RequestLanes` (the ``mmap`` store offers the compiled
    :mod:`tidemq._native._send_lane` unless ``TIDEMQ_NO_EXTENSIONS`` is set; the ``memory`` store
    offers none).  The broker (:mod:`tidemq.broker.lanes`) calls it only where nobody could see a
    difference (no send hook listens, the code is not wrapped, the access check is done) and puts
    what it gives through the same ``SendService.put``/``settled`` as the Python handler; the lane
    answers None for any run it cannot serve exactly as that handler, which then serves the run.
    """

    #: What ``tidemq --version`` and the broker's start-up log say of it.
    description: str

    def prepare_sends(
        self,
        requests: list[RemotingCommand],
        writable_queues: Callable[[str], int],
        cluster: str,
        max_batch: int,
        born_host: tuple[str, int],
        store_host: tuple[str, int],
    ) -> list[Send] | None:
        """The sends of ``requests``, in order, or None: the Python handler serves them all.

        ``writable_queues(topic)``: the topic's queue count when a send to it needs no check beyond
        the queue id, else -1; ``cluster`` is what single sends' CLUSTER property says, and
        ``max_batch`` the most messages a batch may hold (``max_batch_messages``).  Must not change
        anything before deciding (a refusal has no effect).
        """


@runtime_checkable
class SendFrameLane(SendLane, Protocol):
    """A send lane that also has the wire ends (optional): a read's leading send frames to what
    :meth:`prepare_frames` prepares, and their settled sends to the response frames, without a
    command object per request (the mmap store's compiled :mod:`tidemq._native._frame_lane`).

    A frame is ``(code, language, version, opaque, flag, remark, ext_fields, body,
    serialize_type)``, what the codec's decoder would make a command of (:meth:`command_of`).
    """

    def take_frames(self, data: bytes, max_frame: int) -> tuple[list[tuple[object, ...]], int]:
        """The whole send frames at the start of ``data`` the lane reads exactly as the codec's
        decoder, and where they end; none when the first is not one."""

    def prepare_frames(
        self,
        frames: list[tuple[object, ...]],
        writable_queues: Callable[[str], int],
        cluster: str,
        max_batch: int,
        born_host: tuple[str, int],
        store_host: tuple[str, int],
    ) -> list[Send] | None:
        """:meth:`SendLane.prepare_sends` of those frames."""

    def answer_frames(self, frames: list[tuple[object, ...]], sends: list[Send]) -> bytes | None:
        """The settled sends' response frames, byte-equal to the codec's encoding of
        ``send_response``; None when one is not the lane's to write."""

    def command_of(self, frame: tuple[object, ...]) -> RemotingCommand:
        """The command the codec's decoder makes of ``frame``."""


@runtime_checkable
class RequestLanes(Protocol):
    """A store that offers request lanes (optional): asked once, as the broker starts."""

    def send_lane(self) -> SendLane | None:
        """The send lane, or None when this store (or this build) has none."""


def send_lane(store: object) -> SendLane | None:
    """``store``'s send lane, or None when it offers none."""
    if not isinstance(store, RequestLanes):
        return None
    return store.send_lane()


@attrs.frozen(slots=True)
class PulledRecords:
    """What a :class:`PullLane` found for one pull: records taken, as a pull response writes them.

    The same figures as the :class:`GetResult` ``get_message`` gives (FOUND, at least one record)
    for that pull, without an object per message: ``wire`` is ``get_message``'s ``wire_parts``
    (back-to-back records as one chunk: views of the store's files where it maps them).
    """

    next_begin_offset: int
    min_offset: int
    max_offset: int
    message_count: int
    total_size: int
    suggest_pulling_from_slave: bool
    wire: tuple[bytes | memoryview, ...]


@runtime_checkable
class PullLane(Protocol):
    """A store's request lane for PULL_MESSAGE (issue 38): the consume-queue walk and the records'
    checks for one pull in one call, no Python object per message.

    Offered by a store through :class:`PullLanes` (the ``mmap`` store offers the compiled
    :mod:`tidemq._native._pull_lane` unless ``TIDEMQ_NO_EXTENSIONS`` is set; the ``memory`` store
    offers none).  The broker (:mod:`tidemq.broker.pull_lane`) asks it only where nobody could see
    a difference from the Python handler and answers with what it gives; the lane answers None for
    any pull it cannot serve exactly as ``get_message`` would (nothing found, an offset outside the
    queue, a record needing the careful path...), and the Python handler then serves the pull.
    """

    #: What ``tidemq --version`` and the broker's start-up log say of it.
    description: str

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tags: tuple[tuple[int, ...], tuple[bytes, ...]] | None,
    ) -> PulledRecords | None:
        """What ``get_message(group, topic, queue_id, offset, max_count, filter)`` finds when it is FOUND with records, or None (then the broker calls ``get_message``).

        ``tags`` is :func:`tidemq.filter.tag_selection` of a TAG subscription's filter, None for
        one that matches everything.  Must not change anything (a refusal has no effect).
        """


@runtime_checkable
class PullLanes(Protocol):
    """A store that offers a pull lane (optional): asked once, as the broker registers its handlers."""

    def pull_lane(self) -> PullLane | None:
        """The pull lane, or None when this store (or this build) has none."""


def pull_lane(store: object) -> PullLane | None:
    """``store``'s pull lane, or None when it offers none."""
    if not isinstance(store, PullLanes):
        return None
    return store.pull_lane()
