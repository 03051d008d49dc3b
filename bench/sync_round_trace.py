"""Where a group-commit round's time goes: 32 asyncio writers under ``sync`` flush, timestamped.

    python bench/sync_round_trace.py [--seconds 3] [--writers 32] [--dir /path/on/the/disk]

Runs ``store_bench``'s ``sync_concurrent_asyncio`` case with the flush policy, the event loop and
``os.fdatasync`` instrumented (wrappers that append a timestamp; a few hundred ns each), and
prints per round the median (and p90) of each phase:

* ``puts``: the first put of a loop batch to its kick (the loop runs the writers' puts);
* ``kick``: the kick itself on the loop (its lock and the notify that wakes the flush thread);
* ``kick_to_wake``: the kick's notify to the flush thread returning from its wait;
* ``wake_to_fsync``: the flush thread from its wake-up to ``fdatasync`` (commit, bookkeeping);
* ``fsync``: ``fdatasync`` as the flush thread sees it (the syscall plus the GIL re-take after it);
* ``fsync_to_complete``: resolving the round's futures, up to posting the loop's wake-up;
* ``complete_to_drain``: the post to the loop running the drain (self-pipe, select, the GIL);
* ``drain_to_put``: the drain to the first put of the next batch (the writers' tasks resume);
* ``round``: fdatasync start to the next fdatasync start.

Also the busy share of the loop thread while ``fdatasync`` ran (the GIL the flush thread must
re-take after it), the CPU and run-queue wait of each thread (``/proc/self/task/*/schedstat``), and
a bare fdatasync baseline of 1 KiB appends in the same directory just before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import store_bench  # noqa: E402

from tidemq.futures import SharedCompletion, _LoopWaker  # noqa: E402

now = time.perf_counter_ns
EVENTS: list[tuple[int, str]] = []
TIDS: dict[str, int] = {}
FALLOCATES: list[float] = []  # µs of each posix_fallocate (the store reserves 4 MiB ahead)


def record(kind: str) -> None:
    EVENTS.append((now(), kind))


def instrument() -> None:
    from tidemq_flush import group_commit

    gc = group_commit.GroupCommitFlush
    orig_start, orig_kick, orig_submit = gc.start, gc._kick, gc.submit

    class TracedCondition:
        def __init__(self, cond: threading.Condition) -> None:
            self._c = cond

        def __enter__(self) -> Any:
            return self._c.__enter__()

        def __exit__(self, *a: Any) -> Any:
            return self._c.__exit__(*a)

        def wait(self, timeout: float | None = None) -> bool:
            TIDS["flush"] = threading.get_native_id()
            r = self._c.wait(timeout)
            record("wake")
            return r

        def notify(self, n: int = 1) -> None:
            self._c.notify(n)

        def notify_all(self) -> None:
            self._c.notify_all()

    def start(self: Any, target: Any) -> None:
        if hasattr(self, "_cond"):  # the flush thread sleeps on a Condition (before the doorbell)
            self._cond = TracedCondition(self._cond)
        orig_start(self, target)

    orig_sleep = getattr(gc, "_sleep_locked", None)
    if orig_sleep is not None:  # the flush thread sleeps on its doorbell

        def sleep_locked(self: Any) -> None:
            TIDS["flush"] = threading.get_native_id()
            orig_sleep(self)
            record("wake")

        gc._sleep_locked = sleep_locked  # type: ignore[attr-defined]

    def kick(self: Any, loop: Any) -> None:
        record("kick")
        orig_kick(self, loop)
        record("kicked")

    def submit(self: Any, end: int, fut: Any, value: Any, on_timeout: Any) -> None:
        loop = asyncio._get_running_loop()
        if loop is not None and loop not in self._open:
            record("first_put")
        orig_submit(self, end, fut, value, on_timeout)

    gc.start, gc._kick, gc.submit = start, kick, submit  # type: ignore[method-assign]

    orig_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        if threading.current_thread().name == "group-commit":
            record("fsync0")
            orig_fdatasync(fd)
            record("fsync1")
        else:
            orig_fdatasync(fd)

    os.fdatasync = fdatasync  # type: ignore[assignment]

    orig_fallocate = os.posix_fallocate

    def posix_fallocate(fd: int, offset: int, length: int) -> None:
        t = now()
        try:
            orig_fallocate(fd, offset, length)
        finally:
            FALLOCATES.append((now() - t) / 1e3)

    os.posix_fallocate = posix_fallocate  # type: ignore[assignment]

    orig_complete = SharedCompletion.complete

    def complete(self: Any) -> None:
        record("complete")
        orig_complete(self)

    SharedCompletion.complete = complete  # type: ignore[method-assign]

    orig_drain = _LoopWaker._drain

    def drain(self: Any) -> None:
        record("drain")
        orig_drain(self)

    _LoopWaker._drain = drain  # type: ignore[method-assign]

    orig_select = selectors.EpollSelector.select

    def select(self: Any, timeout: float | None = None) -> Any:
        TIDS["loop"] = threading.get_native_id()
        record("idle0")
        r = orig_select(self, timeout)
        record("idle1")
        return r

    selectors.EpollSelector.select = select  # type: ignore[method-assign]


def schedstat() -> dict[str, tuple[int, int, int, int, int, int]]:
    """Per thread: run ns, run-queue wait ns, time slices, user and system ticks, minor faults."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            roles = {str(v): k for k, v in TIDS.items()}
            name = roles.get(tid) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            run, wait, slices = (int(x) for x in Path(f"/proc/self/task/{tid}/schedstat").read_text().split())
            stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[f"{name}:{tid}"] = (run, wait, slices, int(stat[11]), int(stat[12]), int(stat[7]))
    return out


