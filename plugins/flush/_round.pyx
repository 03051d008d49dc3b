# cython: language_level=3, boundscheck=False, wraparound=False
"""The group commit's flush workers without the GIL: pthreads that ``fdatasync`` and tell the loop.

The ``sync`` flush policy's compiled rounds (docs/flush.md, "A round without the GIL" and
"Overlapping rounds"): the event loop posts ``(fd, end offset)`` (:meth:`RoundWorker.post`, a mutex
and a condition variable, no GIL wait on either side); a worker thread, which never takes the GIL,
takes the latest request, calls ``fdatasync`` and writes 1 to an eventfd that the loop watches
(``loop.add_reader``).  The loop's reader (:meth:`RoundWorker.drain`) gets every round completed
since its last call, in the order they started: one wake-up answers them all.  Requests posted
while a round runs merge (the largest end wins) into the next round, which starts as soon as the
running one returns, or at once on another worker (``slots`` > 1, at most that many rounds in
flight, each on its own fd) when sends arrive sparsely.

The Python reference is the policy's flush thread (``tidemq_flush.group_commit``): it runs when this
module is not built, with ``TIDEMQ_NO_EXTENSIONS=1``, and for every round these workers cannot take.
"""

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.errno cimport errno, EINTR, ETIMEDOUT

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int, timespec *)
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *, void *)
    int pthread_mutex_destroy(pthread_mutex_t *)
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)
    int pthread_cond_init(pthread_cond_t *, void *)
    int pthread_cond_destroy(pthread_cond_t *)
    int pthread_cond_wait(pthread_cond_t *, pthread_mutex_t *)
    int pthread_cond_timedwait(pthread_cond_t *, pthread_mutex_t *, const timespec *)
    int pthread_cond_signal(pthread_cond_t *)
    int pthread_cond_broadcast(pthread_cond_t *)
    int pthread_create(pthread_t *, void *, void *(*)(void *) noexcept nogil, void *)
    int pthread_setname_np(pthread_t, const char *)
    pthread_t pthread_self()

cdef extern from * nogil:
    """
    #include <pthread.h>
    #include <time.h>
    /* Join with a deadline (glibc's pthread_timedjoin_np); 0 when joined. */
    static int tidemq_timedjoin(pthread_t t, double seconds) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)((seconds - (long long)seconds) * 1e9);
        ts.tv_sec += (time_t)seconds + (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        return pthread_timedjoin_np(t, NULL, &ts);
    }
    """
    int tidemq_timedjoin(pthread_t, double)

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int, int)
    int EFD_NONBLOCK
    int EFD_CLOEXEC

cdef extern from "<unistd.h>" nogil:
    ctypedef long ssize_t
    int fdatasync(int)
    ssize_t read(int, void *, size_t)
    ssize_t write(int, const void *, size_t)
    int close(int)

cdef enum:
    RING = 1024  # rounds kept for the loop's next drain (the counters never lose one)
    MAX_SLOTS = 8  # rounds in flight at most (one worker thread and one fd each)
    GATHER_MIN_MESSAGES = 64  # a round of this many messages or more lets the next one gather
    GATHER_MISSES = 3  # gathering waits in a row that timed out before it pauses ...
    GATHER_SKIP_AFTER_MISS = 8  # ... for this many rounds, twice as many each further time ...
    GATHER_SKIP_MAX = 256  # ... up to this many


cdef struct Done:
    uint64_t seq
    int64_t end
    int err
    int done
    int64_t ns
    int64_t started
    int64_t ended


