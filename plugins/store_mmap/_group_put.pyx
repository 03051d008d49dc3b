# cython: language_level=3
"""The mmap store's put of a call's groups, compiled (issue 38, groupc).

The twin of :func:`tidemq_store_mmap.group_put.put_groups_py`, which stays the reference and the
fallback (``TIDEMQ_NO_EXTENSIONS=1``): the same effects in the same order, the same results.  What
it takes out of the interpreter, per group of a call: the prepare's wrapper (the checks of
``MmapMessageStore._prepare`` around the compiled ``encoder.prepare``; the store-wide ones, running,
disk full and compression, once per call), the plan (the consume queue looked up in the store's
table, its max offset read from its last file, the file check), the publish (the consume queue's
entries: a single record's ``put``, or the compiled batch's entries packed straight into the
queue's mapping as ``ConsumeQueue.put_prepared`` does, checked the same way) and the results.  The
store keeps its state in its Python objects: this module reads and updates them as the Python code
does, under the same lock.  Anything unusual goes the reference's way: a store that compresses, is
not running or has a full disk prepares each group with ``_prepare``; a group whose prepare fails
or is refused is prepared again by ``_prepare`` (which gives the refusal); failures while writing
are handled as there (the same helpers).
"""

from tidemq.delay import SCHEDULE_TOPIC
from tidemq.message import TRANSACTION_TYPE_MASK
from tidemq.names import InvalidNameError
from tidemq.store import PutResult, PutStatus

from .commitlog import (
    COMPILED_BATCH,
    END_FILE_MIN_BLANK_LENGTH,
    BatchesEncodeError,
    CommitLogFullError,
    RecordEncodeError,
)
from .consume_queue import CQ_STORE_UNIT_SIZE
from .reput import NOT_CONSUMABLE
from .reput import log as _reput_log

_PUT_OK = PutStatus.PUT_OK
_STOPS = frozenset((PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED))
cdef object _COMPILED_BATCH = COMPILED_BATCH
cdef long long _UNIT = CQ_STORE_UNIT_SIZE
cdef long long _END_BLANK = END_FILE_MIN_BLANK_LENGTH
cdef int _TX_MASK = TRANSACTION_TYPE_MASK
cdef tuple _NOT_CONSUMABLE = tuple(NOT_CONSUMABLE)

_py = None  # tidemq_store_mmap.group_put (bound on first use: it imports this module)


cdef object _reference():
    global _py
    if _py is None:
        from . import group_put

        _py = group_put
    return _py


cdef object _prepare_one(object store, object prepare, object encoder, object msgs):
    """``store._prepare(msgs)`` for a store that is running, has room and does not compress."""
    cdef Py_ssize_t n = len(msgs)
    if n == 0:
        return prepare(msgs)
    first = msgs[0]
    topic = first.topic
    queue_id = first.queue_id
    if not topic or queue_id < 0:
        return prepare(msgs)
    try:
        batch = encoder.prepare(msgs)
    except Exception:
        return prepare(msgs)  # the refusal (or the raise) the reference gives
    if type(batch) is not _COMPILED_BATCH or (n > 1 and not batch.uniform):
        return prepare(msgs)
    cdef int sys_flag = first.sys_flag
    consumable = (sys_flag & _TX_MASK) not in _NOT_CONSUMABLE
    return (msgs, batch, True, topic, queue_id, consumable)