def q(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * p))], 1)


def analyse(events: list[tuple[int, str]]) -> dict[str, Any]:
    """Per round: each phase in µs (median, p90, mean)."""
    phases: dict[str, list[float]] = {
        k: []
        for k in (
            "puts",
            "kick",
            "kick_to_wake",
            "wake_to_fsync",
            "fsync",
            "fsync_to_complete",
            "complete_to_drain",
            "drain_to_put",
            "round",
        )
    }
    loop_busy_in_fsync: list[float] = []
    last: dict[str, int] = {}
    idle_since: int | None = None
    busy_ns = 0  # loop busy time accumulated within the current fsync
    in_fsync = False
    fsync_starts: list[int] = []
    for t, kind in events:
        if kind == "idle0":
            idle_since = t
            if in_fsync:
                busy_ns += t - max(last.get("idle1", t), last["fsync0"])
        elif kind == "idle1":
            idle_since = None
        if kind == "kicked" and "kick" in last:
            phases["kick"].append((t - last["kick"]) / 1e3)
        elif kind == "kick" and "first_put" in last:
            phases["puts"].append((t - last["first_put"]) / 1e3)
        elif kind == "wake" and "kick" in last and last["kick"] > last.get("wake", 0):
            phases["kick_to_wake"].append((t - last["kick"]) / 1e3)
        elif kind == "fsync0":
            if "wake" in last and last["wake"] > last.get("fsync0", 0):
                phases["wake_to_fsync"].append((t - last["wake"]) / 1e3)
            fsync_starts.append(t)
            in_fsync, busy_ns = True, 0
        elif kind == "fsync1" and "fsync0" in last:
            phases["fsync"].append((t - last["fsync0"]) / 1e3)
            if idle_since is None:  # the loop was running at the end: count up to now
                busy_ns += t - max(last.get("idle1", t), last["fsync0"])
            loop_busy_in_fsync.append(busy_ns / max(t - last["fsync0"], 1))
            in_fsync = False
        elif kind == "complete" and "fsync1" in last and last["fsync1"] > last.get("complete", 0):
            phases["fsync_to_complete"].append((t - last["fsync1"]) / 1e3)
        elif kind == "drain" and "complete" in last and last["complete"] > last.get("drain", 0):
            phases["complete_to_drain"].append((t - last["complete"]) / 1e3)
        elif kind == "first_put" and "drain" in last and last["drain"] > last.get("first_put", 0):
            phases["drain_to_put"].append((t - last["drain"]) / 1e3)
        last[kind] = t
    phases["round"] = [(b - a) / 1e3 for a, b in zip(fsync_starts, fsync_starts[1:], strict=False)]
    busy: list[float] = []  # the loop's stretches between two waits in epoll
    woke = None
    for t, kind in events:
        if kind == "idle1":
            woke = t
        elif kind == "idle0" and woke is not None:
            busy.append((t - woke) / 1e3)
            woke = None
    return {
        "rounds": len(fsync_starts),
        "phases_us": {
            k: {"median": q(v, 0.5), "p90": q(v, 0.9), "mean": round(statistics.fmean(v), 1) if v else 0.0}
            for k, v in phases.items()
        },
        "loop_busy_share_during_fsync_median": round(statistics.median(loop_busy_in_fsync), 3)
        if loop_busy_in_fsync
        else None,
        "loop_busy_stretch_us": {"p99": q(busy, 0.99), "p999": q(busy, 0.999), "max": q(busy, 1.0)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--writers", type=int, default=32)
    ap.add_argument("--dir", default=None)
    ap.add_argument(
        "--case",
        default="writers",
        choices=("writers", "latency"),
        help="latency: store_bench's sync_latency (--rate single puts/s, open loop, with the hash index)",
    )
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument(
        "--sampler",
        default=os.environ.get("SF_SAMPLER", ""),
        help="latency case: a script run as a separate process (pid, tid, seconds) that samples the loop"
        " thread's state and kernel stack from /proc and prints a summary (a thread stalled in the kernel"
        " may hold the GIL, so an in-process sampler could not see it)",
    )
    ap.add_argument("--flush", default="sync", choices=("sync", "async"), help="async: the no-flush ceiling")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the run")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    instrument()
    base = Path(tempfile.mkdtemp(prefix="tidemq-trace-", dir=args.dir))
    out: dict[str, Any] = {"load_average": list(os.getloadavg()), "switch_interval": sys.getswitchinterval()}
    try:
        out["fsync_before"] = store_bench.fsync_per_message(base, 1.0)
        if args.case == "latency":
            out["ideal_group_commit"] = store_bench.ideal_group_commit(
                base, min(args.seconds, 5.0), args.rate
            )
        latency = args.case == "latency"
        store = store_bench.open_store(base / "sync", args.flush, 256 << 20, index=latency)
        try:
            store_bench.sync_concurrent_asyncio(store, 0.3, args.writers)  # warm-up
            EVENTS.clear()
            FALLOCATES.clear()
            s0 = schedstat()
            w0 = time.perf_counter_ns()
            if latency:
                sampler = args.sampler
                if sampler:  # a process sampling the loop thread's kernel stack (a stall holds the GIL)
                    import subprocess

                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            sampler,
                            str(os.getpid()),
                            str(threading.get_native_id()),
                            str(args.seconds),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                out["case"] = store_bench.sync_latency(store, args.rate, args.seconds)
                if sampler:
                    out["loop_thread_samples"] = proc.communicate()[0].splitlines()
            else:
                out["case"] = store_bench.sync_concurrent_asyncio(store, args.seconds, args.writers)
            wall = time.perf_counter_ns() - w0
            s1 = schedstat()
        finally:
            store.shutdown()
        out["fsync_after"] = store_bench.fsync_per_message(base, 1.0)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["trace"] = analyse(list(EVENTS))
    out["trace"]["posix_fallocate_us"] = sorted(round(x, 1) for x in FALLOCATES)
    threads = {}
    tick = os.sysconf("SC_CLK_TCK")
    msgs = out["case"]["messages"]
    for key, (run, wait, slices, user, system, faults) in s1.items():
        r0, w0_, n0, u0, y0, f0 = s0.get(key, (0, 0, 0, 0, 0, 0))
        if run - r0 > wall * 0.005:
            threads[key] = {
                "cpu_share": round((run - r0) / wall, 3),
                "runqueue_wait_share": round((wait - w0_) / wall, 3),
                "slices": slices - n0,
                "user_s": round((user - u0) / tick, 2),
                "system_s": round((system - y0) / tick, 2),
                "minor_faults_per_msg": round((faults - f0) / max(msgs, 1), 3),
            }
    out["threads"] = threads
    out["per_message_us"] = {
        k: round(v["cpu_share"] * wall / 1e3 / max(msgs, 1), 2) for k, v in threads.items()
    }
    if "msgs_s" in out["case"]:
        per_msg = statistics.fmean([out["fsync_before"]["msgs_s"], out["fsync_after"]["msgs_s"]])
        out["ratio_vs_fsync_per_message"] = round(out["case"]["msgs_s"] / per_msg, 2)
    else:
        p99 = max(out["fsync_before"]["p99_us"], out["fsync_after"]["p99_us"])
        out["latency_p99_vs_fsync_p99"] = round(out["case"]["p99_us"] / p99, 2)
        out["latency_p99_vs_ideal_group_commit_p99"] = round(
            out["case"]["p99_us"] / out["ideal_group_commit"]["p99_us"], 2
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
