# cython: language_level=3, boundscheck=False, wraparound=False
"""The group commit's flush worker without the GIL: a pthread that ``fdatasync``\\ s and tells the loop.

The ``sync`` flush policy's compiled rounds (docs/flush.md, "A round without the GIL"): the event
loop posts ``(fd, end offset)`` (:meth:`RoundWorker.post`, a mutex and a condition variable, no
GIL wait on either side); the worker thread, which never takes the GIL, takes the latest request,
calls ``fdatasync(fd)`` and writes 1 to an eventfd that the loop watches (``loop.add_reader``).
The loop's reader (:meth:`RoundWorker.drain`) gets every round completed since its last call, in
order, as ``(seq, end, errno, nanoseconds)``: one wake-up answers them all.  Requests posted while
a round runs are merged (the largest end wins) into the next round, which starts as soon as the
running one returns, without waiting for the loop.

The Python reference is the policy's flush thread (``tidemq_flush.group_commit``): it runs when this
module is not built, with ``TIDEMQ_NO_EXTENSIONS=1``, and for every round this worker cannot take.
"""

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.errno cimport errno, EINTR

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
    int pthread_cond_signal(pthread_cond_t *)
    int pthread_create(pthread_t *, void *, void *(*)(void *) noexcept nogil, void *)
    int pthread_setname_np(pthread_t, const char *)
    pthread_t pthread_self()

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int, timespec *)
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME

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
    RING = 1024  # completed rounds kept for the loop's next drain (the counters never lose one)


cdef struct Done:
    uint64_t seq
    int64_t end
    int err
    int64_t ns


cdef struct State:
    pthread_mutex_t mu
    pthread_cond_t cv
    int efd
    int stop
    int req_fd
    int64_t req_end
    uint64_t req_seq      # the last request posted
    uint64_t taken_seq    # the last request a round took
    uint64_t done_count   # rounds completed
    uint64_t read_count   # rounds handed to drain()
    int64_t busy          # 1 while a round's fdatasync runs
    int signalled         # the eventfd written since the loop's last drain (one write is enough)
    Done ring[RING]


cdef int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef void *_work(void *arg) noexcept nogil:
    cdef State *s = <State *>arg
    cdef int fd, rc, err
    cdef int64_t end, started, took
    cdef uint64_t seq, one = 1
    cdef Done *d
    cdef int signal
    pthread_setname_np(pthread_self(), "tidemq-flush")
    while True:
        pthread_mutex_lock(&s.mu)
        while s.req_seq == s.taken_seq and not s.stop:
            pthread_cond_wait(&s.cv, &s.mu)
        if s.req_seq == s.taken_seq:  # stopping, every request served
            pthread_mutex_unlock(&s.mu)
            break
        fd = s.req_fd
        end = s.req_end
        seq = s.req_seq
        s.taken_seq = seq
        s.busy = 1
        pthread_mutex_unlock(&s.mu)
        started = _now_ns()
        rc = fdatasync(fd)
        err = errno if rc != 0 else 0
        took = _now_ns() - started
        pthread_mutex_lock(&s.mu)
        d = &s.ring[s.done_count % RING]
        d.seq = seq
        d.end = end
        d.err = err
        d.ns = took
        s.done_count += 1
        s.busy = 0
        signal = not s.signalled
        s.signalled = 1
        pthread_mutex_unlock(&s.mu)
        # The loop has not drained since the last write: it will see this round too, no write.
        while signal and write(s.efd, &one, 8) < 0 and errno == EINTR:
            pass
    return NULL


cdef class RoundWorker:
    """One flush worker thread and its eventfd (one per policy, started by :meth:`start`)."""

    cdef State *s
    cdef pthread_t thread
    cdef bint started
    cdef bint joined
    cdef bint leaked

    def __cinit__(self):
        self.s = <State *>calloc(1, sizeof(State))
        if self.s == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.s.mu, NULL)
        pthread_cond_init(&self.s.cv, NULL)
        self.s.req_fd = -1
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
        pthread_cond_destroy(&self.s.cv)
        pthread_mutex_destroy(&self.s.mu)
        free(self.s)
        self.s = NULL

    def start(self) -> None:
        if self.started:
            raise RuntimeError("the flush worker is started already")
        rc = pthread_create(&self.thread, NULL, _work, self.s)
        if rc != 0:
            raise OSError(rc, "pthread_create")
        pthread_setname_np(self.thread, "tidemq-flush")  # named before start() returns
        self.started = True

    def fileno(self) -> int:
        """The eventfd the loop watches: readable once a round completed."""
        if self.s == NULL:
            return -1
        return self.s.efd

    def post(self, int fd, long long end) -> int:
        """Ask for ``fdatasync(fd)`` covering ``end``; returns the request's sequence number, which
        a completed round at or past it covers, or 0 when the worker cannot take it (stopped, or a
        request for another file not taken yet)."""
        cdef State *s = self.s
        cdef uint64_t seq = 0
        if s == NULL or not self.started:
            return 0
        # With the GIL held: the worker holds the mutex for a few instructions only, and releasing
        # the GIL here would let another Python thread take it (the loop then waits for it back).
        pthread_mutex_lock(&s.mu)
        if not s.stop and (s.req_fd == fd or s.req_seq == s.taken_seq):
            s.req_fd = fd
            if end > s.req_end or s.req_seq == s.taken_seq:
                s.req_end = end
            s.req_seq += 1
            seq = s.req_seq
            pthread_cond_signal(&s.cv)
        pthread_mutex_unlock(&s.mu)
        return seq

    def drain(self) -> list:
        """The rounds completed since the last call, oldest first: ``(seq, end, errno, ns)``."""
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
            out.append((d.seq, d.end, d.err, d.ns))
            i += 1
        pthread_mutex_unlock(&s.mu)
        return out

    @property
    def busy(self) -> bool:
        """A request posted and not completed yet (a round running or about to)."""
        if self.s == NULL:
            return False
        return self.s.busy != 0 or self.s.req_seq != self.s.taken_seq

    @property
    def rounds(self) -> int:
        """Rounds completed (``fdatasync`` calls, failed ones included)."""
        if self.s == NULL:
            return 0
        return self.s.done_count

    def stop(self, double timeout=30.0) -> bool:
        """Serve the requests already posted, then stop the thread; ``False`` when it did not end
        within ``timeout`` seconds (a ``fdatasync`` stuck in the kernel: its state is then left
        allocated for it)."""
        cdef State *s = self.s
        cdef int rc = 0
        if s == NULL:
            return True
        pthread_mutex_lock(&s.mu)
        s.stop = 1
        pthread_cond_signal(&s.cv)
        pthread_mutex_unlock(&s.mu)
        if self.started and not self.joined:
            with nogil:
                rc = tidemq_timedjoin(self.thread, timeout)
            if rc != 0:
                self.leaked = True
                return False
            self.joined = True
        return True

    def close(self) -> None:
        """Stop (if not stopped) and free the thread's state and the eventfd."""
        if self.s == NULL:
            return
        if self.started and not self.joined and not self.stop():
            return
        if self.leaked:
            return
        self._free()

    def __dealloc__(self):
        if self.s == NULL:
            return
        if self.started and not self.joined:
            pthread_mutex_lock(&self.s.mu)
            self.s.stop = 1
            pthread_cond_signal(&self.s.cv)
            pthread_mutex_unlock(&self.s.mu)
            if tidemq_timedjoin(self.thread, 1.0) != 0:
                return  # still inside fdatasync: leave its state to it
            self.joined = True
        if not self.leaked:
            self._free()
