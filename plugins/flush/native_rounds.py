"""The ``sync`` policy's compiled rounds: a flush worker that never takes the GIL.

The group commit's Python flush thread takes the GIL twice a round (to start it, and to resolve
and post its answers after the ``fdatasync``), and the loop it answers is woken through its
self-pipe.  With ``[flush.sync] compiled_rounds`` (on by default) and the compiled
``tidemq_flush._round`` built, a loop's round goes instead:

1. at the loop's *kick* (the batch of one loop iteration, as before) the commit log names the
   round: its file descriptor and the end offset written there
   (:meth:`tidemq.flush.DirectRoundFlushable.direct_round`); the kick posts both to the worker (a
   mutex and a condition variable; requests posted while a round runs merge into the next one);
2. a worker thread (C, no GIL) calls ``fdatasync`` and writes 1 to an eventfd; with
   ``overlap_rounds`` > 1 a request posted while a round runs may start its own round at once
   on another worker, while the sends arrive sparsely (``overlap_max_load``), each round in
   flight on its own open file description of the commit-log file (a second ``open()``, not a
   ``dup``: Linux reports a writeback error once per description, and two ``fdatasync`` calls
   on one description can leave one of them returning 0 over a failed range);
3. the loop watches that eventfd (``loop.add_reader``): its reader takes every round completed
   since its last wake-up, in the order they started (a round is reported only once every
   earlier one completed), records them in the commit log
   (:meth:`~tidemq.flush.DirectRoundFlushable.direct_flushed`), resolves the batches they cover
   and completes their groups on the loop (:func:`tidemq.futures.complete_here`): one callback
   for all of them, no hop through the loop's self-pipe, no GIL taken by another thread.

What it does not take stays on the Python thread, which is also the reference and the fallback
(``TIDEMQ_NO_EXTENSIONS=1``, or not built): writer threads' puts, a round that crosses into the
next file or has a transient buffer to commit, loops other than the first one that kicked, and
rounds whose ``fdatasync`` failed (handed to the thread, which retries them until their deadline
as it retries its own: the same FLUSH_DISK_TIMEOUT), with every batch posted after them that was
not acknowledged yet, even one whose own round returned 0.  The reaper times out overdue batches of
both (a worker stuck in the kernel included); the counters (rounds, seconds, batch sizes) are
kept the same way.  Not with ``loop_gather_us`` (its wait runs on the thread).
"""

from __future__ import annotations

import logging
import os
from asyncio import AbstractEventLoop
from asyncio import _get_running_loop as running_loop
from collections import deque
from typing import TYPE_CHECKING, Any

from tidemq.extensions import compiled_twin
from tidemq.flush import DirectRound, DirectRoundFlushable, Flushable
from tidemq.futures import SharedCompletion, complete_here

if TYPE_CHECKING:
    from .group_commit import GroupCommitFlush, _Batch

log = logging.getLogger(__name__)

#: The compiled worker's module (None: the Python flush thread does every round).
_round = compiled_twin("tidemq_flush._round")


def available() -> bool:
    """Whether the compiled worker is built and allowed (``TIDEMQ_NO_EXTENSIONS`` unset)."""
    return _round is not None


def describe() -> str:
    """Who runs the ``sync`` policy's flush rounds (``tidemq --version``)."""
    if _round is not None:
        return (
            "compiled (tidemq_flush._round: workers fdatasync without the GIL, an eventfd wakes the loop;"
            " up to [flush.sync] overlap_rounds rounds in flight while sends are sparse, each on its own"
            " file description, answered in order; [flush.sync] compiled_rounds)"
        )
    return "the Python flush thread, one round at a time (tidemq_flush._round not built or TIDEMQ_NO_EXTENSIONS=1)"


#: A round of this many messages or more that ends with as many posted and waiting (two cohorts
#: of closed-loop senders) lets the worker's next round gather (``[flush.sync] worker_gather_us``;
#: ``_round``'s GATHER_MIN_MESSAGES): two batched puts of 32; single sends at 2 000 msg/s post ~2
#: during a round.
GATHER_MIN_MESSAGES = 64


def _messages(values: list[Any]) -> int:
    """The messages of a batch's puts (their :class:`PutResult`'s ``message_count``, 1 when the value
    says nothing), counted up to :data:`GATHER_MIN_MESSAGES` (all the worker needs to know)."""
    count = 0
    for value in values:
        count += getattr(value, "message_count", 0) or 1
        if count >= GATHER_MIN_MESSAGES:
            break
    return count