cdef struct State:
    pthread_mutex_t mu
    pthread_cond_t cv     # idle workers wait here (a post signals one)
    pthread_cond_t hold_cv  # a held round waits here (tests)
    int efd
    int stop
    int slots             # rounds in flight at most (worker threads)
    int req_key           # the file of the request (its first fd): requests merge per file
    int req_single        # the request has one fd for all slots: no second round beside it
    int req_fds[MAX_SLOTS]  # the request's fd for each slot (each its own open file description)
    int64_t req_end
    uint64_t req_seq      # the last request posted
    uint64_t taken_seq    # the last request a round took
    uint64_t started_count  # rounds taken (their ring entries: started_count - 1 down)
    uint64_t done_count   # rounds completed, in the order taken (a prefix: every earlier one done)
    uint64_t read_count   # rounds handed to drain()
    uint64_t overlapped   # rounds started while another was in flight
    uint64_t here_rounds  # rounds run on the caller's thread (round_here: an inline round)
    int inflight          # rounds whose fdatasync runs
    unsigned int busy_slots  # bit i: slot i's fd in use by a round
    unsigned int held_slots  # bit i: a round in slot i waits before its fdatasync (tests)
    int signalled         # the eventfd written since the loop's last drain (one write is enough)
    double max_load       # overlap only while fsync_avg < max_load * gap_avg
    double fsync_avg      # recent fdatasync time, ns (EWMA, 1/8)
    double gap_avg        # recent time between posts, ns (EWMA, 1/8)
    int64_t last_post
    # Gathering (``gather_us``, one slot only): after a round of GATHER_MIN_MESSAGES or more that
    # ends with as many posted and waiting, the next one waits (at most gather_ns) until the posted
    # end reaches gather_to: the senders the round answered come back and one fdatasync covers
    # them and the cohort already waiting.
    int64_t gather_ns     # 0: off
    int64_t gather_to     # the next round waits for req_end >= this (0: no wait)
    int64_t last_end      # the end of the last round completed (where the next one's bytes start)
    uint64_t req_messages  # messages posted since the last round was taken
    int gathering         # the worker waits for gather_to (posts below it do not wake it)
    int gather_misses     # waits in a row that timed out
    int gather_skip       # rounds left that start without gathering
    int gather_backoff
    uint64_t gathered     # waits done
    uint64_t gather_timeouts  # ... that ended by gather_ns
    Done ring[RING]


