"""The broker's server CPU per message, by thread: where the CPU of a compare.py workload goes.

    python bench/thread_cpu.py [--workload produce_128_single] [--flush async|sync]
                               [--messages 100000] [--rounds 3] [--b-tree DIR]

Starts ``tidemq standalone`` (compare_systems.start_tidemq), drives it with compare.py's
generators (``Bench``, as compare_ab.py does) and reads every thread of the broker before and
after the run: ``/proc/<pid>/task/<tid>/stat`` (utime and stime, 10 ms ticks), ``schedstat``
(on-CPU nanoseconds) and ``comm`` (the thread's name; tidemq names its threads, see
``tidemq.threads``). Prints JSON on stdout (progress on stderr): per thread name, microseconds of
CPU per message (user and system apart, from the ticks; ``cpu`` from schedstat), the median over
the rounds, and the process total from ``/proc/<pid>/stat`` (which keeps threads that ended mid-run:
``ended`` is the difference). A fresh broker per round; ``--b-tree`` runs it on an older tree.

The workloads are compare_ab.py's: produce_1k_single, produce_128_single, produce_1k_batch,
produce_128_batch (batches of 32) and consume_1k (the backlog of 2 x --messages read back).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
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


def one_round(work: Path, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    server = systems.start_tidemq(work, args.flush, args.toml, pythonpath=args.b_tree)
    try:
        bench = Bench(
            argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=args.messages), server
        )
        bench.setup()
        size = 1024 if "1k" in workload else 128
        batch = 32 if workload.endswith("batch") else 1
        if workload == "consume_1k":
            bench.produce(1024, 32, args.messages * 2)
        else:  # warm up: every queue's files made, the lanes compiled, the index thread started
            bench.produce(size, batch, max(2000, args.messages // 20))
        pid = server.pid
        t0, p0 = threads(pid), process_ticks(pid)
        r = bench.consume() if workload == "consume_1k" else bench.produce(size, batch, args.messages)
        t1, p1 = threads(pid), process_ticks(pid)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    msgs = r.get("messages") or args.messages
    rows = by_thread(pid, t0, t1)
    user = (p1[0] - p0[0]) / _CLK_TCK
    sys_ = (p1[1] - p0[1]) / _CLK_TCK
    listed = sum(x["user_s"] + x["sys_s"] for x in rows.values())
    return {
        "messages": msgs,
        "msgs_per_s": r.get("msgs_per_s"),
        "msgs_per_server_cpu_s": r.get("msgs_per_server_cpu_s"),
        "process_us_per_msg": {
            "user": round(user * 1e6 / msgs, 3),
            "sys": round(sys_ * 1e6 / msgs, 3),
            "ended_threads": round((user + sys_ - listed) * 1e6 / msgs, 3),
        },
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
    p.add_argument("--toml", default="", help="TOML appended to the broker's config")
    p.add_argument("--b-tree", default="", help="PYTHONPATH for the broker: an older tree")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-threadcpu-"))
    report: dict[str, Any] = {
        "flush": args.flush,
        "messages": args.messages,
        "b_tree": args.b_tree,
        "toml": args.toml,
        "load_before": os.getloadavg(),
        "workloads": {},
    }
    try:
        for workload in args.workload or ["produce_128_single"]:
            rounds = []
            for i in range(args.rounds):
                r = one_round(work / f"{workload}{i}", workload, args)
                r["load"] = os.getloadavg()[0]
                rounds.append(r)
                top = list(r["threads_us_per_msg"].items())[:4]
                print(
                    f"[thread_cpu] {workload} round {i}: {r['msgs_per_s']:.0f} msg/s, "
                    f"process {r['process_us_per_msg']}, " + ", ".join(f"{n} {x['cpu']:.2f}" for n, x in top),
                    file=sys.stderr,
                )
            report["workloads"][workload] = {"median": medians(rounds), "rounds": rounds}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