class NativeRounds:
    """The loop side of the compiled worker: posts kicked batches, answers completed rounds."""

    def __init__(
        self,
        policy: GroupCommitFlush,
        target: DirectRoundFlushable,
        slots: int = 1,
        max_load: float = 2.0,
        gather_us: int = 0,
    ) -> None:
        assert _round is not None
        self.policy = policy
        self.target = target
        self.worker: Any = _round.RoundWorker(slots, max_load, gather_us)
        self.worker.start()
        self.slots = slots
        #: The file the per-slot fds are for (its DirectRound token) and those fds: one open file
        #: description of it per round in flight (``slots`` > 1), None: the round's own fd only.
        self._file: object = None
        self._fds: tuple[int, ...] | None = None
        #: Per-slot fds of earlier files: closed once a round posted after them (the seq, 0 until
        #: posted) is reported, every round that could use them having completed before it.
        self._retired: list[list[Any]] = []
        #: The loop whose reader watches the worker's eventfd (the first one that kicked).
        self.loop: AbstractEventLoop | None = None
        #: Batches handed to the worker, in the order posted: (request seq, batch, its round).
        self.posted: deque[tuple[int, _Batch, DirectRound]] = deque()
        self.closed = False
        #: Rounds answered by the loop's reader, and reader wake-ups that answered at least one.
        self.rounds = 0
        self.wakeups = 0

    @classmethod
    def create(cls, policy: GroupCommitFlush, target: Flushable) -> NativeRounds | None:
        if _round is None or not isinstance(target, DirectRoundFlushable):
            return None
        options = policy.options
        gather = options.worker_gather_us if options.overlap_rounds == 1 else 0
        return cls(policy, target, options.overlap_rounds, options.overlap_max_load, gather)

    def batches(self) -> list[_Batch]:
        """Under the policy's lock: the batches posted and not answered yet."""
        return [batch for _seq, batch, _round in self.posted]

    def take(self, loop: AbstractEventLoop, batch: _Batch) -> bool:
        """At ``loop``'s kick, under the policy's lock: post ``batch``'s round to the worker;
        False when the worker cannot take it (the Python thread then flushes it)."""
        if self.closed:
            return False
        if loop is not self.loop and not self._bind(loop):
            return False
        done = self.target.direct_round(batch.end)
        if done is None:
            if self.posted:
                # The Python thread takes this batch (a file switch): a round waiting to gather
                # for it would wait for the whole bound (``worker_gather_us``).
                self.worker.end_gather()
            return False
        fds = self._fds_for(done) if self.slots > 1 else None
        seq = self.worker.post(done[0], done[1], fds, _messages(batch.values))
        if not seq:
            return False  # refused (a request of the previous file waits): its gathering ended
        if self._retired and not self._retired[-1][1]:
            for entry in self._retired:
                entry[1] = entry[1] or seq
        self.posted.append((seq, batch, done))
        return True

    def here(self, loop: AbstractEventLoop, batch: _Batch) -> bool:
        """An inline round (``inline_max_us``, at ``loop``'s kick, the policy's lock not held):
        ``batch``'s ``fdatasync`` on this thread by the compiled worker's :meth:`round_here`, its
        puts answered before this returns (their held reads too); False when the worker cannot
        take it (the Python inline round or the thread then does).  A failed ``fdatasync`` hands
        the batch to the Python thread, which retries it until its deadline."""
        policy = self.policy
        with policy.lock:
            if self.closed or (loop is not self.loop and not self._bind(loop)):
                return False
            done = self.target.direct_round(batch.end)
            if done is None:
                return False
        completed = self.worker.round_here(done[0], done[1])
        if completed is None:
            return False
        err, ns = completed[2], completed[3]
        if err:
            log.error("flush failed: %s", OSError(err, os.strerror(err)))
            with policy.lock:
                policy.round_failed()
                self._to_thread([batch])
            return True
        self.rounds += 1
        self.target.direct_flushed(done)
        policy.round_done(ns / 1e9, len(batch.futures))
        completions: list[SharedCompletion] = []
        batch.resolve(completions)
        complete_here(completions, loop)
        return True

    def _fds_for(self, done: DirectRound) -> tuple[int, ...] | None:
        """The per-slot fds of ``done``'s file (opened again for each slot on its first round:
        each its own open file description), None when they cannot be opened (the worker then
        runs that file's rounds one at a time on the file's own fd)."""
        token = done[3]
        if token is self._file:
            return self._fds
        if self._fds is not None:
            self._retired.append([self._fds, 0])
        self._file, self._fds = token, None
        fds: list[int] = []
        try:
            for _ in range(self.slots):
                # A second open() of the file, not dup(): a new open file description, whose own
                # errseq sees every writeback error of the file once.
                fds.append(os.open(f"/proc/self/fd/{done[0]}", os.O_RDWR | os.O_CLOEXEC))
        except OSError as exc:
            log.info("sync flush: rounds not overlapped on this file (%s)", exc)
            for fd in fds:
                os.close(fd)
            return None
        self._fds = tuple(fds)
        return self._fds

    def _close_retired(self, reported: int) -> None:
        """Close the per-slot fds no round can use any more (a round at or after ``reported``'s
        request reported: every round before it completed)."""
        keep = []
        for entry in self._retired:
            fds, seq = entry
            if seq and seq <= reported:
                for fd in fds:
                    os.close(fd)
            else:
                keep.append(entry)
        self._retired = keep

    def _bind(self, loop: AbstractEventLoop) -> bool:
        """Watch the worker's eventfd from ``loop``: the first loop that kicks, or the next one
        once that loop is closed (its batches not answered yet go to the Python thread)."""
        old = self.loop
        if old is not None and not old.is_closed():
            return False  # another loop's: this one's rounds stay on the thread
        try:
            loop.add_reader(self.worker.fileno(), self._answer)
        except (NotImplementedError, RuntimeError, ValueError, OSError) as exc:
            log.info("sync flush: compiled rounds not used on %r: %s", loop, exc)
            self.closed = True
            return False
        self.loop = loop
        if self.posted:
            self._to_thread(self.batches())
            self.posted.clear()
        return True

    def _to_thread(self, batches: list[_Batch]) -> None:
        """Under the policy's lock: the Python thread flushes (and retries) these."""
        self.policy.requeue(batches)

    def _answer(self) -> None:
        """The loop's reader: every round completed since the last call, answered now."""
        dones = self.worker.drain()
        if not dones:
            return
        policy = self.policy
        answered: list[tuple[list[_Batch], DirectRound | None, int]] = []
        failed: list[_Batch] = []
        broken = False
        with policy.lock:
            posted = self.posted
            for seq, _end, err, ns, _started, _ended in dones:
                covered: list[_Batch] = []
                last: DirectRound | None = None
                while posted and posted[0][0] <= seq:
                    _s, batch, last = posted.popleft()
                    covered.append(batch)
                if err:
                    log.error("flush failed: %s", OSError(err, os.strerror(err)))
                    policy.round_failed()
                    broken = True
                if broken:
                    # This round failed, or an earlier one did: a later round's 0 may cover a range
                    # whose writeback failed, so none of it is acknowledged here.
                    failed += covered
                else:
                    answered.append((covered, last, ns))
            if broken:
                # ... nor by a round still in flight: every batch not acknowledged goes to the
                # thread, which retries until the deadline (FLUSH_DISK_TIMEOUT as before).
                failed += self.batches()
                posted.clear()
                self._to_thread(failed)
        if self._retired:
            self._close_retired(dones[-1][0])
        if not answered:
            return
        target = self.target
        completions: list[SharedCompletion] = []
        for covered, last, ns in answered:
            self.rounds += 1
            if last is None:  # a round of batches answered elsewhere (a loop closed meanwhile)
                policy.count_round(ns / 1e9)
                continue
            target.direct_flushed(last)
            policy.round_done(ns / 1e9, sum(len(batch.futures) for batch in covered))
            for batch in covered:
                batch.resolve(completions)
        self.wakeups += 1
        loop = self.loop
        assert loop is not None
        complete_here(completions, loop)

    def close(self, timeout: float) -> list[_Batch]:
        """Stop the worker once it served what was posted; returns the batches not answered (the
        policy's shutdown flushes and settles them).  Any thread."""
        self.closed = True
        stopped = self.worker.stop(timeout)
        if not stopped:
            log.warning("sync flush: the flush worker did not stop within %.0f s", timeout)
        with self.policy.lock:
            left = self.batches()
            self.posted.clear()
        if stopped:  # no worker can use them any more
            for fds, _seq in self._retired:
                for fd in fds:
                    os.close(fd)
            self._retired = []
            if self._fds is not None:
                for fd in self._fds:
                    os.close(fd)
            self._file, self._fds = None, None
        loop = self.loop
        self.loop = None
        if loop is not None and not loop.is_closed():
            if running_loop() is loop:
                self._detach(loop)
            else:
                try:
                    loop.call_soon_threadsafe(self._detach, loop)
                except RuntimeError:  # closed meanwhile
                    pass
        elif stopped:
            self.worker.close()
        return left

    def _detach(self, loop: AbstractEventLoop) -> None:
        """On the loop: stop watching the eventfd, then close it."""
        try:
            loop.remove_reader(self.worker.fileno())
        finally:
            self.worker.close()
