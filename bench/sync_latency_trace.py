"""Where a sync-flush send's latency goes in a served broker at a fixed rate (issue 38), and what
the slow ones met.

    python bench/sync_latency_trace.py [--rate 2000] [--seconds 10] [--toml '...'] [--tree DIR]

Starts ``tidemq standalone`` (sync flush) with a few wrappers installed before it runs
(:func:`install`): every ``os.fdatasync``/``os.fsync``, ``os.posix_fallocate``, the commit log's
zeros written ahead (``commitlog.zero_ahead``) and every cyclic-GC pass is timestamped with its
thread and (for the syncs) the file it hit.  One open-loop client in this process sends 1 KiB
``SEND_MESSAGE_V2`` at ``--rate`` (compare_load's sender) and records each send's send and
answer time (the same CLOCK_MONOTONIC as the broker's events).

Each send is then matched with its round: the first commit-log ``fdatasync`` of the flush thread
that starts after the send left and ends before its answer came back (the round that covered it).
Its latency splits into ``to_fsync`` (send to that ``fdatasync``'s start: the socket, the loop,
the put, the rest of the round in progress, the flush thread's wake-up), ``fsync`` and
``after_fsync`` (``fdatasync``'s end to the answer: the hop back into the loop, the answer's
write, the client's wake-up).  For the slowest 1 % it reports what overlapped them: the other
threads' syncs (consume queues, index, checkpoint), GC passes, fallocates, zeros written ahead.
Prints JSON (``--out`` also writes the raw events).  ``--blk`` adds the block layer (``perf
record`` of every request issued and completed, whole machine): who put what on the device, by
the issuing thread, and for the kernel's writeback by the sectors of the broker's files.
``TIDEMQ_TRACE_SKIP_SYNC`` switches off some background syncs (see :func:`install`);
``TIDEMQ_TRACE_OVERLAP_TOGGLE_MS=<ms>`` turns the compiled rounds' overlap (``[flush.sync]
overlap_rounds``) off and on every that many ms and reports both modes apart
(``by_overlap_mode``): a pair measured in one broker over the same seconds.  The compiled rounds'
``fdatasync`` (C, unseen by the wrappers) is recorded from their own start and end times.  ``TIDEMQ_TRACE_ZERO_AHEAD=<bytes>`` in the
environment sets the commit log's zeros-ahead chunk for the run (an experiment; 0: none).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

now_ns = time.perf_counter_ns  # CLOCK_MONOTONIC: comparable across processes

#: The hand-off marks (not events that overlap a send): puts, kicks, completions, the loop's
#: drains, reads (``data_received``) and the compiled reader's end (answers written).
MARKS = ("submit", "kick", "complete", "drain", "recv", "answered", "written", "completing")


# --------------------------------------------------------------------------- in the broker
def install(out: str) -> None:
    """Wrap the syncs, fallocates, zeros-ahead and GC passes of this process; append the events to
    ``out`` (JSON lines) every 200 ms."""
    events: list[tuple[Any, ...]] = []
    paths: dict[tuple[int, int], str] = {}

    def path_of(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "?"

    # An experiment: ``TIDEMQ_TRACE_SKIP_SYNC=consumequeue,index`` makes the syncs of those files
    # (a path part; ``commitlog-zeros``: the zeros-ahead thread's) return at once, so their pages
    # go to disk with the kernel's writeback instead: which background writer the stalls follow.
    skip = {k for k in os.environ.get("TIDEMQ_TRACE_SKIP_SYNC", "").split(",") if k}

    def skipped(fd: int, name: str) -> bool:
        if not skip or name == "posix_fallocate":
            return False
        if "commitlog-zeros" in skip and threading.current_thread().name == "commitlog-zeros":
            return True
        parts = set(Path(path_of(fd)).parts)
        return bool(parts & skip)

    def wrap(name: str) -> None:
        orig = getattr(os, name)

        def wrapped(fd: int, *a: Any) -> Any:
            if skip and threading.current_thread().name != "group-commit" and skipped(fd, name):
                events.append(
                    ("skipped_" + name, threading.current_thread().name, now_ns(), now_ns(), path_of(fd), 0)
                )
                return None
            t0 = now_ns()
            try:
                return orig(fd, *a)
            finally:
                t1 = now_ns()
                try:
                    st = os.fstat(fd)
                    key = (st.st_dev, st.st_ino)  # fd numbers are reused: key by inode
                except OSError:
                    key = (-1, fd)
                p = paths.get(key)
                thread = threading.current_thread()
                if p is None or thread.name != "group-commit":
                    p = paths[key] = path_of(fd)  # rare off the flush thread; inodes are reused
                tname = thread.name
                if thread is threading.main_thread() and "/commitlog/" in p and name == "fdatasync":
                    # An inline round (``inline_max_us``): the loop's own commit-log fdatasync.
                    tname, p = "group-commit", p + "#inline"
                events.append((name, tname, t0, t1, p, a[1] if a else 0))

        setattr(os, name, wrapped)

    for name in ("fdatasync", "fsync", "posix_fallocate"):
        wrap(name)

    gc_t0 = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_t0[0] = now_ns()
        else:
            events.append(
                ("gc", threading.current_thread().name, gc_t0[0], now_ns(), f"gen{info['generation']}", 0)
            )

    gc.callbacks.append(on_gc)

    def patch_zero_ahead() -> None:
        try:
            from tidemq_store_mmap import commitlog
        except ImportError:
            return
        orig = commitlog.zero_ahead
        chunk = os.environ.get("TIDEMQ_TRACE_ZERO_AHEAD")  # an experiment: the commit log's chunk
        if chunk is not None:
            commitlog.ZERO_AHEAD = int(chunk)  # read when the store builds its CommitLog

        def zero_ahead(fd: int, zeroed: int, end: int, chunk: int, limit: int) -> int:
            t0 = now_ns()
            r = orig(fd, zeroed, end, chunk, limit)
            if r != zeroed:
                events.append(("zero_ahead", threading.current_thread().name, t0, now_ns(), "", r - zeroed))
            return r

        commitlog.zero_ahead = zero_ahead

    patch_zero_ahead()

    def patch_rounds() -> None:
        """The group commit's hand-offs: puts submitted, the loop's kick, the round's completion
        posted (flush thread), the loop's drain of it."""
        try:
            from tidemq import futures
            from tidemq_flush import group_commit
        except ImportError:
            return
        gcf: Any = group_commit.GroupCommitFlush  # patched below: Any, as its methods are replaced
        waker: Any = futures._LoopWaker
        orig_submit, orig_kick, orig_complete = gcf.submit, gcf._kick, group_commit.complete_all
        orig_drain = waker._drain

        def submit(self: Any, *a: Any) -> Any:
            events.append(("submit", "", now_ns(), 0, "", 0))
            return orig_submit(self, *a)

        def kick(self: Any, loop: Any) -> Any:
            t0 = now_ns()
            try:
                return orig_kick(self, loop)
            finally:
                events.append(("kick", "", t0, now_ns(), "", 0))

        def complete_all(completions: Any) -> Any:
            events.append(("complete", "", now_ns(), 0, "", len(completions)))
            return orig_complete(completions)

        def drain(self: Any) -> Any:
            t0 = now_ns()
            try:
                return orig_drain(self)
            finally:
                events.append(("drain", "", t0, now_ns(), "", 0))

        gcf.submit, gcf._kick, group_commit.complete_all = submit, kick, complete_all
        waker._drain = drain
        try:
            from tidemq_transport_tcp import connection
        except ImportError:
            return
        conn: Any = connection.Connection  # data_received replaced below
        orig_recv = conn.data_received

        def data_received(self: Any, data: Any) -> Any:
            # A read's arrival on the loop and its end (the lane's decode, put and hold).
            t0 = now_ns()
            try:
                return orig_recv(self, data)
            finally:
                events.append(("recv", "", t0, now_ns(), "", len(data)))

        conn.data_received = data_received
        orig_later = conn.answer_later

        def answer_later(self: Any, answer: Any, count: int) -> Any:
            # A held read's answers written (the round's lane callback): their write's start, end.
            t0 = now_ns()
            try:
                return orig_later(self, answer, count)
            finally:
                events.append(("written", "", now_ns(), t0, "", count))

        conn.answer_later = answer_later

    patch_rounds()

    def patch_native() -> None:
        """The compiled rounds (``tidemq_flush._round``): their ``fdatasync`` runs in C, unseen by the
        wrappers above; each round the loop's reader drains is recorded as the flush thread's
        commit-log ``fdatasync`` (its own start and end, CLOCK_MONOTONIC), its completion posted
        at that end (the worker writes the eventfd right after it) and the reader's wake-up."""
        try:
            from tidemq_flush import native_rounds
        except ImportError:
            return
        cls: Any = native_rounds.NativeRounds  # its __init__ is replaced below
        orig_init = cls.__init__

        class Traced:
            def __init__(self, worker: Any) -> None:
                self._worker = worker

            def __getattr__(self, name: str) -> Any:
                return getattr(self._worker, name)

            def drain(self) -> Any:
                t0 = now_ns()
                dones = self._worker.drain()
                if dones:
                    for d in dones:
                        if len(d) >= 6:  # (seq, end, errno, ns, started, ended)
                            events.append(("fdatasync", "group-commit", d[4], d[5], "/commitlog/compiled", 0))
                            events.append(("complete", "", d[5], 0, "", 1))
                    events.append(("drain", "", t0, now_ns(), "", len(dones)))
                return dones

            def round_here(self, fd: int, end: int) -> Any:
                # A compiled inline round (``inline_max_us``): its fdatasync on the loop's thread.
                done = self._worker.round_here(fd, end)
                if done is not None:
                    events.append(
                        ("fdatasync", "group-commit", done[4], done[5], "/commitlog/compiled#inline", 0)
                    )
                return done

        # An experiment: ``TIDEMQ_TRACE_OVERLAP_TOGGLE_MS=<ms>`` turns the overlapping rounds off and
        # on again every that many ms in this one broker (the posts then carry no per-slot fds:
        # one round at a time), so both modes meet the same disk and the same neighbours.
        toggle_ms = float(os.environ.get("TIDEMQ_TRACE_OVERLAP_TOGGLE_MS", "0") or 0)

        def toggle(rounds: Any) -> None:
            slots = rounds.slots
            on = True
            while True:
                time.sleep(toggle_ms / 1e3)
                on = not on
                rounds.slots = slots if on else 1
                events.append(("mode", "on" if on else "off", now_ns(), 0, "", 0))

        orig_answer = cls._answer

        def answer(self: Any) -> Any:
            # The reader's end: every round drained, its sends' answers written (the lane's
            # callbacks run inside complete_here).
            try:
                return orig_answer(self)
            finally:
                events.append(("answered", "", now_ns(), 0, "", 0))

        cls._answer = answer
        orig_here = native_rounds.complete_here

        def complete_here(completions: Any, loop: Any) -> Any:
            # The reader's bookkeeping done: the rounds' groups completed, the lane's callbacks run.
            events.append(("completing", "", now_ns(), 0, "", len(completions)))
            return orig_here(completions, loop)

        native_rounds.complete_here = complete_here

        def init(self: Any, *a: Any, **k: Any) -> None:
            orig_init(self, *a, **k)
            self.worker = Traced(self.worker)
            if toggle_ms > 0 and self.slots > 1:
                events.append(("mode", "on", now_ns(), 0, "", 0))
                threading.Thread(target=toggle, args=(self,), name="trace-toggle", daemon=True).start()

        cls.__init__ = init

    patch_native()

    def dump() -> None:
        while True:
            time.sleep(0.2)
            for t in threading.enumerate():  # native thread ids, for the CPU per thread
                events.append(("thread", t.name, t.native_id or 0, 0, "", 0))
            n = len(events)
            if n:
                batch = events[:n]
                del events[:n]
                with open(out, "a") as f:
                    for e in batch:
                        f.write(json.dumps(e) + "\n")

    threading.Thread(target=dump, name="trace-dump", daemon=True).start()


