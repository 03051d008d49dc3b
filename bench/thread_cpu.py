"""The broker's server CPU per message, by thread: where the CPU of a compare.py workload goes.

    python bench/thread_cpu.py [--workload produce_128_single] [--flush async|sync]
                               [--messages 100000] [--rounds 3] [--warmup 5000] [--b-tree DIR]

Starts ``tidemq standalone`` (compare_systems.start_tidemq), drives it with compare.py's
generators (``Bench``, as compare_ab.py does) and reads every thread of the broker before and
after the run: ``/proc/<pid>/task/<tid>/stat`` (utime and stime, 10 ms ticks), ``schedstat``
(on-CPU nanoseconds) and ``comm`` (the thread's name; tidemq names its threads, see
``tidemq.threads``). Prints JSON on stdout (progress on stderr): per thread name, microseconds of
CPU per message (user and system apart, from the ticks; ``cpu`` from schedstat), the median over
the rounds, and the process total from ``/proc/<pid>/stat`` (which keeps threads that ended mid-run:
``ended`` is the difference). A fresh broker per round; ``--b-tree`` runs it on an older tree;
``--pair-tree DIR`` pairs each round with a broker on DIR (B, alternating which goes first) and
reports A - B of the loop thread's and the other threads' CPU per message, round by round
(an older tree's threads have no names: compare the loop and the outside-the-loop totals).

``--syscalls`` also counts the loop thread's (the main thread's) system calls, context switches
and page faults with ``perf stat`` (needs perf), per message.  Per-thread user/system ticks are
10 ms each: below a second of a thread's CPU only ``cpu`` (schedstat, nanoseconds) is exact.

The workloads are compare_ab.py's: produce_1k_single, produce_128_single, produce_1k_batch,
produce_128_batch (batches of 32) and consume_1k (the backlog of 2 x --messages read back).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[int, dict[str, Any]]:
    """Each live thread of ``pid``: name, user and system ticks, schedstat nanoseconds."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for name in names:
        base = f"/proc/{pid}/task/{name}"
        try:
            with open(f"{base}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            with open(f"{base}/schedstat") as f:
                sched = int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # ended between listdir and open
        out[int(name)] = {"comm": comm, "utime": int(fields[11]), "stime": int(fields[12]), "sched": sched}
    return out


#: ``--syscalls``: what perf stat counts on the loop thread (the main thread) during the run.
_SYSCALLS = ",".join(
    ["context-switches", "page-faults"]
    + [
        f"syscalls:sys_enter_{c}"
        for c in ("read", "write", "writev", "pwrite64", "epoll_pwait", "futex", "fdatasync", "sendfile64")
    ]
)


def _perf_counts(stat: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in stat.read_text().splitlines() if stat.exists() else []:
        parts = line.split(",")
        if len(parts) > 2 and parts[0].replace(".", "", 1).isdigit():
            out[parts[2].replace("syscalls:sys_enter_", "")] = float(parts[0])
    return out


def process_ticks(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def label(pid: int, tid: int, comm: str, proc_comm: str) -> str:
    if tid == pid:
        return "main (event loop)"
    return comm if comm != proc_comm else "(unnamed)"


def by_thread(
    pid: int, before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """CPU between the two snapshots, summed per thread label (threads of one name together)."""
    proc_comm = after.get(pid, before.get(pid, {})).get("comm", "")
    rows: dict[str, dict[str, Any]] = {}
    for tid, a in after.items():
        b = before.get(tid, {"utime": 0, "stime": 0, "sched": 0})  # a thread started mid-run
        row = rows.setdefault(
            label(pid, tid, a["comm"], proc_comm), {"threads": 0, "user_s": 0.0, "sys_s": 0.0, "cpu_s": 0.0}
        )
        row["threads"] += 1
        row["user_s"] += (a["utime"] - b["utime"]) / _CLK_TCK
        row["sys_s"] += (a["stime"] - b["stime"]) / _CLK_TCK
        row["cpu_s"] += (a["sched"] - b["sched"]) / 1e9
    return rows


def one_round(work: Path, workload: str, args: argparse.Namespace, tree: str) -> dict[str, Any]:
    server = systems.start_tidemq(work, args.flush, args.toml, pythonpath=tree)
    try:
        bench = Bench(
            argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=args.messages), server
        )
        bench.setup()
        size = 1024 if "1k" in workload else 128
        batch = 32 if workload.endswith("batch") else 1
        if workload == "consume_1k":
            bench.produce(1024, 32, args.messages * 2)
        elif args.warmup:  # every queue's files made, the lanes compiled, the index thread started
            bench.produce(size, batch, args.warmup)
        pid = server.pid
        stat = Path(work) / "perf.stat"
        perf = (
            subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", _SYSCALLS, "-t", str(pid), "-o", str(stat)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if args.syscalls
            else None
        )
        if perf is not None:
            time.sleep(0.3)  # perf attached
        t0, p0 = threads(pid), process_ticks(pid)
        r = bench.consume() if workload == "consume_1k" else bench.produce(size, batch, args.messages)
        t1, p1 = threads(pid), process_ticks(pid)
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(60)
            loop_calls = _perf_counts(stat)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    msgs = r.get("messages") or args.messages
    rows = by_thread(pid, t0, t1)
    extra = {}
    if args.syscalls:  # the loop thread's calls per message (perf counted a little before and after)
        extra["loop_per_msg"] = {k: round(v / msgs, 4) for k, v in loop_calls.items()}
    user = (p1[0] - p0[0]) / _CLK_TCK
    sys_ = (p1[1] - p0[1]) / _CLK_TCK
    listed = sum(x["user_s"] + x["sys_s"] for x in rows.values())
    loop = rows.get("main (event loop)", {}).get("cpu_s", 0.0)
    return {
        "messages": msgs,
        "loop_cpu_us_per_msg": round(loop * 1e6 / msgs, 3),
        "outside_loop_cpu_us_per_msg": round((sum(x["cpu_s"] for x in rows.values()) - loop) * 1e6 / msgs, 3),
        "msgs_per_s": r.get("msgs_per_s"),
        "msgs_per_server_cpu_s": r.get("msgs_per_server_cpu_s"),
        "process_us_per_msg": {
            "user": round(user * 1e6 / msgs, 3),
            "sys": round(sys_ * 1e6 / msgs, 3),
            "ended_threads": round((user + sys_ - listed) * 1e6 / msgs, 3),
        },
        **extra,
        "threads_us_per_msg": {
            name: {
                "threads": x["threads"],
                "user": round(x["user_s"] * 1e6 / msgs, 3),
                "sys": round(x["sys_s"] * 1e6 / msgs, 3),
                "cpu": round(x["cpu_s"] * 1e6 / msgs, 3),
            }
            for name, x in sorted(rows.items(), key=lambda kv: -kv[1]["cpu_s"])
        },
    }


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    names: dict[str, None] = {}
    for r in rounds:
        names.update(dict.fromkeys(r["threads_us_per_msg"]))
    out: dict[str, Any] = {}
    for name in names:
        rows = [r["threads_us_per_msg"].get(name, {"user": 0.0, "sys": 0.0, "cpu": 0.0}) for r in rounds]
        out[name] = {k: round(statistics.median(x[k] for x in rows), 3) for k in ("user", "sys", "cpu")}
    proc = {
        k: round(statistics.median(r["process_us_per_msg"][k] for r in rounds), 3)
        for k in ("user", "sys", "ended_threads")
    }
    return {"process": proc, "threads": dict(sorted(out.items(), key=lambda kv: -kv[1]["cpu"]))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", action="append", help="repeatable; default produce_128_single")
    p.add_argument("--flush", default="async", choices=["async", "sync"])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument(
        "--warmup",
        type=int,
        default=5000,
        help="messages sent before the measured run (0: measured from a fresh broker, as compare.py)",
    )
    p.add_argument("--syscalls", action="store_true", help="count the loop thread's system calls (perf stat)")
    p.add_argument("--toml", default="", help="TOML appended to the broker's config")
    p.add_argument("--b-tree", default="", help="PYTHONPATH for the broker: an older tree")
    p.add_argument(
        "--pair-tree",
        default="",
        help="also run a broker on this tree (B; A is this tree or --b-tree) each round, alternating",
    )
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-threadcpu-"))
    report: dict[str, Any] = {
        "flush": args.flush,
        "messages": args.messages,
        "b_tree": args.b_tree,
        "pair_tree": args.pair_tree,
        "toml": args.toml,
        "warmup": args.warmup,
        "load_before": os.getloadavg(),
        "workloads": {},
    }
    sides = [("a", args.b_tree)] + ([("b", args.pair_tree)] if args.pair_tree else [])
    try:
        for workload in args.workload or ["produce_128_single"]:
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
            for i in range(args.rounds):
                for name, tree in sides if i % 2 == 0 else sides[::-1]:
                    r = one_round(work / f"{workload}{i}{name}", workload, args, tree)
                    r["load"] = os.getloadavg()[0]
                    rounds[name].append(r)
                    top = list(r["threads_us_per_msg"].items())[:4]
                    print(
                        f"[thread_cpu] {workload} round {i}{' ' + name if args.pair_tree else ''}: "
                        f"{r['msgs_per_s']:.0f} msg/s, process {r['process_us_per_msg']}, "
                        + ", ".join(f"{n} {x['cpu']:.2f}" for n, x in top),
                        file=sys.stderr,
                    )
            if not args.pair_tree:
                report["workloads"][workload] = {"median": medians(rounds["a"]), "rounds": rounds["a"]}
                continue
            pair: dict[str, Any] = {
                name: {"median": medians(rs), "rounds": rs} for name, rs in rounds.items()
            }
            for key in ("loop_cpu_us_per_msg", "outside_loop_cpu_us_per_msg"):
                diffs = [a[key] - b[key] for a, b in zip(rounds["a"], rounds["b"], strict=True)]
                pair[f"a_minus_b_{key}"] = [round(d, 3) for d in diffs]
                pair[f"median_a_minus_b_{key}"] = round(statistics.median(diffs), 3)
            eff = [
                a["msgs_per_server_cpu_s"] / b["msgs_per_server_cpu_s"]
                for a, b in zip(rounds["a"], rounds["b"], strict=True)
                if a.get("msgs_per_server_cpu_s") and b.get("msgs_per_server_cpu_s")
            ]
            pair["a_over_b_msgs_per_server_cpu_s"] = [round(x, 3) for x in eff]
            pair["median_a_over_b_per_cpu"] = round(statistics.median(eff), 3) if eff else None
            report["workloads"][workload] = pair
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