cdef int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef void _gather_wait(State *s) noexcept nogil:
    """Under the mutex, a request waiting: wait (at most ``gather_ns``) until the posted end
    reaches ``gather_to``; three waits in a row that time out pause gathering for a while."""
    cdef timespec ts
    cdef long long ns
    cdef int rc = 0
    clock_gettime(CLOCK_REALTIME, &ts)
    ns = <long long>ts.tv_nsec + s.gather_ns
    ts.tv_sec += <time_t>(ns // 1000000000)
    ts.tv_nsec = <long>(ns % 1000000000)
    s.gathering = 1
    while not s.stop and s.req_end < s.gather_to and rc != ETIMEDOUT:
        rc = pthread_cond_timedwait(&s.cv, &s.mu, &ts)
    s.gathering = 0
    s.gathered += 1
    if s.req_end >= s.gather_to or s.stop:
        s.gather_misses = 0
        s.gather_backoff = GATHER_SKIP_AFTER_MISS
    else:
        s.gather_timeouts += 1
        s.gather_misses += 1
        if s.gather_misses >= GATHER_MISSES:
            # The senders keep not coming back in time (a stream, not cohorts): pause, longer each time.
            s.gather_misses = 0
            s.gather_skip = s.gather_backoff
            s.gather_backoff = s.gather_backoff * 2 if s.gather_backoff < GATHER_SKIP_MAX // 2 else GATHER_SKIP_MAX
    s.gather_to = 0


cdef void _end_gather(State *s) noexcept nogil:
    """Under the mutex: drop the gathering mark; a worker waiting for it starts its round now."""
    s.gather_to = 0
    if s.gathering:
        pthread_cond_broadcast(&s.cv)


cdef inline bint _may_start(State *s) noexcept nogil:
    """Under the mutex: a request waits and a round may start for it now: none in flight, or
    fewer than ``slots`` and the sends arrive sparsely (recent fdatasync time below ``max_load``
    times the recent gap between posts: a second round then saves its sends the rest of the
    running one, and costs few extra fdatasyncs; a dense stream merges into the next round)."""
    if s.req_seq == s.taken_seq:
        return False
    if s.inflight == 0:
        return True
    return s.inflight < s.slots and not s.req_single and s.fsync_avg < s.max_load * s.gap_avg


cdef inline uint64_t _begin_round(State *s, uint64_t seq, int64_t end) noexcept nogil:
    """Under the mutex: request ``seq`` (bytes up to ``end``) taken by a new round; its ring
    entry opened, its index returned."""
    cdef uint64_t r = s.started_count
    cdef Done *d = &s.ring[r % RING]
    s.taken_seq = seq
    s.started_count += 1
    d.seq = seq
    d.end = end
    d.done = 0
    d.err = 0
    return r


cdef inline int _sync_round(State *s, int fd, uint64_t r) noexcept nogil:
    """Round ``r``'s ``fdatasync`` of ``fd``, called without the mutex; returns with it held and
    the round's ring entry done (error, times) and the recent fdatasync time updated.  The
    worker's rounds and the loop's inline ones both take this path."""
    cdef int64_t started = _now_ns()
    cdef int rc = fdatasync(fd)
    cdef int err = errno if rc != 0 else 0
    cdef int64_t ended = _now_ns()
    cdef Done *d
    pthread_mutex_lock(&s.mu)
    d = &s.ring[r % RING]
    d.err = err
    d.ns = ended - started
    d.started = started
    d.ended = ended
    d.done = 1
    s.fsync_avg += (<double>(ended - started) - s.fsync_avg) / 8
    return err


cdef void *_work(void *arg) noexcept nogil:
    cdef State *s = <State *>arg
    cdef int fd, err, slot
    cdef int64_t end, started, ended, start_end, pending
    cdef uint64_t seq, r, messages, one = 1
    cdef int signal
    pthread_setname_np(pthread_self(), "tidemq-flush")
    while True:
        pthread_mutex_lock(&s.mu)
        while not _may_start(s) and not (s.stop and s.req_seq == s.taken_seq):
            pthread_cond_wait(&s.cv, &s.mu)
        if s.req_seq == s.taken_seq:  # stopping, every request served
            pthread_mutex_unlock(&s.mu)
            break
        if s.gather_to:
            if s.req_end < s.gather_to and not s.stop and s.inflight == 0:
                _gather_wait(s)
            s.gather_to = 0
        messages = s.req_messages
        s.req_messages = 0
        start_end = s.last_end
        slot = 0
        while s.busy_slots & (1u << slot):
            slot += 1
        s.busy_slots |= 1u << slot
        if s.inflight:
            s.overlapped += 1
        s.inflight += 1
        fd = s.req_fds[slot]
        end = s.req_end
        seq = s.req_seq
        r = _begin_round(s, seq, end)
        while s.held_slots & (1u << slot) and not s.stop:  # a test holds this slot's rounds
            pthread_cond_wait(&s.hold_cv, &s.mu)
        pthread_mutex_unlock(&s.mu)
        err = _sync_round(s, fd, r)
        started = s.ring[r % RING].started
        ended = s.ring[r % RING].ended
        s.busy_slots &= ~(1u << slot)
        s.inflight -= 1
        if (
            s.gather_ns and s.slots == 1 and not err and end >= start_end
            and messages >= GATHER_MIN_MESSAGES
            and s.req_seq != s.taken_seq and s.req_messages >= GATHER_MIN_MESSAGES
        ):
            # Two cohorts alternating: this round's senders (answered now) and the ones posted
            # meanwhile, each GATHER_MIN_MESSAGES or more (a stream at a moderate rate posts a few
            # during a round; one cohort alone has nothing waiting: neither waits).
            if s.gather_skip > 0:
                s.gather_skip -= 1
            else:
                # As many bytes as this round flushed plus what waits: the answered senders' next
                # sends join the waiting cohort's round.
                pending = s.req_end if s.req_end > end else end
                s.gather_to = end + (pending - start_end)
        s.last_end = end
        signal = 0
        # Reported in the order taken: a round is drained only once every earlier one completed.
        while s.done_count < s.started_count and s.ring[s.done_count % RING].done:
            s.done_count += 1
            signal = 1
        if signal:
            signal = not s.signalled
            s.signalled = 1
        if s.stop:
            pthread_cond_broadcast(&s.cv)  # the other workers may be waiting for this one to end
        pthread_mutex_unlock(&s.mu)
        # The loop has not drained since the last write: it will see this round too, no write.
        while signal and write(s.efd, &one, 8) < 0 and errno == EINTR:
            pass
    return NULL


cdef class RoundWorker:
    """The flush workers (``slots`` threads: at most that many rounds in flight) and their eventfd
    (one per policy, started by :meth:`start`).

    ``slots`` > 1: a request posted while a round runs may start a second round at once, on
    another thread and with its own fd (each in-flight round's ``fdatasync`` on its own open file
    description: Linux reports a writeback error once per description), when the sends arrive
    sparsely (``max_load``, see :func:`_may_start`); completions are handed to :meth:`drain` in
    the order the rounds started, a round only once every earlier one completed."""

    cdef State *s
    cdef pthread_t threads[MAX_SLOTS]
    cdef int nthreads
    cdef bint started
    cdef bint joined
    cdef bint leaked

    def __cinit__(self, int slots=1, double max_load=2.0, long long gather_us=0):
        if slots < 1 or slots > MAX_SLOTS:
            raise ValueError(f"slots must be 1..{MAX_SLOTS}, got {slots}")
        self.s = <State *>calloc(1, sizeof(State))
        if self.s == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.s.mu, NULL)
        pthread_cond_init(&self.s.cv, NULL)
        pthread_cond_init(&self.s.hold_cv, NULL)
        self.s.slots = slots
        self.s.max_load = max_load
        self.s.gap_avg = 1e9  # no post seen: sparse
        self.s.gather_ns = gather_us * 1000 if slots == 1 and gather_us > 0 else 0
        self.s.gather_backoff = GATHER_SKIP_AFTER_MISS
        self.s.req_key = -1
        self.s.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.s.efd < 0:
            err = errno
            self._free()
            raise OSError(err, "eventfd")

    cdef void _free(self) noexcept:
        if self.s == NULL:
            return
        if self.s.efd >= 0:
            close(self.s.efd)
        pthread_cond_destroy(&self.s.hold_cv)
        pthread_cond_destroy(&self.s.cv)
        pthread_mutex_destroy(&self.s.mu)
        free(self.s)
        self.s = NULL

    def start(self) -> None:
        if self.started:
            raise RuntimeError("the flush worker is started already")
        cdef int i, rc
        for i in range(self.s.slots):
            rc = pthread_create(&self.threads[i], NULL, _work, self.s)
            if rc != 0:
                self.started = self.nthreads > 0
                self.stop(5.0)
                raise OSError(rc, "pthread_create")
            pthread_setname_np(self.threads[i], "tidemq-flush")  # named before start() returns
            self.nthreads += 1
        self.started = True

    def fileno(self) -> int:
        """The eventfd the loop watches: readable once a round completed."""
        if self.s == NULL:
            return -1
        return self.s.efd

    @property
    def slots(self) -> int:
        """Rounds in flight at most."""
        return self.s.slots if self.s != NULL else 0

    def post(self, int fd, long long end, tuple fds=None, int messages=1) -> int:
        """Ask for an ``fdatasync`` of ``fd``'s file covering ``end``; returns the request's sequence
        number, which a completed round at or past it covers, or 0 when the worker cannot take it
        (stopped, or a request for another file not taken yet).  ``fds``: one fd of that file per
        slot, each its own open file description (a round in slot i syncs ``fds[i]``); without
        them every slot would share ``fd``'s description, so such a request never runs beside
        another round.  ``messages``: how many messages the request covers (a round of
        GATHER_MIN_MESSAGES or more lets the next one gather, ``gather_us``)."""
        cdef State *s = self.s
        cdef uint64_t seq = 0
        cdef int i, n
        cdef int64_t now
        cdef bint wake = False
        if s == NULL or not self.started:
            return 0
        n = s.slots
        if fds is not None and len(fds) != n:
            raise ValueError(f"{n} fds expected, got {len(fds)}")
        # With the GIL held: the worker holds the mutex for a few instructions only, and releasing
        # the GIL here would let another Python thread take it (the loop then waits for it back).
        pthread_mutex_lock(&s.mu)
        if not s.stop and (s.req_key == fd or s.req_seq == s.taken_seq):
            s.req_key = fd
            if fds is None:
                s.req_single = 1
                for i in range(n):
                    s.req_fds[i] = fd
            else:
                s.req_single = 0
                for i in range(n):
                    s.req_fds[i] = fds[i]
            if end > s.req_end or s.req_seq == s.taken_seq:
                s.req_end = end
            s.req_seq += 1
            s.req_messages += messages
            seq = s.req_seq
            now = _now_ns()
            if s.last_post:
                s.gap_avg += (<double>(now - s.last_post) - s.gap_avg) / 8
            s.last_post = now
            if s.gathering:
                wake = s.req_end >= s.gather_to  # the gathering worker: its bytes are there
            else:
                wake = _may_start(s)  # an idle worker (the busy ones take it when done)
        elif s.gather_to:
            # Refused: a request of the previous file waits (the commit log switched files). The
            # sends the worker gathers for are in the new file and go to the Python thread: the
            # waiting round starts now instead of at the bound.
            _end_gather(s)
        pthread_mutex_unlock(&s.mu)
        if wake:
            # Signalled once the mutex is free: a worker woken while this thread still held it
            # would block on it at once and need a second wake-up (measured on this VM: the
            # worker awake 8-9 µs after a signal under the mutex, ~4 µs after one past it).  The
            # worker checks its condition under the mutex before it sleeps: nothing is missed.
            pthread_cond_signal(&s.cv)
        return seq

    def round_here(self, int fd, long long end):
        """An inline round on the calling thread (the loop's kick, ``inline_max_us``): when no
        round is in flight or posted and every completed round was drained, take one now, call
        ``fdatasync(fd)`` here without the GIL, and return its completion as :meth:`drain`
        would, ``(seq, end, errno, ns, started_ns, ended_ns)``, already drained (the eventfd is
        not written); ``None`` when a round of the workers is in the way (post it instead).
        Nothing can be posted meanwhile: the one loop that posts is the one waiting here."""
        cdef State *s = self.s
        cdef uint64_t seq, r
        cdef int err = 0
        cdef int64_t started = 0, ended = 0
        if s == NULL or not self.started:
            return None
        pthread_mutex_lock(&s.mu)
        if (
            s.stop or s.inflight or s.req_seq != s.taken_seq or s.done_count != s.read_count
            or s.held_slots or s.gather_to or s.busy_slots
        ):
            pthread_mutex_unlock(&s.mu)
            return None
        s.req_key = fd
        s.req_end = end
        s.req_seq += 1
        seq = s.req_seq
        r = _begin_round(s, seq, end)
        s.inflight = 1
        s.busy_slots = 1
        pthread_mutex_unlock(&s.mu)
        with nogil:
            err = _sync_round(s, fd, r)
        started = s.ring[r % RING].started
        ended = s.ring[r % RING].ended
        s.busy_slots = 0
        s.inflight = 0
        s.last_end = end
        while s.done_count < s.started_count and s.ring[s.done_count % RING].done:
            s.done_count += 1
        s.read_count = s.done_count  # handed to the caller: drain() does not report it again
        s.here_rounds += 1
        pthread_mutex_unlock(&s.mu)
        return (seq, end, err, ended - started, started, ended)

    @property
    def here_rounds(self) -> int:
        """Rounds run by :meth:`round_here` (inline, on the caller's thread)."""
        return self.s.here_rounds if self.s != NULL else 0

    def end_gather(self) -> bool:
        """The next round starts without gathering, a wait in progress ends now: the sends it
        waits for go to the Python thread (a round the worker cannot take, e.g. across a file
        switch).  True when a gathering mark was set."""
        cdef State *s = self.s
        cdef bint was = False
        if s == NULL:
            return False
        pthread_mutex_lock(&s.mu)
        was = s.gather_to != 0
        if was:
            _end_gather(s)
        pthread_mutex_unlock(&s.mu)
        return was

    def drain(self) -> list:
        """The rounds completed since the last call, in the order they started (a round only once
        every earlier one completed): ``(seq, end, errno, ns, started_ns, ended_ns)``, the times
        CLOCK_MONOTONIC."""
        cdef State *s = self.s
        cdef uint64_t value = 0, first, last, i
        cdef Done d
        out = []
        if s == NULL:
            return out
        read(s.efd, &value, 8)  # non-blocking: EAGAIN when nothing was written since
        pthread_mutex_lock(&s.mu)
        s.signalled = 0
        last = s.done_count
        first = s.read_count
        if last - first > RING:
            first = last - RING
        s.read_count = last
        i = first
        while i < last:
            d = s.ring[i % RING]
            out.append((d.seq, d.end, d.err, d.ns, d.started, d.ended))
            i += 1
        pthread_mutex_unlock(&s.mu)
        return out

    def hold(self, int slot, bint held) -> None:
        """Tests: rounds taken into ``slot`` wait before their ``fdatasync`` while held (a real
        ``fdatasync`` cannot be made slow on demand)."""
        cdef State *s = self.s
        if s == NULL or slot < 0 or slot >= s.slots:
            raise ValueError(slot)
        pthread_mutex_lock(&s.mu)
        if held:
            s.held_slots |= 1u << slot
        else:
            s.held_slots &= ~(1u << slot)
            pthread_cond_broadcast(&s.hold_cv)
        pthread_mutex_unlock(&s.mu)

    @property
    def busy(self) -> bool:
        """A request posted and not completed yet (a round running or about to)."""
        if self.s == NULL:
            return False
        return self.s.inflight != 0 or self.s.req_seq != self.s.taken_seq

    @property
    def inflight(self) -> int:
        """Rounds started and not completed."""
        return self.s.inflight if self.s != NULL else 0

    @property
    def rounds(self) -> int:
        """Rounds completed and reported (``fdatasync`` calls, failed ones included)."""
        if self.s == NULL:
            return 0
        return self.s.done_count

    @property
    def overlapped(self) -> int:
        """Rounds started while another round was in flight."""
        return self.s.overlapped if self.s != NULL else 0

    @property
    def gathered(self) -> int:
        """Rounds that waited to gather (``gather_us``)."""
        return self.s.gathered if self.s != NULL else 0

    @property
    def gather_timeouts(self) -> int:
        """... of which the wait ended by ``gather_us``."""
        return self.s.gather_timeouts if self.s != NULL else 0

    @property
    def load(self) -> float:
        """Recent ``fdatasync`` time over the recent gap between posts (the overlap's gate)."""
        if self.s == NULL or self.s.gap_avg <= 0:
            return 0.0
        return self.s.fsync_avg / self.s.gap_avg

    def stop(self, double timeout=30.0) -> bool:
        """Serve the requests already posted, then stop the threads; ``False`` when one did not end
        within ``timeout`` seconds (a ``fdatasync`` stuck in the kernel: the state is then left
        allocated for it)."""
        cdef State *s = self.s
        cdef int rc = 0, i
        if s == NULL:
            return True
        pthread_mutex_lock(&s.mu)
        s.stop = 1
        pthread_cond_broadcast(&s.cv)
        pthread_cond_broadcast(&s.hold_cv)
        pthread_mutex_unlock(&s.mu)
        if self.started and not self.joined:
            for i in range(self.nthreads):
                if self.threads[i] == 0:
                    continue
                with nogil:
                    rc = tidemq_timedjoin(self.threads[i], timeout)
                if rc != 0:
                    self.leaked = True
                    return False
                self.threads[i] = 0
            self.joined = True
        return True

    def close(self) -> None:
        """Stop (if not stopped) and free the threads' state and the eventfd."""
        if self.s == NULL:
            return
        if self.started and not self.joined and not self.stop():
            return
        if self.leaked:
            return
        self._free()

    def __dealloc__(self):
        cdef int i
        if self.s == NULL:
            return
        if self.started and not self.joined:
            pthread_mutex_lock(&self.s.mu)
            self.s.stop = 1
            pthread_cond_broadcast(&self.s.cv)
            pthread_cond_broadcast(&self.s.hold_cv)
            pthread_mutex_unlock(&self.s.mu)
            for i in range(self.nthreads):
                if self.threads[i] != 0 and tidemq_timedjoin(self.threads[i], 1.0) != 0:
                    return  # still inside fdatasync: leave its state to it
            self.joined = True
        if not self.leaked:
            self._free()
