"""What stalls the broker's event loop at a fixed send rate (issue 38, looptail).

    python bench/loop_tail_trace.py [--rate 2000] [--seconds 10] [--flush sync] [--conns 2]
                                    [--toml '...'] [--tree DIR] [--out FILE] [--top 25]

Starts ``tidemq standalone`` as ``compare.py`` does, with hooks installed before it runs
(:func:`install`): the event loop is a subclass of uvloop's whose ``call_soon``, ``call_later``,
``call_at``, ``call_soon_threadsafe``, ``add_reader`` and ``add_writer`` time every callback they
schedule (task steps and wake-ups, future callbacks, timers, the flush rounds' completions), and
the tcp transport's protocol methods (``data_received``...: uvloop calls them from C) are timed the
same way.  Each top-level callback is recorded with its wall time and the loop thread's CPU time
(``CLOCK_THREAD_CPUTIME_ID``) under a name (the task's coroutine, the function's qualified name);
every cyclic-GC pass too.  Nothing is written while the broker runs: the records go to a file at
its exit.

Beside it a sampler process reads ``/proc/<pid>/task/*/schedstat`` every ``--sample-ms`` (the
nanoseconds each broker thread ran), so a long callback whose CPU time is short can be told
apart: another broker thread ran meanwhile (the GIL) or none did (the machine's other load).
One client process (``compare_load``'s connection, ``--conns`` of them round-robin) sends 1 KiB
``SEND_MESSAGE_V2`` open-loop at ``--rate`` and records each send's departure and answer on the
same clock (CLOCK_MONOTONIC).

Prints JSON: the sends' p50/p99; callbacks by name (count, CPU, how many took over 300 µs and
over 1 ms, wall and CPU); *busy stretches* (callbacks less than ``--merge-us`` apart, i.e. one
loop turn or back-to-back turns) over 300 µs and 1 ms per second, the longest ones with what ran
in them; the slowest 1 % of sends and the longest stretch each met; GC passes; the other threads'
CPU per second and during the long stretches.  The machine is shared: wall times are inflated,
so the counts and CPU times are the evidence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

now_ns = time.perf_counter_ns  # CLOCK_MONOTONIC: comparable across processes


# --------------------------------------------------------------------------- in the broker
def install(out: str, sample_us: int = 0) -> None:
    """Time every event-loop callback of this process; write the records to ``out`` at exit.

    ``sample_us`` > 0: a ``SIGPROF`` every that many µs of the process's CPU time; when it lands in a
    callback that has run for more than 250 µs, the loop thread's Python stack is recorded (the
    handler runs between bytecodes: a compiled call shows as its caller)."""
    import array
    import asyncio
    import atexit
    import functools
    import gc
    import resource
    import threading

    import uvloop

    #: Seven numbers a callback: start ns, wall ns, loop-thread CPU ns, name id, page faults,
    #: voluntary and involuntary context switches.  An array, not tuples: the trace must not feed
    #: the cyclic GC's young generation (a tuple per callback made it collect every few seconds).
    records = array.array("q")
    extend = records.extend
    name_ids: dict[str, int] = {}
    gcs: list[tuple[int, int, int, str, int]] = []  # (start, wall, generation, thread, collected)

    def name_id(name: str) -> int:
        i = name_ids.get(name)
        if i is None:
            i = name_ids[name] = len(name_ids)
        return i

    def usage() -> tuple[int, int, int, int]:
        # The loop thread's CPU (ns), minor page faults, voluntary and involuntary context switches.
        # (getrusage's times are tick-adjusted, lumpy: the CPU comes from the thread's clock.)
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return (thread_time(), r.ru_minflt + r.ru_majflt, r.ru_nvcsw, r.ru_nivcsw)

    thread_time = time.thread_time_ns
    depth = [0]
    cur = [0]  # the running top-level callback's start
    stacks: list[tuple[int, int, tuple[str, ...]]] = []  # (callback start, sample time, frames)
    names: dict[Any, str] = {}

    def qual(f: Any) -> str:
        mod = getattr(f, "__module__", "") or ""
        q = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
        return f"{mod.replace('tidemq_', '').replace('tidemq.', '')}.{q}" if mod else q

    def name_of(cb: Any) -> str:
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):
            tname = owner.get_name()
            if not tname.startswith("Task-"):
                return "task:" + tname  # a supervised loop: its own name
            coro = owner.get_coro()
            key = getattr(coro, "__qualname__", None) or type(coro).__name__
            n = names.get(key)
            if n is None:
                mod = getattr(getattr(coro, "cr_code", None), "co_filename", "")
                n = names[key] = f"task:{Path(mod).stem}.{key}"
            return n
        f = getattr(cb, "__func__", None)
        if f is None:
            f = cb.func if isinstance(cb, functools.partial) else cb
        n = names.get(f)
        if n is None:
            try:
                n = names[f] = qual(f)
            except TypeError:  # unhashable
                return qual(f)
        return n

    def timed(cb: Any) -> Any:
        def run(*args: Any) -> Any:
            if depth[0]:
                return cb(*args)
            depth[0] = 1
            t0 = cur[0] = now_ns()
            c0 = usage()
            try:
                return cb(*args)
            finally:
                c1 = usage()
                t1 = now_ns()
                depth[0] = 0
                extend(
                    (
                        t0,
                        t1 - t0,
                        c1[0] - c0[0],
                        name_id(name_of(cb)),
                        c1[1] - c0[1],
                        c1[2] - c0[2],
                        c1[3] - c0[3],
                    )
                )

        return run

    class TracedLoop(uvloop.Loop):  # type: ignore[misc]
        def call_soon(self, cb: Any, *args: Any, context: Any = None) -> Any:
            return super().call_soon(timed(cb), *args, context=context)

        def call_soon_threadsafe(self, cb: Any, *args: Any, context: Any = None) -> Any:
            return super().call_soon_threadsafe(timed(cb), *args, context=context)

        def call_later(self, delay: float, cb: Any, *args: Any, context: Any = None) -> Any:
            return super().call_later(delay, timed(cb), *args, context=context)

        def call_at(self, when: float, cb: Any, *args: Any, context: Any = None) -> Any:
            return super().call_at(when, timed(cb), *args, context=context)

        def add_reader(self, fd: Any, cb: Any, *args: Any) -> Any:
            return super().add_reader(fd, timed(cb), *args)

        def add_writer(self, fd: Any, cb: Any, *args: Any) -> Any:
            return super().add_writer(fd, timed(cb), *args)

    uvloop.new_event_loop = TracedLoop  # what tidemq.cli.run_service builds its loop with

    def patch_protocols() -> None:
        from tidemq_transport_tcp import connection

        cls = connection.Connection
        for meth in ("connection_made", "data_received", "eof_received", "connection_lost"):
            orig = getattr(cls, meth)

            def make(orig: Any) -> Any:
                pid = name_id(f"protocol.{orig.__name__}")

                def method(self: Any, *args: Any) -> Any:
                    if depth[0]:
                        return orig(self, *args)
                    depth[0] = 1
                    t0 = cur[0] = now_ns()
                    c0 = usage()
                    try:
                        return orig(self, *args)
                    finally:
                        c1 = usage()
                        t1 = now_ns()
                        depth[0] = 0
                        extend(
                            (
                                t0,
                                t1 - t0,
                                c1[0] - c0[0],
                                pid,
                                c1[1] - c0[1],
                                c1[2] - c0[2],
                                c1[3] - c0[3],
                            )
                        )

                return method

            setattr(cls, meth, make(orig))

    patch_protocols()

    #: The key index's drains: start, wall, CPU, faults, messages taken, on the loop thread (1/0).
    drains = array.array("q")

    def patch_index() -> None:
        try:
            from tidemq_index_hash import service
        except ImportError:
            return
        orig = service.HashIndex._drain
        main_ident = threading.main_thread().ident

        def _drain(self: Any, limit: Any = None) -> Any:
            t0 = now_ns()
            c0 = usage()
            before = self._dequeued
            try:
                return orig(self, limit)
            finally:
                c1 = usage()
                drains.extend(
                    (
                        t0,
                        now_ns() - t0,
                        c1[0] - c0[0],
                        c1[1] - c0[1],
                        self._dequeued - before,
                        int(threading.get_ident() == main_ident),
                    )
                )

        service.HashIndex._drain = _drain

    patch_index()

    gc_t0 = [0]
    census_on = os.environ.get("TIDEMQ_TRACE_GC_CENSUS") == "1"

    #: TIDEMQ_TRACE_GC_CENSUS=1: the young objects' types at the first 3 passes once serving
    census: list[dict[str, int]] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if census_on and len(census) < 3 and info["generation"] == 0 and gc.get_threshold()[0] > 10_000:
                counts: dict[str, int] = {}
                for o in gc.get_objects(0):
                    k = type(o).__qualname__
                    if k in ("tuple", "list", "dict") and o:
                        first = o[0] if k != "dict" else next(iter(o))
                        k = f"{k}[{type(first).__qualname__}]"
                    counts[k] = counts.get(k, 0) + 1
                census.append(dict(sorted(counts.items(), key=lambda kv: -kv[1])[:25]))
            gc_t0[0] = now_ns()
        else:
            gcs.append(
                (
                    gc_t0[0],
                    now_ns() - gc_t0[0],
                    info["generation"],
                    threading.current_thread().name,
                    info.get("collected", 0),
                )
            )

    gc.callbacks.append(on_gc)

    if sample_us > 0:
        import signal

        def on_prof(signum: int, frame: Any) -> None:
            if not depth[0] or frame is None:
                return
            t = now_ns()
            if t - cur[0] < 250_000:
                return
            frames = []
            f = frame
            while f is not None and len(frames) < 12:
                c = f.f_code
                frames.append(f"{Path(c.co_filename).stem}:{c.co_name}:{f.f_lineno}")
                f = f.f_back
            stacks.append((cur[0], t, tuple(frames)))

        signal.signal(signal.SIGPROF, on_prof)
        signal.setitimer(signal.ITIMER_PROF, sample_us / 1e6, sample_us / 1e6)

    def dump() -> None:
        threads = {t.native_id: t.name for t in threading.enumerate()}
        with open(out, "wb") as f:
            pickle.dump(
                {
                    "records": records.tobytes(),
                    "names": {i: n for n, i in name_ids.items()},
                    "gc": gcs,
                    "stacks": stacks,
                    "census": census,
                    "drains": drains.tobytes(),
                    "threads": threads,
                    "main": threading.main_thread().native_id,
                },
                f,
            )

    atexit.register(dump)

    def thread_names() -> None:  # thread ids and names, for the sampler's tids (written as they appear)
        seen: dict[int, str] = {}
        while True:
            time.sleep(0.5)
            changed = False
            for t in threading.enumerate():
                if t.native_id and seen.get(t.native_id) != t.name:
                    seen[t.native_id] = t.name
                    changed = True
            if changed:
                with open(out + ".threads", "w") as f:
                    json.dump(seen, f)

    threading.Thread(target=thread_names, name="trace-names", daemon=True).start()


BOOT = """
import runpy, sys
sys.path.insert(0, {here!r})
import loop_tail_trace
loop_tail_trace.install({out!r}, {sample_us!r})
sys.argv = ["tidemq"] + {argv!r}
runpy.run_module("tidemq", run_name="__main__", alter_sys=True)
"""

SAMPLER = r"""
import os, sys, time, struct
pid, every, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
now = time.perf_counter_ns
fds = {}
comms = {}
last_scan = 0
f = open(out, "w")
while True:
    t = now()
    if t - last_scan > 100_000_000:
        last_scan = t
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            break
        for tid in tids:
            if tid not in fds:
                try:
                    fds[tid] = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
                except OSError:
                    pass
    vals = []
    for tid, fd in list(fds.items()):
        if tid not in comms:
            try:
                comms[tid] = open(f"/proc/{pid}/task/{tid}/comm").read().strip().replace(" ", "_")
                f.write(f"#comm {tid} {comms[tid]}\n")
            except OSError:
                comms[tid] = "?"
        try:
            vals.append(f"{tid}:{os.pread(fd, 64, 0).split()[0].decode()}")
        except (OSError, IndexError):
            os.close(fd)
            del fds[tid]
    f.write(f"{t} {' '.join(vals)}\n")
    if not os.path.exists(f"/proc/{pid}"):
        break
    time.sleep(every)
