"""The mmap store's put of several groups in one call (:class:`tidemq.store.GroupPut`; issue 38, putmany).

The read lane stores a read's single sends as one put per queue; each ``put_messages`` takes the
store's lock, picks the file, writes its records with a ``pwrite``, its consume-queue entries,
dispatches them and hands its future to the flush policy: ~6.5 µs of a read's CPU per queue it
touches.  :func:`put_groups` does the same for all of a read's groups at once: each group is
prepared outside the lock as ``put_messages`` prepares it (:meth:`MmapMessageStore._prepare`),
then, under one hold of the lock and with one store timestamp, the groups that fit the current
file are packed back to back and written with one ``pwrite`` (:meth:`CommitLog.append_batches`),
and each group gets, in order, its consume-queue entries, its dispatch and its arrival.  When
every dispatcher takes a call's puts at once and the store's arrival filter is its one map
(:class:`_Effects`; groupdispatch), the call's puts go to each dispatcher in one call before the
lock is released, and each group's arrival is one lookup in the map.

Each group's records, queue offsets, message ids, consume-queue and index entries and
:class:`~tidemq.store.PutResult` are what ``put_messages`` of the groups one after the other gives
(with the same clock): a group that does not fit the rest of the file starts the next one after
the blank end marker, as alone.  The effects keep their order: every group's records precede its
entries, and groups are published in the call's order.  Where a put would fail in the middle (a
queue file or the commit log not writable), the groups from there on go through
``put_messages`` one by one, so a failure looks exactly as it does there.

The call stops right after a group refused for one of its messages (``MESSAGE_ILLEGAL``,
``PROPERTIES_SIZE_EXCEEDED``): the broker redoes such a group in halves before the next ones
(``tidemq.broker.services.put.store_groups``), so the order of the puts stays that of one put per
group.

:func:`put_groups` runs the compiled twin of :func:`put_groups_py` when it is built
(``tidemq_store_mmap._group_put``, issue 38 groupc: the prepare's checks, the plan, the
consume-queue entries and the results of a call's groups without the interpreter; the same effects
and results); :func:`put_groups_py` stays the reference and the fallback (``TIDEMQ_NO_EXTENSIONS=1``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import attrs

from tidemq.delay import SCHEDULE_TOPIC
from tidemq.extensions import compiled_twin
from tidemq.futures import StoreFuture
from tidemq.message import MessageInner
from tidemq.names import InvalidNameError
from tidemq.store import DispatchedPut, PutResult, PutStatus

from .commitlog import END_FILE_MIN_BLANK_LENGTH, BatchesEncodeError, CommitLogFullError, RecordEncodeError
from .reput import log as _reput_log

if TYPE_CHECKING:
    from .consume_queue import ConsumeQueue
    from .mapped_file import MappedFile
    from .store import MmapMessageStore, _Prepared

log = logging.getLogger(__name__)

_PUT_OK = PutStatus.PUT_OK
#: Refusals caused by one message: the call stops after such a group (the caller may redo it).
STOPS = frozenset((PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED))
_FLUSH_DISK_TIMEOUT = PutStatus.FLUSH_DISK_TIMEOUT

#: One planned group of a run: its place in the call, its prepared put, its consume queue (None:
#: no entries), queue offset, offset step, tags codes and position in the file.
_Planned = tuple[int, "_Prepared", "ConsumeQueue | None", int, int, list[int], int]


class _Effects:
    """A call's dispatch and arrivals done for the call, not per group (issue 38, groupdispatch).

    Taken when every dispatcher of the store takes a call's puts at once
    (:class:`tidemq.store.GroupDispatcher`: the ``hash`` index, the SQL92 bit map) and the
    store's arrival filter is its one map (:meth:`ArrivalNotifier.waited`, or no listener): each
    group written adds its put to :attr:`puts` and looks its arrival up in :attr:`waited` (one
    dict lookup, no call when nobody waits on the topic); :meth:`dispatch` hands :attr:`puts` to
    each dispatcher once, before the lock is released (so before any later put, and before the
    arrivals are delivered: the notifier's thread takes the lock).  Each dispatcher sees the puts
    in commit-log order, as it would one ``dispatch_batch`` per group.
    """

    __slots__ = ("calls", "puts", "waited")

    def __init__(
        self,
        calls: list[Callable[[Sequence[DispatchedPut]], None]],
        waited: Mapping[str, Any] | None,
    ) -> None:
        self.calls = calls
        self.waited = waited
        self.puts: list[DispatchedPut] = []

    def dispatch(self) -> None:
        puts = self.puts
        for call in self.calls:
            try:
                call(puts)
            except Exception:
                _reput_log.exception("dispatcher %r failed", getattr(call, "__self__", call))


def _effects(store: MmapMessageStore) -> _Effects | None:
    """The call's :class:`_Effects`, or None: the store dispatches nothing (no dispatcher, no
    listener), or a dispatcher or a listener's filter wants the per-group calls."""
    if not store._needs_dispatch:
        return None
    reput = store.reput
    calls = reput.group_calls()
    if calls is None:
        return None
    if not reput.listeners:
        return _Effects(calls, None)
    waited = reput.notifier.waited()
    if waited is None:
        return None
    return _Effects(calls, waited)