def put_groups(store, groups):
    """:meth:`MmapMessageStore.put_message_groups` (see :mod:`.group_put`)."""
    cdef Py_ssize_t n = len(groups)
    cdef Py_ssize_t k, stop, alone
    if n == 0:
        return []
    py = _reference()
    cdef list prepared = []
    stop = n
    prepare = store._prepare
    encoder = store._encoder
    fast = (
        _COMPILED_BATCH is not None
        and store._running
        and not store.cleaner.disk_full
        and store.options.compression == "none"
    )
    for k in range(n):
        try:
            if fast:
                p = _prepare_one(store, prepare, encoder, groups[k])
            else:
                p = prepare(groups[k])
        except Exception:
            if k == 0:
                raise
            stop = k
            break
        prepared.append(p)
        if type(p) is PutResult and p.status in _STOPS:
            stop = k + 1
            break
    cdef list results = [None] * stop
    cdef list placed = [None] * stop
    alone = stop
    with store._lock:
        if not store._running:
            for k in range(stop):
                results[k] = store._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
        else:
            effects = py._effects(store)
            try:
                alone, stop = _plan(store, prepared, results, placed, stop, effects)
            finally:
                if effects is not None and effects.puts:
                    effects.dispatch()
    put_result = getattr(encoder, "put_result", None)
    cdef list done = []
    last = None
    cdef Py_ssize_t end = alone if alone < stop else stop
    for k in range(end):
        where = placed[k]
        if where is None:
            result = results[k]
            done.append(result)
            if result.status in _STOPS:
                alone = stop = k + 1
                break
            continue
        queue_offset, batch, compiled, ts, offsets = <tuple>where
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
    cdef list out
    if last is not None:
        out = py._hand_to_flush(store, done, last)
    else:
        completed = py.StoreFuture.completed
        out = [completed(r) for r in done]
    for k in range(alone, stop):
        fut = store.put_messages(groups[k])
        out.append(fut)
        if fut.done() and fut.exception() is None and fut.result().status in _STOPS:
            break
    return out


cdef tuple _plan(object store, list prepared, list results, list placed, Py_ssize_t stop, object effects):
    """``group_put._plan``: the groups planned in runs that fit the current file, each run written
    and published by :func:`_write_run`; ``(alone, stop)``."""
    commitlog = store.commitlog
    cqs = store.cqs
    cdef dict table = cqs.queues
    reput = store.reput
    ts = _py.time.time_ns() // 1_000_000  # group_put's clock (tests fix it there)
    cdef list run = []
    mf = None
    cdef long long pos = 0
    cdef long long total
    cdef long long file_size = 0
    cdef long long queue_offset
    cdef long long step
    cdef Py_ssize_t k = 0
    cdef Py_ssize_t done
    cdef dict next_offset = {}
    cdef tuple prep
    while k < stop:
        p = prepared[k]
        if type(p) is not tuple:
            results[k] = p
            k += 1
            continue
        prep = <tuple>p
        msgs, batch, _compiled, topic, queue_id, consumable = prep
        total = batch.total
        try:
            if consumable:
                queues = table.get(topic)
                cq = (<dict>queues).get(queue_id) if queues is not None else None
                if cq is None:
                    cq = cqs.for_write(topic, queue_id)
            else:
                cq = None
            if mf is None or pos + total + _END_BLANK > file_size:
                if run:
                    done = _write_run(store, mf, run, results, placed, ts, effects)
                    run = []
                    if done >= 0:
                        return done, stop
                mf = commitlog.file_for(total)
                pos = mf.wrote_position
                file_size = mf.file_size
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
            got = next_offset.get(cq)
            if got is None:
                files = cq.queue.files  # ConsumeQueue.max_offset_in_queue, inline
                if files:
                    last_file = files[-1]
                    queue_offset = (last_file.file_from_offset + last_file.wrote_position) // _UNIT
                else:
                    queue_offset = 0
            else:
                queue_offset = got
            next_offset[cq] = queue_offset + len(batch.sizes)
            step = 1
        else:
            queue_offset = step = 0
        tags = batch.tags_codes
        if cq is not None and topic == SCHEDULE_TOPIC:
            tags = [reput.schedule_tags(m.properties, ts, t) for m, t in zip(msgs, tags, strict=True)]
        run.append((k, prep, cq, queue_offset, step, tags, pos))
        pos += total
        k += 1
    if run:
        done = _write_run(store, mf, run, results, placed, ts, effects)
        if done >= 0:
            return done, stop
    return stop, stop