f.close()
"""


def start_broker(work: Path, flush: str, toml: str, tree: str, out: Path, sample_us: int = 0) -> Any:
    """compare.py's tidemq broker, started inside the traced interpreter (``BOOT``)."""
    import compare_systems as systems

    def command(argv: list[str]) -> list[str]:
        return [
            sys.executable,
            "-c",
            BOOT.format(here=str(HERE), out=str(out), argv=argv, sample_us=sample_us),
        ]

    return systems.start_tidemq(work, flush, toml, command=command, pythonpath=tree, describe="traced")


# --------------------------------------------------------------------------- the client
async def drive(spec: dict[str, Any], rate: float, seconds: float, conns: int) -> list[tuple[int, int, bool]]:
    import compare_load

    cs = [await compare_load.connect(spec) for _ in range(conns)]
    sends: list[tuple[int, int, bool]] = []

    def on_done(ok: bool, latency: float) -> None:
        t = now_ns()
        sends.append((t - int(latency * 1e9), t, ok))

    for i, c in enumerate(cs):
        c.on_done = on_done
        # compare.py's senders are processes, each its own key prefix (pid, time): one per connection
        # here, or the duplicate window would see the second connection's keys as resends.
        c.prefix = f"{os.getpid():08X}{int(time.time()) + 1000 * i:08X}"
    t0 = time.perf_counter()
    issued = 0
    while time.perf_counter() - t0 < seconds:
        due = int((time.perf_counter() - t0) * rate) - issued
        for _ in range(due):
            cs[issued % conns].send()
            issued += 1
        await asyncio.sleep(0.0005)
    deadline = time.perf_counter() + 10
    while len(sends) < issued and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)
    for c in cs:
        c.transport.close()
    return sends