def put_groups(store: MmapMessageStore, groups: Sequence[Sequence[MessageInner]]) -> list[Future[PutResult]]:
    """:meth:`MmapMessageStore.put_message_groups`: one future per group put, in order (see the
    module's text); raises only when nothing was put (the first group's preparation raised).

    The compiled twin (:data:`compiled`, ``tidemq_store_mmap._group_put``; groupc) when built and
    allowed, else :func:`put_groups_py`, the reference: the same effects and results."""
    twin = compiled
    if twin is not None:
        return cast("list[Future[PutResult]]", twin.put_groups(store, groups))
    return put_groups_py(store, groups)


def put_groups_py(
    store: MmapMessageStore, groups: Sequence[Sequence[MessageInner]]
) -> list[Future[PutResult]]:
    """:func:`put_groups` in Python: the reference and the fallback (``TIDEMQ_NO_EXTENSIONS=1``).

    ``_group_put.pyx`` follows it (and :func:`_plan`, :func:`_write_run`) step for step: change
    both together (``tests/test_group_put_compiled.py`` holds them equal)."""
    n = len(groups)
    if n == 0:
        return []
    prepared: list[PutResult | _Prepared] = []
    stop = n  # groups [0, stop) are this call's
    prepare = store._prepare
    for k in range(n):
        try:
            p = prepare(groups[k])
        except Exception:
            if k == 0:
                raise
            stop = k  # the caller puts it (alone: its put raises there)
            break
        prepared.append(p)
        if isinstance(p, PutResult) and p.status in STOPS:
            stop = k + 1
            break
    results: list[PutResult | None] = [None] * stop
    placed: list[tuple[int, Any, bool, int, list[int]] | None] = [None] * stop
    alone = stop  # from here on, groups go through put_messages one by one
    with store._lock:
        if not store._running:
            for k in range(stop):
                results[k] = store._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
        else:
            alone, stop = _locked(store, prepared, results, placed, stop)
    encoder = store._encoder
    put_result = getattr(encoder, "put_result", None)  # the compiled encoder's
    done: list[PutResult] = []  # the call's groups up to the last written or refused, in order
    last: PutResult | None = None  # the last group written
    for k in range(min(alone, stop)):
        where = placed[k]
        if where is None:
            result = results[k]
            assert result is not None
            done.append(result)
            if result.status in STOPS:  # refused while packing: the call ends after it
                alone = stop = k + 1
                break
            continue
        queue_offset, batch, compiled, ts, offsets = where
        if compiled and put_result is not None:
            result = put_result(PutResult, _PUT_OK, batch, queue_offset, ts)
        else:
            result = PutResult(
                _PUT_OK,
                wrote_offset=offsets[0],
                wrote_bytes=batch.total,
                queue_offset=queue_offset,
                msg_ids=encoder.message_ids(offsets),
                store_timestamp=ts,
                message_count=len(offsets),
            )
        done.append(result)
        last = result
    completed = StoreFuture.completed
    out: list[Future[PutResult]] = (
        _hand_to_flush(store, done, last) if last is not None else [completed(r) for r in done]
    )
    for k in range(alone, stop):
        fut = store.put_messages(groups[k])
        out.append(fut)
        if fut.done() and fut.exception() is None and fut.result().status in STOPS:
            break
    return out


