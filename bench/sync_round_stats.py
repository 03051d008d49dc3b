"""What one flush round of the served broker costs: requests and bytes a round gathers, CPU per
round by thread, syscalls and context switches per round (issue 38).

    python bench/sync_round_stats.py [--workload produce_1k_batch] [--flush sync] [--messages 200000]
                                     [--extra TOML] [--perf-stat]

Starts ``tidemq standalone`` (as ``compare.py`` does, ``/metrics`` on a free port), drives it with
the compare.py load generators, and reads before and after the run: ``tidemq_flush_rounds_total``,
``tidemq_flush_requests_total`` and the flush latency sum from ``/metrics``, each thread's user and
system CPU (``/proc/<pid>/task/*/stat``), run-queue wait (``schedstat``) and voluntary/involuntary
context switches (``status``).  ``--perf-stat`` adds ``perf stat --per-thread`` syscall counts
(futex, epoll, read, write, pwrite, fdatasync).  Prints JSON, per message and per round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
_EVENTS = (
    "syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,"
    "syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write,"
    "syscalls:sys_enter_sendto,syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync,"
    "context-switches"
)


def threads(pid: int) -> dict[str, dict[str, float]]:
    """Per thread name (summed over threads of one name): user/sys seconds, run-queue wait, switches."""
    out: dict[str, dict[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            sched = (task / "schedstat").read_text().split()
            status = (task / "status").read_text()
        except OSError:
            continue
        name = "loop" if task.name == str(pid) else task.name  # Python threads have no OS names
        try:
            if (task / "comm").read_text().strip() == "tidemq-flush":
                name = "tidemq-flush"  # the compiled flush worker (tidemq_flush._round) names itself
        except OSError:
            pass
        fields = stat[stat.rindex(")") + 2 :].split()
        row = out.setdefault(
            name, {"user": 0.0, "sys": 0.0, "runq_wait": 0.0, "vol": 0.0, "invol": 0.0, "n": 0}
        )
        row["user"] += int(fields[11]) / _TICK
        row["sys"] += int(fields[12]) / _TICK
        row["runq_wait"] += int(sched[1]) / 1e9
        row["vol"] += int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        row["invol"] += int(re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        row["n"] += 1
    return out


def metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    want = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(
            r"(tidemq_flush_\w+|tidemq_group_commit\w*|process_cpu_seconds_total)(\{[^}]*\})? ([\d.e+-]+)",
            line,
        )
        if m:
            want[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return want


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="produce_1k_batch")
    p.add_argument("--flush", default="sync", choices=["async", "sync"])
    p.add_argument("--messages", type=int, default=0, help="default: 40 k single, 160 k batched")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--extra", default="", help="TOML appended to the broker's config")
    p.add_argument("--perf-stat", action="store_true")
    p.add_argument("--env", default="", help="PYTHONPATH for the broker (an old tree)")
    args = p.parse_args()
    size = 128 if "128" in args.workload else 1024
    batch = 32 if "batch" in args.workload else 1
    messages = args.messages or (160_000 if batch > 1 else 40_000)
    port = systems.free_port()
    extra = f'metrics = "prometheus"\n{args.extra}\n[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n'
    if args.env:
        os.environ["PYTHONPATH"] = args.env
    work = Path(tempfile.mkdtemp(prefix="tidemq-rounds-"))
    server = systems.start_tidemq(work / "tidemq", args.flush, extra)
    pid = server.pid
    os.environ.pop("PYTHONPATH", None)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        bench = Bench(argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=0), server)
        bench.setup()
        bench.produce(size, batch, messages // 8)  # warm up
        m0, t0, w0 = metrics(url), threads(server.pid), time.monotonic()
        perf = None
        if args.perf_stat:
            perf_out = work / "perf.stat"
            perf = subprocess.Popen(
                [
                    "perf",
                    "stat",
                    "--per-thread",
                    "-x",
                    ",",
                    "-e",
                    _EVENTS,
                    "-p",
                    str(server.pid),
                    "-o",
                    str(perf_out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.3)
        run = bench.produce(size, batch, messages)
        if perf is not None:
            perf.send_signal(2)
            perf.wait(30)
        m1, t1, wall = metrics(url), threads(server.pid), time.monotonic() - w0
        loadavg = os.getloadavg()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)  # the broker's data: hundreds of MB a run
    sent = run.get("messages", messages)
    dm = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    rounds = next((v for k, v in dm.items() if k.startswith("tidemq_flush_rounds")), 0.0)
    requests = next((v for k, v in dm.items() if k.startswith("tidemq_flush_requests")), 0.0)
    flush_sum = next((v for k, v in dm.items() if k.startswith("tidemq_flush_latency_seconds_sum")), 0.0)
    per_thread: dict[str, Any] = {}
    total_cpu = 0.0
    for name, row in t1.items():
        before = t0.get(name, {})
        d = {k: row[k] - before.get(k, 0.0) for k in ("user", "sys", "runq_wait", "vol", "invol")}
        cpu = d["user"] + d["sys"]
        total_cpu += cpu
        if cpu <= 0 and d["vol"] <= 0:
            continue
        per_thread[name] = {
            "threads": row["n"],
            "cpu_us_per_msg": round(cpu / sent * 1e6, 2),
            "user_us_per_round": round(d["user"] / rounds * 1e6, 1) if rounds else None,
            "sys_us_per_round": round(d["sys"] / rounds * 1e6, 1) if rounds else None,
            "runq_wait_us_per_round": round(d["runq_wait"] / rounds * 1e6, 1) if rounds else None,
            "vol_switches_per_round": round(d["vol"] / rounds, 2) if rounds else None,
            "invol_switches_per_round": round(d["invol"] / rounds, 2) if rounds else None,
        }
    syscalls: dict[str, Any] = {}
    if args.perf_stat and (work / "perf.stat").exists():
        for line in (work / "perf.stat").read_text().splitlines():
            parts = line.split(",")
            if len(parts) < 4 or not parts[1].strip().replace(".", "").isdigit():
                continue
            tid = parts[0].rsplit("-", 1)[-1].strip()
            thread = "loop" if tid == str(pid) else tid
            event = parts[3].split(":")[-1].replace("sys_enter_", "")
            syscalls.setdefault(thread, {}).setdefault(event, 0.0)
            syscalls[thread][event] += float(parts[1])
        if rounds:
            syscalls = {
                t: {e: round(v / rounds, 2) for e, v in ev.items() if v} for t, ev in syscalls.items()
            }
    result = {
        "workload": args.workload,
        "flush": args.flush,
        "extra": args.extra,
        "messages": sent,
        "batch": batch,
        "msgs_per_s": run.get("msgs_per_s"),
        "server_cpu_us_per_msg": round(total_cpu / sent * 1e6, 2),
        "wall_s": round(wall, 2),
        "loadavg": loadavg,
        "rounds": rounds,
        "requests_per_round": round(requests / rounds, 2) if rounds else None,
        "messages_per_round": round(sent / rounds, 1) if rounds else None,
        "bytes_per_round": round(sent * size / rounds) if rounds else None,
        "flush_us_per_round": round(flush_sum / rounds * 1e6, 1) if rounds else None,
        "server_cpu_us_per_round": round(total_cpu / rounds * 1e6, 1) if rounds else None,
        "threads": per_thread,
        "syscalls_per_round": syscalls,
        "metrics_delta": {k: v for k, v in dm.items() if v and "bucket" not in k},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