BOOT = """
import runpy, sys
sys.path.insert(0, {here!r})
import sync_latency_trace
sync_latency_trace.install({out!r})
sys.argv = ["tidemq"] + {argv!r}
runpy.run_module("tidemq", run_name="__main__", alter_sys=True)
"""


def start_broker(work: Path, toml: str, tree: str, out: Path, flush: str = "sync") -> Any:
    """compare.py's tidemq broker (sync flush unless ``flush``), started inside the traced
    interpreter (``BOOT``)."""
    import compare_systems as systems

    def command(argv: list[str]) -> list[str]:
        return [sys.executable, "-c", BOOT.format(here=str(HERE), out=str(out), argv=argv)]

    return systems.start_tidemq(work, flush, toml, command=command, pythonpath=tree, describe="traced")


# --------------------------------------------------------------------------- the client
async def drive(spec: dict[str, Any], rate: float, seconds: float) -> list[tuple[int, int, bool]]:
    import compare_load

    conn = await compare_load.connect(spec)
    sends: list[tuple[int, int, bool]] = []

    def on_done(ok: bool, latency: float) -> None:
        t = now_ns()
        sends.append((t - int(latency * 1e9), t, ok))

    conn.on_done = on_done
    t0 = time.perf_counter()
    issued = 0
    while time.perf_counter() - t0 < seconds:
        due = int((time.perf_counter() - t0) * rate) - issued
        for _ in range(due):
            issued += 1
            conn.send()
        await asyncio.sleep(0.001)
    deadline = time.perf_counter() + 10
    while len(sends) < issued and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)
    conn.transport.close()
    return sends


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread id of process ``pid``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = task.name  # the thread id; named from the broker's own "thread" events
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