def _hand_to_flush(
    store: MmapMessageStore, done: list[PutResult], last: PutResult
) -> list[Future[PutResult]]:
    """A future for each of ``done`` (the call's results in order: the groups written, status
    ``PUT_OK``, are resolved once durable; the refusals at once).

    A policy that flushes in rounds (group commit) gets each group's future, as it gets each
    put's: its rounds gather futures (and the read lane answers a read with its round).  Any other
    policy is asked once, for the end of ``last`` (the call's last group written: every group's
    bytes lie before it): the groups' futures are resolved with its answer, at once when it answers
    at once (async flush).
    """
    submit = store._flush_submit
    completed = StoreFuture.completed
    if store._flush_rounds:
        return [
            _durable(store, submit, StoreFuture(), r) if r.status is _PUT_OK else completed(r) for r in done
        ]
    end = last.wrote_offset + last.wrote_bytes
    flushed: Future[bool]
    if submit is not None:
        flushed = StoreFuture()
        submit(end, flushed, True, _not_durable)
    else:
        flushed = store.flush_policy.request(end)
    if flushed.done():
        if not flushed.cancelled() and flushed.exception() is None and flushed.result():
            return [completed(r) for r in done]
        return [
            completed(attrs.evolve(r, status=_FLUSH_DISK_TIMEOUT) if r.status is _PUT_OK else r) for r in done
        ]
    out: list[Future[PutResult]] = []
    pending: list[tuple[StoreFuture[PutResult], PutResult]] = []
    for r in done:
        if r.status is _PUT_OK:
            fut: StoreFuture[PutResult] = StoreFuture()
            out.append(fut)
            pending.append((fut, r))
        else:
            out.append(completed(r))

    def resolve(f: Future[bool]) -> None:
        ok = not f.cancelled() and f.exception() is None and f.result()
        for fut, result in pending:
            fut.set_result(result if ok else attrs.evolve(result, status=_FLUSH_DISK_TIMEOUT))

    flushed.add_done_callback(resolve)
    return out


def _not_durable() -> bool:
    return False


def _durable(
    store: MmapMessageStore, submit: Any, fut: Future[PutResult], result: PutResult
) -> Future[PutResult]:
    """``fut`` handed to the flush policy for ``result``'s end, as :meth:`MmapMessageStore.put_messages` does."""
    end = result.wrote_offset + result.wrote_bytes
    if submit is not None:
        submit(end, fut, result, lambda: attrs.evolve(result, status=_FLUSH_DISK_TIMEOUT))
        return fut
    flushed = store.flush_policy.request(end)

    def done(f: Future[bool]) -> None:
        ok = not f.cancelled() and f.exception() is None and f.result()
        fut.set_result(result if ok else attrs.evolve(result, status=_FLUSH_DISK_TIMEOUT))

    if flushed.done():
        done(flushed)
    else:
        flushed.add_done_callback(done)
    return fut


def _locked(
    store: MmapMessageStore,
    prepared: list[PutResult | _Prepared],
    results: list[PutResult | None],
    placed: list[tuple[int, Any, bool, int, list[int]] | None],
    stop: int,
) -> tuple[int, int]:
    """The groups written under the lock: runs of groups that fit the current file, each run
    packed and written at once, then published group by group.  Returns ``(alone, stop)``: the
    first group left to ``put_messages`` one by one, and the end of the call's groups."""
    effects = _effects(store)
    try:
        return _plan(store, prepared, results, placed, stop, effects)
    finally:
        if effects is not None and effects.puts:
            effects.dispatch()