cdef bint _put_prepared_fast(object cq, object batch, object tags, long long first_cq_offset,
                            long long first_end, long long last_end) except -1:
    """``ConsumeQueue.put_prepared``'s packing straight into the mapping, under its checks;
    False when they do not hold (the caller then calls ``put_prepared``, which checks again)."""
    last = cq._zeroed_mf
    if last is None:
        return False
    files = cq.queue.files
    if not files or files[-1] is not last:
        return False
    cdef long long pos = last.wrote_position
    cdef long long end = pos + 20 * len(batch)
    if (
        last.file_from_offset + pos == first_cq_offset * _UNIT
        and first_end > cq.max_physic_offset
        and end <= cq._zeroed_to
        and end <= last.reserved
        and batch.cq_entries_into(last.mm, pos, tags) > 0
    ):
        last.wrote_position = last.committed_position = end
        cq.max_physic_offset = last_end
        return True
    return False


cdef Py_ssize_t _write_run(object store, object mf, list run, list results, list placed, object ts,
                           object effects) except -2:
    """``group_put._write_run``: the run's records written (one write) and its groups published in
    order; -1 when all went well, else the first group left to ``put_messages``."""
    commitlog = store.commitlog
    encoder = store._encoder
    cdef Py_ssize_t i, k, n_run = len(run)
    cdef long long base0, base, total, start, queue_offset
    cdef Py_ssize_t done, bad
    try:
        if n_run == 1:
            k, p, cq, queue_offset, step, tags, start = <tuple>run[0]
            try:
                per_group = [commitlog.append_records(mf, encoder, p[1], queue_offset, ts, step)]
            except RecordEncodeError as exc:
                raise BatchesEncodeError(0, str(exc)) from exc
        else:
            per_group = commitlog.append_batches(mf, encoder, [(r[1][1], r[3], r[4]) for r in run], ts)
    except BatchesEncodeError as exc:
        bad = run[exc.index][0]
        if exc.index > 0:
            done = _write_run(store, mf, run[: exc.index], results, placed, ts, effects)
            if done >= 0:
                return done
        results[bad] = store._illegal(str(exc))
        return bad + 1
    except OSError as exc:
        results[run[0][0]] = store.cleaner.write_failed(mf.path.name, exc)
        return run[0][0] + 1
    cqs = store.cqs
    reput = store.reput
    needs_dispatch = store._needs_dispatch
    dispatch = needs_dispatch and effects is None
    calls = reput.batch_calls() if dispatch else None
    arrived = reput.notifier.arrived if dispatch and reput.listeners else None
    puts = effects.puts if effects is not None else None
    waited = effects.waited if effects is not None else None
    base0 = mf.file_from_offset
    cdef list item
    for i in range(n_run):
        k, p, cq, queue_offset, _step, tags, start = <tuple>run[i]
        msgs, batch, compiled, topic, queue_id, _consumable = <tuple>p
        offsets = per_group[i]
        base = base0 + start
        total = batch.total
        sizes = batch.sizes
        if cq is not None:
            try:
                if len(offsets) == 1:
                    cq.put(base, total, tags[0], queue_offset)
                elif compiled:
                    if not _put_prepared_fast(cq, batch, tags, queue_offset, base + sizes[0], base + total):
                        cq.put_packed(batch.cq_entries(tags), queue_offset, base + sizes[0], base + total)
                else:
                    cq.put_records(offsets, sizes, tags, queue_offset, base, total, None)
            except OSError as exc:
                try:
                    commitlog.rollback(mf, start)
                except OSError as wipe:
                    _reference().log.error("cannot take back the record at %d: %s", base, wipe)
                _reference().log.error("cannot write the queue entry of %s-%d: %s", topic, queue_id, exc)
                results[k] = store.cleaner.create_failed(exc)
                return k + 1
        mf.store_timestamp = ts
        reput.reput_from = base + total
        if cq is not None:
            cqs.last_entry_ts = ts
        if puts is not None:
            if compiled:
                properties, sys_flags = batch.properties, batch.sys_flags
            else:
                properties = [m.properties for m in msgs]
                sys_flags = [m.sys_flag for m in msgs]
            if cq is not None:
                (<list>puts).append((topic, queue_id, properties, offsets, sizes, tags, ts, queue_offset, sys_flags))
                if waited is not None:
                    w = waited.get(topic)
                    if w is not None and (w is True or queue_id in w):
                        reput.notifier.note(topic, queue_id, queue_offset + len(offsets))
            else:
                (<list>puts).append((topic, queue_id, properties, offsets, sizes, tags, ts, -1, sys_flags))
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