probe_tid = [0]


def probe(directory: Path, every_s: float, stop: threading.Event, out: list[tuple[int, int]]) -> None:
    """A 4 KiB append + ``fdatasync`` to a file of its own on the same file system every
    ``every_s``, beside the broker: what one fsync costs at the same moments as the rounds."""
    probe_tid[0] = threading.get_native_id()
    path = directory / "probe-fsync.bin"
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        while not stop.wait(every_s):
            t0 = now_ns()
            os.write(fd, block)
            os.fdatasync(fd)
            out.append((t0, now_ns()))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- analysis
def q(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * p))], 1)


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": q(values, 0.5), "p90": q(values, 0.9), "p99": q(values, 0.99), "max": q(values, 1.0)}


def analyse(sends: list[tuple[int, int, bool]], events: list[list[Any]], warmup_s: float) -> dict[str, Any]:
    if not sends:
        return {"error": "no sends"}
    start = min(s for s, _, _ in sends) + int(warmup_s * 1e9)
    sends = [x for x in sends if x[0] >= start]
    syncs = [e for e in events if e[0] in ("fdatasync", "fsync")]
    cl = sorted((e for e in syncs if "/commitlog/" in e[4] and e[1] == "group-commit"), key=lambda e: e[2])
    cl_starts = [e[2] for e in cl]
    cl_ids = {id(e) for e in cl}
    others = [e for e in events if id(e) not in cl_ids and e[0] not in MARKS]
    lat: list[float] = []
    to_fs: list[float] = []
    fs: list[float] = []
    after: list[float] = []
    rows: list[tuple[int, int, list[Any] | None]] = []
    for s, a, _ok in sends:
        i = bisect.bisect_left(cl_starts, s)
        r = None
        if i < len(cl) and cl[i][3] <= a:
            r = cl[i]
        lat.append((a - s) / 1e3)
        if r is None:
            rows.append((s, a, None))
            continue
        to_fs.append((r[2] - s) / 1e3)
        fs.append((r[3] - r[2]) / 1e3)
        after.append((a - r[3]) / 1e3)
        rows.append((s, a, r))
    p99 = q(lat, 0.99)
    slow = [x for x in rows if (x[1] - x[0]) / 1e3 >= p99]
    marks = {k: sorted(e[2] for e in events if e[0] == k) for k in MARKS}
    # The reads (data_received) and kicks with their ends, by start.
    spans = {k: sorted((e[2], e[3]) for e in events if e[0] == k) for k in ("recv", "kick")}
    written_start = [e[3] for e in sorted((e for e in events if e[0] == "written"), key=lambda e: e[2])]

    def first_after(kind: str, t: int) -> int | None:
        m = marks[kind]
        i = bisect.bisect_left(m, t)
        return m[i] if i < len(m) else None

    cl_ends = [e[3] for e in cl]
    phases: dict[str, list[float]] = {
        "send_to_put": [],
        "put_to_kick": [],
        "kick_to_fsync_start_idle": [],
        "kick_to_fsync_start_busy": [],
        "fsync_end_to_completion_posted": [],
        "posted_to_loop_drain": [],
        "drain_to_answer_at_client": [],
    }
    busy_at_kick = 0
    fine: dict[str, list[float]] = {}
    fine_inline: dict[str, list[float]] = {}
    fine_async: dict[str, list[float]] = {}
    for s, a, r in rows:
        if r is None:
            # No round (async flush): the read that carried the send, answered inside it.
            i = bisect.bisect_left(spans["recv"], (s, 0))
            if i < len(spans["recv"]) and spans["recv"][i][1] <= a:
                recv0, recv1 = spans["recv"][i]
                for name, value in (
                    ("client_send_to_read_on_loop", recv0 - s),
                    ("read_on_loop", recv1 - recv0),
                    ("read_end_to_client", a - recv1),
                    ("total", a - s),
                ):
                    fine_async.setdefault(name, []).append(value / 1e3)
            continue
        put = first_after("submit", s)
        kick = first_after("kick", put) if put is not None else None
        if r[4].endswith("#inline") and put is not None and kick is not None:
            # An inline round: its fdatasync and the answers inside the kick, no completion posted.
            i = bisect.bisect_right(spans["recv"], (put, 1 << 62)) - 1
            ki = bisect.bisect_left(spans["kick"], (kick, 0))
            if i < 0 or ki >= len(spans["kick"]):
                continue
            recv0, recv1 = spans["recv"][i]
            kick1 = spans["kick"][ki][1]
            if not (s <= recv0 <= put <= recv1 <= kick <= r[2] <= r[3] <= kick1 <= a):
                continue
            written = first_after("written", r[3])
            if written is not None and written <= kick1:
                fine_inline.setdefault("fsync_end_to_write_end", []).append((written - r[3]) / 1e3)
                fine_inline.setdefault("write_end_to_client", []).append((a - written) / 1e3)
            for name, value in (
                ("client_send_to_read_on_loop", recv0 - s),
                ("read_to_put", put - recv0),
                ("put_to_read_end", recv1 - put),
                ("read_end_to_kick", kick - recv1),
                ("kick_to_fsync_start", r[2] - kick),
                ("fsync", r[3] - r[2]),
                ("fsync_end_to_answers_written", kick1 - r[3]),
                ("answers_written_to_client", a - kick1),
                ("total", a - s),
            ):
                fine_inline.setdefault(name, []).append(value / 1e3)
            continue
        comp = first_after("complete", r[3])
        drain = first_after("drain", comp) if comp is not None else None
        if put is None or kick is None or comp is None or drain is None or not (put <= kick <= r[2]):
            continue
        if drain > a:
            continue
        phases["send_to_put"].append((put - s) / 1e3)
        phases["put_to_kick"].append((kick - put) / 1e3)
        # Was a commit-log fdatasync in progress when the batch was handed in?
        j = bisect.bisect_right(cl_starts, kick) - 1
        busy = j >= 0 and cl_ends[j] > kick
        busy_at_kick += busy
        phases["kick_to_fsync_start_busy" if busy else "kick_to_fsync_start_idle"].append((r[2] - kick) / 1e3)
        phases["fsync_end_to_completion_posted"].append((comp - r[3]) / 1e3)
        phases["posted_to_loop_drain"].append((drain - comp) / 1e3)
        phases["drain_to_answer_at_client"].append((a - drain) / 1e3)
        # The finer legs (compiled rounds, sends answered by the lane): the read that carried the
        # put, the kick's own time, the reader's end (answers written).
        i = bisect.bisect_right(spans["recv"], (put, 1 << 62)) - 1
        ki = bisect.bisect_left(spans["kick"], (kick, 0))
        answered = first_after("answered", drain)
        if i < 0 or ki >= len(spans["kick"]) or answered is None or answered > a or busy:
            continue
        recv0, recv1 = spans["recv"][i]
        kick1 = spans["kick"][ki][1]
        if not (s <= recv0 <= put <= recv1 <= kick <= r[2]):
            continue
        for name, value in (
            ("client_send_to_read_on_loop", recv0 - s),
            ("read_to_put", put - recv0),
            ("put_to_read_end", recv1 - put),
            ("read_end_to_kick", kick - recv1),
            ("kick_to_fsync_start", r[2] - kick),  # the post and the worker's wake-up
            ("kick_wall_not_in_total", kick1 - kick),
            ("fsync", r[3] - r[2]),
            ("fsync_end_to_loop_reader", drain - r[3]),
            ("reader_to_answers_written", answered - drain),
            ("answers_written_to_client", a - answered),
            ("total", a - s),
        ):
            fine.setdefault(name, []).append(value / 1e3)
        written = first_after("written", drain)
        if written is not None and written <= answered:
            # The answers' write inside the reader (the rest of it runs after the client got them).
            fine.setdefault("reader_to_write_end", []).append((written - drain) / 1e3)
            fine.setdefault("write_end_to_client", []).append((a - written) / 1e3)
            fine.setdefault("write_end_to_reader_end", []).append((answered - written) / 1e3)
            completing = first_after("completing", drain)
            w = bisect.bisect_left(marks["written"], written)
            w0 = written_start[w] if w < len(written_start) else None
            if completing is not None and w0 is not None and drain <= completing <= w0 <= written:
                fine.setdefault("reader_drain_and_bookkeeping", []).append((completing - drain) / 1e3)
                fine.setdefault("reader_lane_answer_to_write", []).append((w0 - completing) / 1e3)
                fine.setdefault("reader_write_call", []).append((written - w0) / 1e3)

    def kind(e: list[Any]) -> str:
        if e[0] in ("fdatasync", "fsync"):
            p = e[4]
            for tag in ("commitlog", "consumequeue", "index", "checkpoint", "config"):
                if f"/{tag}" in p:
                    return f"{e[0]}:{tag}:{e[1]}"
            return f"{e[0]}:{Path(p).name}:{e[1]}"
        return f"{e[0]}:{e[4]}:{e[1]}" if e[0] == "gc" else f"{e[0]}:{e[1]}"

    def overlapping(s: int, a: int) -> set[str]:
        return {kind(e) for e in others if e[2] < a and e[3] > s}

    slow_with: dict[str, int] = {}
    for s, a, _r in slow:
        for k in overlapping(s, a):
            slow_with[k] = slow_with.get(k, 0) + 1
    # The same for a sample of all sends: how often each event overlaps any send at all.
    step = max(1, len(rows) // 2000)
    any_with: dict[str, int] = {}
    sample = rows[::step]
    for s, a, _r in sample:
        for k in overlapping(s, a):
            any_with[k] = any_with.get(k, 0) + 1
    slow_cl = [(r[3] - r[2]) / 1e3 for _s, _a, r in slow if r is not None]

    # Each commit-log round by what came with it: the zeros written ahead since the round before
    # (their pages are this round's to write back, converting the reserved extents), another
    # thread's sync running during it (its journal commit and writes on the same disk), or neither.
    za_ends = sorted(e[3] for e in events if e[0] == "zero_ahead")
    bg = [e for e in others if e[0] in ("fdatasync", "fsync")]
    round_class: dict[int, str] = {}
    for i, e in enumerate(cl):
        lo = cl[i - 1][2] if i else e[2] - 10**9
        z = bisect.bisect_left(za_ends, lo)
        if z < len(za_ends) and za_ends[z] < e[2]:
            round_class[id(e)] = "after_zeros_ahead"
            continue
        hit = [b for b in bg if b[2] < e[3] and b[3] > e[2]]
        round_class[id(e)] = ("beside_" + kind(hit[0]).split(":")[1]) if hit else "plain"
    rounds_by_class: dict[str, list[float]] = {}
    for e in cl:
        if e[2] >= start:
            rounds_by_class.setdefault(round_class[id(e)], []).append((e[3] - e[2]) / 1e3)
    sends_by_class: dict[str, list[float]] = {}
    for s, a, r in rows:
        c = round_class[id(r)] if r is not None else "unmatched"
        sends_by_class.setdefault(c, []).append((a - s) / 1e3)
    slow_by_class: dict[str, int] = {}
    for _s, _a, r in slow:
        c = round_class[id(r)] if r is not None else "unmatched"
        slow_by_class[c] = slow_by_class.get(c, 0) + 1
    by_kind: dict[str, list[float]] = {}
    t_end = max(a for _s, a, _ in sends)
    for e in events:
        if e[0] not in (*MARKS, "thread") and e[2] >= start and e[3] <= t_end:
            by_kind.setdefault(kind(e), []).append((e[3] - e[2]) / 1e3)
    span = (t_end - start) / 1e9
    return {
        "sends": len(sends),
        "seconds": round(span, 2),
        "latency_us": summary(lat),
        "matched_to_a_round": len(to_fs),
        "send_to_fsync_start_us": summary(to_fs),
        "commitlog_fsync_of_the_round_us": summary(fs),
        "fsync_end_to_answer_us": summary(after),
        "commitlog_fsyncs": len([e for e in cl if e[2] >= start]),
        "fine_phases_idle_kick_us": {
            k: {**summary(v), "mean": round(statistics.fmean(v), 1), "n": len(v)} for k, v in fine.items()
        },
        "fine_phases_inline_round_us": {
            k: {**summary(v), "mean": round(statistics.fmean(v), 1), "n": len(v)}
            for k, v in fine_inline.items()
        },
        "fine_phases_no_round_us": {
            k: {**summary(v), "mean": round(statistics.fmean(v), 1), "n": len(v)}
            for k, v in fine_async.items()
        },
        "inline_rounds": len([e for e in cl if e[2] >= start and e[4].endswith("#inline")]),
        "phases_us": {
            k: {**summary(v), "mean": round(statistics.fmean(v), 1) if v else 0} for k, v in phases.items()
        },
        "phased_sends": len(phases["send_to_put"]),
        "share_handed_in_while_a_round_was_in_fdatasync": round(
            busy_at_kick / max(1, len(phases["send_to_put"])), 3
        ),
        "rounds_by_class_us": {
            k: {"count": len(v), **summary(v), "mean": round(statistics.fmean(v), 1)}
            for k, v in sorted(rounds_by_class.items())
        },
        "sends_by_their_round_class_us": {
            k: {"count": len(v), **summary(v), "mean": round(statistics.fmean(v), 1)}
            for k, v in sorted(sends_by_class.items())
        },
        "slow": {
            "threshold_us": p99,
            "by_their_round_class": slow_by_class,
            "count": len(slow),
            "their_round_fsync_us": summary(slow_cl),
            "overlapped_by": dict(sorted(slow_with.items(), key=lambda kv: -kv[1])),
            "share_of_all_sends_overlapped_by": {
                k: round(v / len(sample), 4) for k, v in sorted(any_with.items(), key=lambda kv: -kv[1])
            },
        },
        "events_per_s_and_us": {
            k: {"per_s": round(len(v) / span, 2), **summary(v), "mean": round(statistics.fmean(v), 1)}
            for k, v in sorted(by_kind.items())
        },
    }


def by_overlap_mode(
    sends: list[tuple[int, int, bool]], events: list[list[Any]], warmup_s: float
) -> dict[str, Any]:
    """With ``TIDEMQ_TRACE_OVERLAP_TOGGLE_MS``: the sends of the overlapping rounds' "on" and
    "off" windows analysed apart (each send by the mode at its send time; the first 20 ms of a
    window left out: rounds of the other mode still in flight)."""
    modes = sorted((e[2], e[1]) for e in events if e[0] == "mode")
    if not sends or not modes:
        return {}
    start = min(s for s, _, _ in sends) + int(warmup_s * 1e9)
    times = [t for t, _m in modes]
    split: dict[str, list[tuple[int, int, bool]]] = {"on": [], "off": []}
    for x in sends:
        i = bisect.bisect_right(times, x[0]) - 1
        if x[0] < start or i < 0 or x[0] - times[i] < 20_000_000:
            continue
        split[modes[i][1]].append(x)
    keep = (
        "sends",
        "latency_us",
        "send_to_fsync_start_us",
        "commitlog_fsync_of_the_round_us",
        "fsync_end_to_answer_us",
        "phases_us",
        "share_handed_in_while_a_round_was_in_fdatasync",
    )
    # Commit-log rounds started in each mode's windows, per second of those windows.
    end = max(a for _s, a, _ok in sends)
    spans = [(t, nxt, m) for (t, m), (nxt, _n) in zip(modes, [*modes[1:], (end, "")], strict=True)]
    starts = [e[2] for e in events if e[0] == "fdatasync" and e[1] == "group-commit" and e[2] >= start]
    out: dict[str, Any] = {}
    for mode, part in split.items():
        if part:
            full = analyse(part, events, 0.0)
            out[mode] = {k: full[k] for k in keep if k in full}
            mine = [(max(a, start), b) for a, b, m in spans if m == mode and b > start]
            secs = sum(b - a for a, b in mine) / 1e9
            n = sum(1 for t in starts if any(a <= t < b for a, b in mine))
            out[mode]["commitlog_rounds_per_s"] = round(n / secs, 1) if secs else 0
    return {"by_overlap_mode": out}


def analyse_probe(
    probes: list[tuple[int, int]],
    events: list[list[Any]],
    sends: list[tuple[int, int, bool]],
    warmup_s: float,
) -> dict[str, Any]:
    """The probe's fsyncs over the run (the same span as the sends' percentiles), and whether the
    commit log's slow rounds met a slow probe fsync (the disk stalled for everyone) or not."""
    start = min(s for s, _, _ in sends) + int(warmup_s * 1e9)
    probes = [p for p in probes if p[0] >= start]
    cl = [e for e in events if e[0] == "fdatasync" and e[1] == "group-commit" and e[2] >= start]
    out: dict[str, Any] = {"count": len(probes), "fsync_us": summary([(b - a) / 1e3 for a, b in probes])}
    for floor_us in (1000, 2000):
        slow = [e for e in cl if e[3] - e[2] >= floor_us * 1000]
        met = [
            e
            for e in slow
            if any(p[0] < e[3] and p[1] > e[2] and p[1] - p[0] >= floor_us * 500 for p in probes)
        ]
        overlapped = [e for e in slow if any(p[0] < e[3] and p[1] > e[2] for p in probes)]
        out[f"commitlog_rounds_over_{floor_us}us"] = {
            "count": len(slow),
            "with_a_probe_fsync_during_it": len(overlapped),
            "of_which_the_probe_took_half_as_long_or_more": len(met),
        }
    return out


# --------------------------------------------------------------------------- block layer
BLK_EVENTS = ("block:block_rq_issue", "block:block_rq_complete")


def start_blk(out: Path) -> Any:
    """``perf record`` of every block request issued and completed on the machine, stamped with
    CLOCK_MONOTONIC (the broker's and the client's clock)."""
    cmd = ["perf", "record", "-q", "-m", "4096", "-k", "CLOCK_MONOTONIC", "-a", "-o", str(out)]
    for e in BLK_EVENTS:
        cmd += ["-e", e]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf needs a moment to attach
    return proc


def read_blk(data: Path) -> list[tuple[int, int, int, str, str, int, int]]:
    """The block requests in ``data``: (issue ns, complete ns, issuing tid, issuing comm, rwbs,
    bytes, first sector), matched issue to completion by sector and length (flushes: in order)."""
    text = subprocess.run(
        ["perf", "script", "-i", str(data)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    pending: dict[tuple[str, str], list[tuple[int, int, str, str, int, int]]] = {}
    flushes: list[tuple[int, int, str, str, int, int]] = []
    out: list[tuple[int, int, int, str, str, int, int]] = []
    for line in text.splitlines():
        head, sep, trace = line.partition("block:block_rq_")
        if not sep:
            continue
        parts = head.split()  # comm (may hold spaces), tid, [cpu], time:
        try:
            comm, tid = " ".join(parts[:-3]), parts[-3]
            t = int(round(float(parts[-1].rstrip(":")) * 1e9))
            trace = trace.lstrip()
            kind, rest = trace.split(": ", 1)
            f = rest.split()
        except ValueError:
            continue
        rwbs = f[1]
        if kind == "issue":
            nbytes = int(f[2])
            sector, nsec = f[4], f[6]
            rec = (t, int(tid), comm.strip(), rwbs, nbytes, int(sector))
            if rwbs.startswith("F") and nbytes == 0:
                flushes.append(rec)
            else:
                pending.setdefault((sector, nsec), []).append(rec)
        elif kind == "complete":
            sector, nsec = f[3], f[5]
            if rwbs.startswith("F"):
                if flushes:
                    # Flushes carry no identity and events may be lost under load: pair each
                    # completion with the latest issue (a lower bound of its time in the device).
                    i0, tid0, comm0, rw0, n0, s0 = flushes.pop()
                    out.append((i0, t, tid0, comm0, rw0, n0, s0))
                continue
            q = pending.get((sector, nsec))
            if q:
                # The latest issue of that sector: a rewrite of it is not in the device twice.
                i0, tid0, comm0, rw0, n0, s0 = q.pop()
                out.append((i0, t, tid0, comm0, rw0, n0, s0))
    out.sort()
    return out


def file_extents(root: Path) -> list[tuple[int, int, str]]:
    """(first sector, end sector, kind) of every extent of the files under ``root`` (``FIEMAP``
    through ``filefrag``), the kind being the store directory the file is in."""
    out: list[tuple[int, int, str]] = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(root).parts
        kind = rel[1] if len(rel) > 1 and rel[0] == "data" else rel[0]  # commitlog, index, ...
        r = subprocess.run(
            ["filefrag", "-e", "-b4096", str(path)], capture_output=True, text=True, check=False
        )
        for line in r.stdout.splitlines():
            f = line.replace(":", " ").replace("..", " ").split()
            # "ext: logical_offset: physical_offset: length: expected: flags:"
            if len(f) >= 6 and f[0].isdigit():
                try:
                    phys, length = int(f[3]), int(f[5])
                except ValueError:
                    continue
                out.append((phys * 8, (phys + length) * 8, kind))
    out.sort()
    return out


def analyse_blk(
    reqs: list[tuple[int, int, int, str, str, int, int]],
    events: list[list[Any]],
    sends: list[tuple[int, int, bool]],
    warmup_s: float,
    probe_tid: int,
    extents: list[tuple[int, int, str]],
) -> dict[str, Any]:
    """Who put what on the device, and what the slow commit-log rounds had in the device with them.

    A request's owner: the broker's thread that issued it (by tid), ``probe``, ``kworker`` (the
    kernel's writeback and the block layer's flush machinery: a cache flush ``F`` is issued from
    there for everyone), or ``other:<comm>`` (another process on the machine).  A round "had" an
    owner's request when that request was in the device (issued, not completed) at any moment of
    the round's ``fdatasync``; the same is counted for all rounds, so a cause shows as a share of
    slow rounds well above its share of all rounds."""
    start = min(s for s, _, _ in sends) + int(warmup_s * 1e9)
    end = max(a for _s, a, _ in sends)
    tids = {int(e[2]): str(e[1]) for e in events if e[0] == "thread"}
    cl_tids = {t for t, n in tids.items() if n == "group-commit"}

    ext_starts = [e[0] for e in extents]

    def file_of(sector: int) -> str:
        i = bisect.bisect_right(ext_starts, sector) - 1
        if i >= 0 and sector < extents[i][1]:
            return extents[i][2]
        return "?"

    def owner(tid: int, comm: str, rwbs: str, sector: int = -1) -> str:
        if tid in cl_tids:
            return "group-commit"
        if tid in tids:
            return f"broker:{tids[tid]}"
        if tid == probe_tid:
            return "probe"
        if comm.startswith("kworker"):
            # The kernel's writeback: whose file, by the sectors of the broker's files.
            return "kworker:flush" if rwbs.startswith("F") else f"kworker:{file_of(sector)}"
        return f"other:{comm}"

    reqs = [r for r in reqs if r[1] >= start and r[0] <= end]
    span = (end - start) / 1e9
    by_owner: dict[str, dict[str, Any]] = {}  # requests, bytes, flushes, device_us (a list)
    for i0, t1, tid, comm, rwbs, n, sector in reqs:
        o = owner(tid, comm, rwbs, sector)
        d = by_owner.setdefault(o, {"requests": 0, "bytes": 0, "flushes": 0, "device_us": []})
        d["requests"] += 1
        d["bytes"] += n
        d["flushes"] += rwbs.startswith("F")
        d["device_us"].append((t1 - i0) / 1e3)
    owners_summary = {
        o: {
            "per_s": round(d["requests"] / span, 1),
            "kib_per_s": round(d["bytes"] / span / 1024, 1),
            "flushes_per_s": round(d["flushes"] / span, 2),
            "device_us": summary(d["device_us"]),
        }
        for o, d in sorted(by_owner.items(), key=lambda kv: -kv[1]["bytes"])
    }
    cl = sorted(
        (e for e in events if e[0] == "fdatasync" and e[1] == "group-commit" and start <= e[2] <= end),
        key=lambda e: e[2],
    )
    issues = [r[0] for r in reqs]
    # Requests may stay long in the device: look back far enough for any that overlap a round.
    longest = max((r[1] - r[0] for r in reqs), default=0)

    def had(e: list[Any]) -> tuple[dict[str, int], float, int]:
        lo = bisect.bisect_left(issues, e[2] - longest)
        hi = bisect.bisect_right(issues, e[3])
        seen: dict[str, int] = {}
        flush_us = 0.0
        flushes = 0
        for r in reqs[lo:hi]:
            if r[1] <= e[2]:
                continue
            o = owner(r[2], r[3], r[4], r[6])
            if r[4].startswith("F"):
                flushes += 1
                flush_us = max(flush_us, (r[1] - r[0]) / 1e3)
            if o in ("group-commit", "kworker:flush"):
                continue
            seen[o] = seen.get(o, 0) + r[5]
        return seen, flush_us, flushes

    rounds_with: dict[str, int] = {}
    slow_with: dict[str, int] = {}
    slow_bytes: dict[str, int] = {}
    slow_rows: list[dict[str, Any]] = []
    slow_flush_us: list[float] = []
    all_flush_us: list[float] = []
    flushes_in_slow: list[int] = []
    durations = sorted((e[3] - e[2]) for e in cl)
    floor = max(1_000_000, durations[int(len(durations) * 0.99)] if durations else 0)
    n_slow = 0
    for e in cl:
        seen, flush_us, flushes = had(e)
        all_flush_us.append(flush_us)
        for o in seen:
            rounds_with[o] = rounds_with.get(o, 0) + 1
        if e[3] - e[2] >= floor:
            n_slow += 1
            slow_flush_us.append(flush_us)
            flushes_in_slow.append(flushes)
            for o, b in seen.items():
                slow_with[o] = slow_with.get(o, 0) + 1
                slow_bytes[o] = slow_bytes.get(o, 0) + b
            if len(slow_rows) < 40:
                slow_rows.append(
                    {
                        "t_s": round((e[2] - start) / 1e9, 3),
                        "fdatasync_us": round((e[3] - e[2]) / 1e3),
                        "cache_flush_in_device_us": round(flush_us),
                        "cache_flushes_in_it": flushes,
                        "others_kib_in_device": {o: b // 1024 for o, b in seen.items()},
                    }
                )
    # A round's fdatasync against what the others wrote to the device since the round before it
    # ended: a device cache flush makes durable everything written before it, whoever wrote it.
    bins = [(0, 16), (16, 64), (64, 256), (256, 1024), (1024, 4096), (4096, 1 << 40)]
    by_bin: dict[str, list[float]] = {}
    bin_owners: dict[str, dict[str, int]] = {}
    written = sorted(
        (r[1], r[5], owner(r[2], r[3], r[4], r[6]))
        for r in reqs
        if not r[4].startswith("F") and "W" in r[4] and r[5] and r[2] not in cl_tids
    )
    w_done = [w[0] for w in written]
    for i, e in enumerate(cl):
        if not i:
            continue
        lo = bisect.bisect_right(w_done, cl[i - 1][3])
        hi = bisect.bisect_right(w_done, e[3])
        kib = sum(w[1] for w in written[lo:hi]) // 1024
        name = next(f"{a}-{b}KiB" if b < 1 << 40 else f">{a}KiB" for a, b in bins if a <= kib < b)
        by_bin.setdefault(name, []).append((e[3] - e[2]) / 1e3)
        own = bin_owners.setdefault(name, {})
        for w in written[lo:hi]:
            own[w[2]] = own.get(w[2], 0) + w[1] // 1024
    return {
        "seconds": round(span, 2),
        "round_fdatasync_us_by_kib_others_wrote_since_the_round_before": {
            k: {
                "count": len(v),
                **summary(v),
                "kib_by_owner": dict(sorted(bin_owners.get(k, {}).items(), key=lambda kv: -kv[1])),
            }
            for k, v in sorted(
                by_bin.items(), key=lambda kv: int(kv[0].lstrip(">").split("-")[0].rstrip("KiB"))
            )
        },
        "by_owner": owners_summary,
        "rounds": len(cl),
        "slow_round_floor_us": round(floor / 1e3),
        "slow_rounds": n_slow,
        "share_of_all_rounds_with_their_requests_in_the_device": {
            o: round(v / max(1, len(cl)), 4) for o, v in sorted(rounds_with.items(), key=lambda kv: -kv[1])
        },
        "share_of_slow_rounds_with_their_requests_in_the_device": {
            o: round(v / max(1, n_slow), 3) for o, v in sorted(slow_with.items(), key=lambda kv: -kv[1])
        },
        "slow_rounds_their_kib_in_the_device": {o: b // 1024 for o, b in slow_bytes.items()},
        "cache_flush_in_device_us_all_rounds_lower_bound": summary(all_flush_us),
        "cache_flush_in_device_us_slow_rounds_lower_bound": summary(slow_flush_us),
        "slow_rounds_detail": slow_rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0, help="seconds left out of the analysis")
    p.add_argument("--toml", default="", help="TOML appended to the broker's config")
    p.add_argument(
        "--tree", default="", help="PYTHONPATH for the broker (old code, as compare_ab's --b-tree)"
    )
    p.add_argument("--dir", default=None)
    p.add_argument(
        "--flush",
        default="sync",
        choices=("sync", "async"),
        help="async: the same sends without a round to wait for (the request path's own latency)",
    )
    p.add_argument(
        "--probe-ms",
        type=float,
        default=0.0,
        help="also append 4 KiB + fdatasync to a file of the client's every this many ms (0: off)",
    )
    p.add_argument("--out", default="", help="also write the raw events and sends here (JSON)")
    p.add_argument(
        "--blk",
        action="store_true",
        help="also trace the block layer (perf record of block_rq_issue/complete, whole machine)",
    )
    p.add_argument(
        "--system",
        default="tidemq",
        choices=("tidemq", "redis"),
        help="redis: redis-server with appendfsync always instead (latency, probe and --blk only)",
    )
    args = p.parse_args()
    import compare
    import compare_systems
    from compare_limits import fsync_latency

    work = Path(tempfile.mkdtemp(prefix="tidemq-synctrace-", dir=args.dir))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, work, True)  # also when the run fails: the disk is nearly full
    ev_path = work / "events.jsonl"
    if args.system == "redis":
        server = compare_systems.start_redis(work / "broker", "always")
    else:
        server = start_broker(work / "broker", args.toml, args.tree, ev_path, args.flush)
    try:
        bench = compare.Bench(argparse.Namespace(procs=1, inflight=64, messages=1000), server)
        bench.setup()
        spec = bench.spec("rate", 1024, batch=1)
        before = fsync_latency(work, 500)
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        probes: list[tuple[int, int]] = []
        stop = threading.Event()
        prober = None
        if args.probe_ms > 0:
            prober = threading.Thread(
                target=probe, args=(work, args.probe_ms / 1e3, stop, probes), daemon=True
            )
            prober.start()
        blk_data = Path(tempfile.mkdtemp(prefix="synctrace-blk-", dir="/dev/shm")) / "blk.data"
        atexit.register(shutil.rmtree, blk_data.parent, True)
        blk = start_blk(blk_data) if args.blk else None  # in memory: perf's writes stay off the disk
        assert server.proc is not None
        pid = server.proc.pid
        cpu0, t_cpu0 = thread_cpu(pid), time.perf_counter()
        with runner:
            sends = runner.run(drive(spec, args.rate, args.seconds))
        cpu1, t_cpu1 = thread_cpu(pid), time.perf_counter()
        redis_tids = {t.name: (t / "comm").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir()}
        if blk is not None:
            blk.send_signal(2)
            blk.wait(30)
        stop.set()
        if prober is not None:
            prober.join()
        time.sleep(0.5)  # the broker's dump thread writes every 200 ms
        extents = file_extents(work / "broker") if args.blk else []
        after = fsync_latency(work, 500)
    finally:
        server.stop()
    events = [json.loads(line) for line in ev_path.read_text().splitlines()] if ev_path.exists() else []
    result = {
        "system": args.system,
        "flush": args.flush,
        "rate": args.rate,
        "toml": args.toml,
        "tree": args.tree,
        "skip_sync": os.environ.get("TIDEMQ_TRACE_SKIP_SYNC", ""),
        "load_avg": os.getloadavg(),
        "fsync_4k_before": before,
        "fsync_4k_after": after,
    }
    if args.system == "redis":
        events = [["thread", name, int(tid), 0, "", 0] for tid, name in redis_tids.items()]
        start = min(s for s, _, _ in sends) + int(args.warmup * 1e9)
        result["sends"] = len(sends)
        result["latency_us"] = summary([(a - s) / 1e3 for s, a, _ in sends if s >= start])
    else:
        result.update(analyse(sends, events, args.warmup))
        result.update(by_overlap_mode(sends, events, args.warmup))
    span = t_cpu1 - t_cpu0
    names = {str(e[2]): e[1] for e in events if e[0] == "thread"}
    by_name: dict[str, float] = {}
    for k, v in cpu1.items():
        name = names.get(k, "other")
        by_name[name] = by_name.get(name, 0.0) + (v - cpu0.get(k, 0.0)) / span
    result["broker_cpu_per_s_by_thread"] = {
        k: round(v, 3) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v > 0
    }
    result["broker_cpu_us_per_send"] = round(
        sum(v - cpu0.get(k, 0.0) for k, v in cpu1.items()) / max(1, len(sends)) * 1e6, 1
    )
    if probes and args.system == "redis":
        start = min(s for s, _, _ in sends) + int(args.warmup * 1e9)
        result["probe"] = {"fsync_us": summary([(b - a) / 1e3 for a, b in probes if a >= start])}
    elif probes:
        result["probe"] = analyse_probe(probes, events, sends, args.warmup)
    if args.blk:
        result["block_layer"] = analyse_blk(
            read_blk(blk_data), events, sends, args.warmup, probe_tid[0], extents
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"sends": sends, "events": events, "probes": probes}))
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(blk_data.parent, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