# --------------------------------------------------------------------------- analysis
def q(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * p))], 1)


comms: dict[str, str] = {}  # thread id -> /proc comm, from the sampler


def read_samples(path: Path) -> tuple[list[int], dict[str, list[int]]]:
    """Sampler rows: the times and, per thread id, its CPU ns at each time (carried forward)."""
    times: list[int] = []
    per: dict[str, list[int]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "#comm":
            comms[parts[1]] = parts[2]
            continue
        t = int(parts[0])
        times.append(t)
        n = len(times)
        for kv in parts[1:]:
            tid, v = kv.split(":")
            col = per.setdefault(tid, [])
            while len(col) < n - 1:
                col.append(col[-1] if col else int(v))
            col.append(int(v))
    for col in per.values():
        while len(col) < len(times):
            col.append(col[-1])
    return times, per


def cpu_between(times: list[int], col: list[int], t0: int, t1: int) -> int:
    """CPU ns a thread ran between t0 and t1 (the samples around them: a slight overestimate)."""
    import bisect

    i = max(0, bisect.bisect_right(times, t0) - 1)
    j = min(len(times) - 1, bisect.bisect_left(times, t1))
    return col[j] - col[i]


def analyse(
    sends: list[tuple[int, int, bool]],
    trace: dict[str, Any],
    samples: tuple[list[int], dict[str, list[int]]],
    thread_names: dict[str, str],
    warmup_s: float,
    merge_us: float,
    top: int,
) -> dict[str, Any]:
    start = min(s for s, _, _ in sends) + int(warmup_s * 1e9)
    end = max(a for _, a, _ in sends)
    span_s = (end - start) / 1e9
    lat = [(a - s) / 1e3 for s, a, ok in sends if s >= start]
    import array

    flat = array.array("q")
    flat.frombytes(trace["records"])
    rec_names = trace["names"]
    all_recs = [
        (flat[i], flat[i + 1], flat[i + 2], rec_names[flat[i + 3]], flat[i + 4], flat[i + 5], flat[i + 6])
        for i in range(0, len(flat), 7)
    ]
    recs = sorted((r for r in all_recs if start <= r[0] <= end), key=lambda r: r[0])
    out: dict[str, Any] = {
        "seconds": round(span_s, 2),
        "sends": len(lat),
        "send_us": {"p50": q(lat, 0.5), "p90": q(lat, 0.9), "p99": q(lat, 0.99), "max": q(lat, 1.0)},
        "callbacks": len(recs),
        "loop_cpu_s_per_s": round(sum(r[2] for r in recs) / 1e9 / span_s, 4),
    }
    # ---- by name
    by: dict[str, dict[str, float]] = {}
    cpus: dict[str, list[int]] = {}
    for _t0, wall, cpu, name, flt, vcs, ivcs in recs:
        cpus.setdefault(name, []).append(cpu)
        d = by.setdefault(
            name,
            {
                "n": 0,
                "cpu_ms": 0.0,
                "wall_ms": 0.0,
                "n_over_300us": 0,
                "n_over_1ms": 0,
                "cpu_over_300us": 0,
                "faults": 0,
                "vcsw": 0,
                "ivcsw": 0,
                "vcsw_over_300us": 0,
                "ivcsw_over_300us": 0,
            },
        )
        d["n"] += 1
        d["faults"] += flt
        d["vcsw"] += vcs
        d["ivcsw"] += ivcs
        if wall > 300_000:
            d["vcsw_over_300us"] += vcs > 0
            d["ivcsw_over_300us"] += ivcs > 0
        d["cpu_ms"] += cpu / 1e6
        d["wall_ms"] += wall / 1e6
        if wall > 300_000:
            d["n_over_300us"] += 1
        if wall > 1_000_000:
            d["n_over_1ms"] += 1
        if cpu > 300_000:
            d["cpu_over_300us"] += 1
    rows = sorted(by.items(), key=lambda kv: -(kv[1]["n_over_300us"] * 1e6 + kv[1]["cpu_ms"]))
    out["by_name"] = {
        k: {
            "n_per_s": round(v["n"] / span_s, 1),
            "cpu_us_mean": round(v["cpu_ms"] * 1e3 / v["n"], 1),
            "cpu_ms_per_s": round(v["cpu_ms"] / span_s, 2),
            "cpu_us_p50_p99_max": [
                q([c / 1e3 for c in cpus[k]], 0.5),
                q([c / 1e3 for c in cpus[k]], 0.99),
                q([c / 1e3 for c in cpus[k]], 1.0),
            ],
            "over_300us_wall": v["n_over_300us"],
            "over_1ms_wall": v["n_over_1ms"],
            "over_300us_cpu": v["cpu_over_300us"],
            "over_300us_blocked_preempted": [v["vcsw_over_300us"], v["ivcsw_over_300us"]],
            "faults_per_call": round(v["faults"] / v["n"], 3),
            "vcsw_ivcsw_per_s": [round(v["vcsw"] / span_s, 1), round(v["ivcsw"] / span_s, 1)],
        }
        for k, v in rows[:top]
    }
    # ---- long callbacks: wall, CPU, who else ran
    times, per = samples
    main_tid = str(trace["main"])
    names = dict(comms)
    names.update({str(k): v for k, v in trace["threads"].items()})
    names.update(thread_names)

    def others(t0: int, t1: int) -> dict[str, float]:
        d: dict[str, float] = {}
        if not times:
            return d
        for tid, col in per.items():
            if tid == main_tid:
                continue
            ns = cpu_between(times, col, t0, t1)
            if ns > 50_000:
                n = names.get(tid, "?")
                if n.startswith(("asyncio_", "ThreadPoolExecutor")):
                    n = "executor"
                d[n] = round(d.get(n, 0) + ns / 1e3)
        return d

    long_cb = sorted((r for r in recs if r[1] > 1_000_000), key=lambda r: -r[1])
    out["callbacks_over_1ms"] = [
        {
            "name": r[3],
            "wall_us": round(r[1] / 1e3),
            "cpu_us": round(r[2] / 1e3),
            "faults_vcsw_ivcsw": r[4:7],
            "other_threads_cpu_us": others(r[0], r[0] + r[1]),
        }
        for r in long_cb[:top]
    ]
    # ---- busy stretches: callbacks less than merge_us apart
    merge = int(merge_us * 1e3)
    stretches: list[list[Any]] = []  # [t0, t1, cpu, [(name, wall, cpu)...], faults, vcsw, ivcsw]
    for t0, wall, cpu, name, flt, vcs, ivcs in recs:
        if stretches and t0 - stretches[-1][1] <= merge:
            s = stretches[-1]
            s[1] = max(s[1], t0 + wall)
            s[2] += cpu
            s[3].append((name, wall, cpu))
            s[4] += flt
            s[5] += vcs
            s[6] += ivcs
        else:
            stretches.append([t0, t0 + wall, cpu, [(name, wall, cpu)], flt, vcs, ivcs])

    def describe(s: list[Any]) -> dict[str, Any]:
        parts: dict[str, list[int]] = {}
        for name, wall, cpu in s[3]:
            p = parts.setdefault(name, [0, 0, 0])
            p[0] += 1
            p[1] += wall
            p[2] += cpu
        biggest = sorted(parts.items(), key=lambda kv: -kv[1][1])[:4]
        return {
            "wall_us": round((s[1] - s[0]) / 1e3),
            "cpu_us": round(s[2] / 1e3),
            "callbacks": len(s[3]),
            "faults_vcsw_ivcsw": s[4:7],
            "top": {k: f"{v[0]}x wall {v[1] // 1000} cpu {v[2] // 1000}" for k, v in biggest},
            "other_threads_cpu_us": others(s[0], s[1]),
        }

    walls = [s[1] - s[0] for s in stretches]
    out["stretches"] = {
        "n": len(stretches),
        "over_300us_per_s": round(sum(w > 300_000 for w in walls) / span_s, 2),
        "over_1ms_per_s": round(sum(w > 1_000_000 for w in walls) / span_s, 2),
        "over_3ms_per_s": round(sum(w > 3_000_000 for w in walls) / span_s, 2),
        "cpu_over_300us_per_s": round(sum(s[2] > 300_000 for s in stretches) / span_s, 2),
        "cpu_over_1ms_per_s": round(sum(s[2] > 1_000_000 for s in stretches) / span_s, 2),
        # over 300 us: the loop thread blocked in the kernel (a voluntary switch: the GIL, a lock, a
        # page fault's I/O), preempted (involuntary), or neither (its own CPU)
        "over_300us_blocked_per_s": round(
            sum(s[1] - s[0] > 300_000 and s[5] > 0 for s in stretches) / span_s, 2
        ),
        "over_300us_preempted_only_per_s": round(
            sum(s[1] - s[0] > 300_000 and s[5] == 0 and s[6] > 0 for s in stretches) / span_s, 2
        ),
        "over_300us_neither_per_s": round(
            sum(s[1] - s[0] > 300_000 and s[5] == 0 and s[6] == 0 for s in stretches) / span_s, 2
        ),
        "faults_per_s": round(sum(s[4] for s in stretches) / span_s, 1),
        "wall_p50_us": q([w / 1e3 for w in walls], 0.5),
        "wall_p99_us": q([w / 1e3 for w in walls], 0.99),
    }
    # Causes of the stretches over 300 us: the name that took most of the stretch's wall time.
    causes: dict[str, list[float]] = {}
    for s in stretches:
        if s[1] - s[0] <= 300_000:
            continue
        parts: dict[str, int] = {}
        for name, wall, _cpu in s[3]:
            parts[name] = parts.get(name, 0) + wall
        main = max(parts.items(), key=lambda kv: kv[1])[0]
        c = causes.setdefault(main, [0, 0, 0, 0])
        c[0] += 1
        c[1] += 1 if s[1] - s[0] > 1_000_000 else 0
        c[2] += s[2] / 1e3
        c[3] += (s[1] - s[0]) / 1e3
    out["stretch_causes_over_300us"] = {
        k: {
            "n": v[0],
            "over_1ms": v[1],
            "cpu_us_mean": round(v[2] / v[0]),
            "wall_us_mean": round(v[3] / v[0]),
        }
        for k, v in sorted(causes.items(), key=lambda kv: -kv[1][0])[:top]
    }
    # Periodic work (named tasks, timers): the stretches it ran in, and their loop CPU.
    with_: dict[str, list[float]] = {}
    # Per named task: the other named tasks it shared a stretch with, and how often (in step?).
    companions: dict[str, dict[str, int]] = {}
    for s in stretches:
        seen: dict[str, int] = {}
        for name, _wall, _cpu in s[3]:
            if name.startswith("task:"):
                seen[name] = seen.get(name, 0) + 1
        for name in seen:
            w = with_.setdefault(name, [0, 0, 0, 0])
            w[0] += 1
            w[1] += s[2] / 1e3
            w[2] += s[2] > 300_000
            w[3] += len(seen)
            met = companions.setdefault(name, {})
            for other in seen:
                if other != name:
                    met[other] = met.get(other, 0) + 1
    # All of them (a few dozen), not --top: a loop that ticks rarely is what to look for here.
    out["periodic_task_stretches"] = {
        k: {
            "stretches_per_s": round(v[0] / span_s, 2),
            "stretch_cpu_us_mean": round(v[1] / v[0]),
            "stretch_cpu_over_300us": v[2],
            "named_tasks_per_stretch": round(v[3] / v[0], 1),
            "with": dict(sorted(companions.get(k, {}).items(), key=lambda kv: -kv[1])[:4]),
        }
        for k, v in sorted(with_.items(), key=lambda kv: -kv[1][1])
    }
    longest = sorted(stretches, key=lambda s: -(s[1] - s[0]))[:top]
    out["longest_stretches"] = [describe(s) for s in longest]
    out["costliest_stretches"] = [describe(s) for s in sorted(stretches, key=lambda s: -s[2])[:top]]
    # ---- the slowest 1 % of sends: the longest stretch each overlapped
    import bisect

    starts = [s[0] for s in stretches]
    slow = sorted(((a - s, s, a) for s, a, ok in sends if s >= start), reverse=True)[
        : max(1, len(lat) // 100)
    ]
    met: dict[str, int] = {}
    stalled = 0
    for _d, s0, a0 in slow:
        i = max(0, bisect.bisect_right(starts, s0) - 1)
        best: list[Any] | None = None
        while i < len(stretches) and stretches[i][0] <= a0:
            st = stretches[i]
            if st[1] >= s0 and (best is None or st[1] - st[0] > best[1] - best[0]):
                best = st
            i += 1
        if best is None or best[1] - best[0] < 300_000:
            met["(no stretch over 300 us)"] = met.get("(no stretch over 300 us)", 0) + 1
            continue
        stalled += 1
        parts = {}
        for name, wall, _cpu in best[3]:
            parts[name] = parts.get(name, 0) + wall
        main = max(parts.items(), key=lambda kv: kv[1])[0]
        met[main] = met.get(main, 0) + 1
    out["slowest_1pct"] = {
        "n": len(slow),
        "latency_us_min": round(slow[-1][0] / 1e3) if slow else 0,
        "met_a_stretch_over_300us": stalled,
        "by_stretch_cause": dict(sorted(met.items(), key=lambda kv: -kv[1])),
    }
    # ---- stack samples in long callbacks: the innermost frames, counted
    st = [x for x in trace.get("stacks", []) if start <= x[1] <= end]
    if st:
        by_stack: dict[str, int] = {}
        by_leaf: dict[str, int] = {}
        for _c, _t, frames in st:
            key = " < ".join(frames[:5])
            by_stack[key] = by_stack.get(key, 0) + 1
            by_leaf[frames[0]] = by_leaf.get(frames[0], 0) + 1
        out["long_callback_samples"] = {
            "n": len(st),
            "by_leaf": dict(sorted(by_leaf.items(), key=lambda kv: -kv[1])[:top]),
            "by_stack": dict(sorted(by_stack.items(), key=lambda kv: -kv[1])[:top]),
        }
    # ---- the key index's drains, on the loop and on its thread
    if trace.get("drains"):
        dr = array.array("q")
        dr.frombytes(trace["drains"])
        rows6 = [tuple(dr[i : i + 6]) for i in range(0, len(dr), 6)]
        rows6 = [r for r in rows6 if start <= r[0] <= end and r[4] > 0]
        idx: dict[str, Any] = {}
        for on_loop in (1, 0):
            sel = [r for r in rows6 if r[5] == on_loop]
            if sel:
                idx["loop" if on_loop else "index thread"] = {
                    "per_s": round(len(sel) / span_s, 2),
                    "messages_mean": round(sum(r[4] for r in sel) / len(sel), 1),
                    "cpu_us_p50_p99_max": [
                        q([r[2] / 1e3 for r in sel], 0.5),
                        q([r[2] / 1e3 for r in sel], 0.99),
                        q([r[2] / 1e3 for r in sel], 1.0),
                    ],
                    "wall_us_p50_max": [q([r[1] / 1e3 for r in sel], 0.5), q([r[1] / 1e3 for r in sel], 1.0)],
                    "faults_mean": round(sum(r[3] for r in sel) / len(sel), 1),
                }
        # An index-thread drain that holds the GIL throughout lets no loop callback start in it.
        starts_sorted = [r[0] for r in recs]
        long_thread = [r for r in rows6 if r[5] == 0 and r[1] > 100_000]
        if long_thread:
            import bisect as _b

            inside = sum(
                1
                for r in long_thread
                if _b.bisect_left(starts_sorted, r[0] + r[1]) > _b.bisect_right(starts_sorted, r[0])
            )
            idx["thread_drains_over_100us"] = len(long_thread)
            idx["thread_drains_over_100us_with_a_loop_callback_inside"] = inside
        out["index_drains"] = idx
    # ---- GC
    gcs = [g for g in trace["gc"] if start <= g[0] <= end]
    out["gc"] = {
        "passes": len(gcs),
        "by_generation": {
            str(gen): {
                "n": sum(1 for g in gcs if g[2] == gen),
                "max_us": round(max((g[1] for g in gcs if g[2] == gen), default=0) / 1e3),
                "total_us": round(sum(g[1] for g in gcs if g[2] == gen) / 1e3),
            }
            for gen in (0, 1, 2)
        },
        "threads": sorted({g[3] for g in gcs}),
        "all_passes_us": [[round((g[0] - start) / 1e9, 2), g[2], round(g[1] / 1e3)] for g in trace["gc"]],
    }
    if trace.get("census"):
        out["gc"]["young_census"] = trace["census"]
    # ---- threads' CPU over the window
    if times:
        i0 = max(0, bisect.bisect_right(times, start) - 1)
        i1 = min(len(times) - 1, bisect.bisect_left(times, end))
        span = (times[i1] - times[i0]) / 1e9
        cpu: dict[str, float] = {}
        for tid, col in per.items():
            n = "loop (main)" if tid == main_tid else names.get(tid, "?")
            if n.startswith(("asyncio_", "ThreadPoolExecutor")):
                n = "executor"
            cpu[n] = cpu.get(n, 0) + (col[i1] - col[i0]) / 1e9 / span
        out["thread_cpu_per_s"] = {
            k: round(v, 4) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v > 0
        }
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        out["sampler_interval_us_p50"] = round(statistics.median(gaps) / 1e3) if gaps else 0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0, help="seconds left out of the analysis")
    p.add_argument("--flush", default="sync", choices=("sync", "async"))
    p.add_argument("--conns", type=int, default=2, help="client connections (compare.py: 2 processes)")
    p.add_argument("--toml", default="", help="TOML appended to the broker's config")
    p.add_argument(
        "--tree", default="", help="PYTHONPATH for the broker (old code, as compare_ab's --b-tree)"
    )
    p.add_argument("--sample-ms", type=float, default=1.0, help="the thread CPU sampler's period")
    p.add_argument(
        "--sample-us", type=int, default=0, help="SIGPROF stack samples in long callbacks (0: off)"
    )
    p.add_argument("--merge-us", type=float, default=30.0, help="callbacks this close form one stretch")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args()
    import compare

    work = Path(tempfile.mkdtemp(prefix="tidemq-looptail-", dir=args.dir))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, work, True)
    rec_path = work / "loop.pickle"
    server = start_broker(work / "broker", args.flush, args.toml, args.tree, rec_path, args.sample_us)
    sample_path = work / "schedstat.txt"
    sampler = subprocess.Popen(
        [sys.executable, "-c", SAMPLER, str(server.proc.pid), str(args.sample_ms / 1e3), str(sample_path)]
    )
    load0 = os.getloadavg()
    try:
        bench = compare.Bench(argparse.Namespace(procs=1, inflight=64, messages=1000), server)
        bench.setup()
        spec = bench.spec("rate", 1024, batch=1)
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        with runner:
            sends = runner.run(drive(spec, args.rate, args.seconds, args.conns))
        time.sleep(0.6)  # the names thread writes every 0.5 s
    finally:
        server.stop()
        sampler.wait(10)
    load1 = os.getloadavg()
    with open(rec_path, "rb") as f:
        trace = pickle.load(f)
    names_path = Path(str(rec_path) + ".threads")
    thread_names = json.loads(names_path.read_text()) if names_path.exists() else {}
    result: dict[str, Any] = {
        "flush": args.flush,
        "rate": args.rate,
        "toml": args.toml,
        "tree": args.tree,
        "load_avg_before_after": [load0, load1],
    }
    result.update(
        analyse(sends, trace, read_samples(sample_path), thread_names, args.warmup, args.merge_us, args.top)
    )
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(text)


if __name__ == "__main__":
    main()