def _plan(
    store: MmapMessageStore,
    prepared: list[PutResult | _Prepared],
    results: list[PutResult | None],
    placed: list[tuple[int, Any, bool, int, list[int]] | None],
    stop: int,
    effects: _Effects | None,
) -> tuple[int, int]:
    """:func:`_locked`'s work (the dispatch of ``effects`` is left to it)."""
    commitlog = store.commitlog
    cqs = store.cqs
    reput = store.reput
    ts = time.time_ns() // 1_000_000
    run: list[_Planned] = []
    mf: MappedFile | None = None
    pos = 0
    # Queue offsets given in this call, per consume queue (two groups may share a queue: a group
    # cut at the broker's size bound, or another transaction type).
    next_offset: dict[ConsumeQueue, int] = {}
    k = 0
    while k < stop:
        p = prepared[k]
        if isinstance(p, PutResult):
            results[k] = p
            k += 1
            continue
        prep = p
        msgs, batch, _compiled, topic, queue_id, consumable = prep
        total = batch.total
        try:
            cq = cqs.for_write(topic, queue_id) if consumable else None
            if mf is None or pos + total + END_FILE_MIN_BLANK_LENGTH > mf.file_size:
                if run:
                    done = _write_run(store, mf, run, results, placed, ts, effects)
                    run = []
                    if done >= 0:
                        return done, stop
                mf = commitlog.file_for(total)
                pos = mf.wrote_position
        except (CommitLogFullError, InvalidNameError) as exc:
            if run:
                done = _write_run(store, mf, run, results, placed, ts, effects)
                if done >= 0:
                    return done, stop
            results[k] = store._illegal(str(exc))
            return k + 1, k + 1
        except OSError as exc:
            if run:
                done = _write_run(store, mf, run, results, placed, ts, effects)
                if done >= 0:
                    return done, stop
            results[k] = store.cleaner.create_failed(exc)
            return k + 1, stop
        if cq is not None:
            queue_offset = next_offset.get(cq, -1)
            if queue_offset < 0:
                queue_offset = cq.max_offset_in_queue
            next_offset[cq] = queue_offset + len(batch.sizes)
            step = 1
        else:
            queue_offset = step = 0
        tags = batch.tags_codes
        if topic == SCHEDULE_TOPIC and cq is not None:
            tags = [reput.schedule_tags(m.properties, ts, t) for m, t in zip(msgs, tags, strict=True)]
        run.append((k, prep, cq, queue_offset, step, tags, pos))
        pos += total
        k += 1
    if run:
        done = _write_run(store, mf, run, results, placed, ts, effects)
        if done >= 0:
            return done, stop
    return stop, stop


def _write_run(
    store: MmapMessageStore,
    mf: MappedFile | None,
    run: list[_Planned],
    results: list[PutResult | None],
    placed: list[tuple[int, Any, bool, int, list[int]] | None],
    ts: int,
    effects: _Effects | None,
) -> int:
    """Write ``run``'s records (one write) and publish its groups in order; -1 when all went
    well, else the first group left to ``put_messages`` (a group refused while packing is the
    last of the call: ``results`` holds its refusal and the call's ``stop`` is after it)."""
    assert mf is not None
    commitlog = store.commitlog
    encoder = store._encoder
    try:
        if len(run) == 1:
            k, p, cq, queue_offset, step, tags, start = run[0]
            try:
                per_group = [commitlog.append_records(mf, encoder, p[1], queue_offset, ts, step)]
            except RecordEncodeError as exc:
                raise BatchesEncodeError(0, str(exc)) from exc
        else:
            per_group = commitlog.append_batches(mf, encoder, [(r[1][1], r[3], r[4]) for r in run], ts)
    except BatchesEncodeError as exc:
        # Nothing written: the groups before it are written (again, at the same places), it is
        # refused, and the call ends after it (a one-message refusal).
        bad = run[exc.index][0]
        if exc.index > 0:
            done = _write_run(store, mf, run[: exc.index], results, placed, ts, effects)
            if done >= 0:
                return done
        results[bad] = store._illegal(str(exc))
        return bad + 1
    except OSError as exc:
        # Nothing published.  As put_messages would: the first group's write fails and reports
        # it; the others go one by one (the store checks the disk again for each).
        results[run[0][0]] = store.cleaner.write_failed(mf.path.name, exc)
        return run[0][0] + 1
    cqs = store.cqs
    reput = store.reput
    dispatch = store._needs_dispatch and effects is None
    # Reput.dispatch's calls, made here for each group (one call fewer per group).
    calls = reput.batch_calls() if dispatch else None
    arrived = reput.notifier.arrived if dispatch and reput.listeners else None
    puts = effects.puts if effects is not None else None
    waited = effects.waited if effects is not None else None
    base0 = mf.file_from_offset
    for i, (k, p, cq, queue_offset, _step, tags, start) in enumerate(run):
        msgs, batch, compiled, topic, queue_id, _consumable = p
        offsets = per_group[i]
        base = base0 + start
        total = batch.total
        sizes = batch.sizes
        if cq is not None:
            try:
                cq.put_records(offsets, sizes, tags, queue_offset, base, total, batch if compiled else None)
            except OSError as exc:
                # As put_messages: this group's records (and the run's after it) taken back, this
                # group refused; the rest go one by one.
                try:
                    commitlog.rollback(mf, start)
                except OSError as wipe:
                    log.error("cannot take back the record at %d: %s", base, wipe)
                log.error("cannot write the queue entry of %s-%d: %s", topic, queue_id, exc)
                results[k] = store.cleaner.create_failed(exc)
                return k + 1
        mf.store_timestamp = ts
        reput.reput_from = base + total
        if cq is not None:
            cqs.last_entry_ts = ts
        if puts is not None:
            # The call's effects (_Effects): this put joins the call's dispatch, its arrival is
            # looked up in the store's one map of waited-on queues.
            if compiled:
                properties, sys_flags = batch.properties, batch.sys_flags
            else:
                properties = [m.properties for m in msgs]
                sys_flags = [m.sys_flag for m in msgs]
            if cq is not None:
                puts.append((topic, queue_id, properties, offsets, sizes, tags, ts, queue_offset, sys_flags))
                if waited is not None:
                    w = waited.get(topic)
                    if w is not None and (w is True or queue_id in w):
                        reput.notifier.note(topic, queue_id, queue_offset + len(offsets))
            else:
                puts.append((topic, queue_id, properties, offsets, sizes, tags, ts, -1, sys_flags))
        elif dispatch:
            if compiled and calls is not None:
                properties, sys_flags = batch.properties, batch.sys_flags
                first_offset = queue_offset if cq is not None else -1
                for call in calls:
                    try:
                        call(topic, queue_id, properties, offsets, sizes, tags, ts, first_offset, sys_flags)
                    except Exception:
                        _reput_log.exception("dispatcher %r failed", getattr(call, "__self__", call))
                if arrived is not None and cq is not None:
                    arrived(topic, queue_id, queue_offset + len(offsets))
            elif cq is not None:
                columns = (batch.properties, batch.sys_flags) if compiled else None
                reput.dispatch(msgs, offsets, sizes, tags, ts, queue_offset, True, columns)
            else:
                columns = (batch.properties, batch.sys_flags) if compiled else None
                reput.dispatch(msgs, offsets, sizes, tags, ts, -1, False, columns)
        placed[k] = (queue_offset, batch, compiled, ts, offsets)
    return -1


#: The compiled twin of :func:`put_groups_py` (issue 38, groupc), None when not built or
#: ``TIDEMQ_NO_EXTENSIONS=1``.  Chosen last: it imports this module's helpers.
_TWIN = "tidemq_store_mmap._group_put"
compiled: ModuleType | None = compiled_twin(_TWIN)


def describe() -> str:
    """One line for ``tidemq --version``: which put of a call's groups the mmap store runs."""
    if compiled is not None:
        return f"compiled ({_TWIN}: the prepare's checks, plan, queue entries and results of a call's groups)"
    from tidemq.extensions import twins

    reason = next((t.reason for t in twins() if t.module == _TWIN), "not built")
    return f"Python (tidemq_store_mmap.group_put: {reason})"
