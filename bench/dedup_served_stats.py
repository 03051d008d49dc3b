"""The served broker with the duplicate window on and off, as whole systems (issue 37's cost).

    python bench/dedup_served_stats.py [--rounds 2] [--messages 800000] [--workload produce_1k_batch]
                                       [--on TOML] [--off TOML] [--perf-stat]

Per round, a fresh broker per side (on, then off; the order swapped every round), driven by the
compare.py load generators as ``compare_ab.py`` drives it (``--messages`` as there: a batched
workload sends twice as many).  Read before and after the run: each thread's user/system CPU,
run-queue wait and context switches (``sync_round_stats.threads``), every ``/metrics`` counter
(the send lane's runs served and handed to Python, the read lane's frames and compiled answers,
the window's counters, the collector's collections), the process's page faults and RSS;
``--perf-stat`` adds per-process syscall counts (reads, writes, epoll waits, futex, memory
syscalls) and the kernel's context switches and faults.  Prints JSON: per side and round, the
figures per message and per request, and the on/off ratio of each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
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
from sync_round_stats import threads  # noqa: E402

_EVENTS = (
    "syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write,"
    "syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,"
    "syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_futex,"
    "syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_madvise,"
    "syscalls:sys_enter_brk,syscalls:sys_enter_mremap,syscalls:sys_enter_pwrite64,"
    "context-switches,page-faults,task-clock"
)


def all_metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([\d.e+-]+|NaN)$", line)
        if m and "bucket" not in m.group(1) and m.group(3) != "NaN":
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def proc_stat(pid: int) -> dict[str, float]:
    f = Path(f"/proc/{pid}/stat").read_text()
    fields = f[f.rindex(")") + 2 :].split()
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return {"minflt": float(fields[7]), "majflt": float(fields[9]), "rss_kb": rss, "hwm_kb": hwm}


def vmstat() -> dict[str, int]:
    """The machine's huge-page and compaction counters (/proc/vmstat; machine-wide)."""
    out = {}
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, value = line.split()
        if name.startswith(("thp_", "compact_")):
            out[name] = int(value)
    return out


def anon_huge_kb(pid: int) -> int:
    """The process's anonymous memory mapped with huge pages."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(re.search(r"AnonHugePages:\s+(\d+)", text).group(1))  # type: ignore[union-attr]


def one(work: Path, toml: str, args: argparse.Namespace) -> dict[str, Any]:
    port = systems.free_port()
    extra = f'metrics = "prometheus"\n{toml}\n[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n'
    server = systems.start_tidemq(work, "async", extra)
    url = f"http://127.0.0.1:{port}/metrics"
    size = 128 if "128" in args.workload else 1024
    batch = 32 if "batch" in args.workload else 1
    messages = args.messages * (2 if batch > 1 else 1)
    try:
        bench = Bench(argparse.Namespace(procs=2, inflight=64, messages=0), server)
        bench.setup()
        m0, t0, p0, v0 = all_metrics(url), threads(server.pid), proc_stat(server.pid), vmstat()
        perf = None
        if args.perf_stat:
            perf_out = work / "perf.stat"
            perf = subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", _EVENTS, "-p", str(server.pid), "-o", str(perf_out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.3)
        rec = None
        if args.perf_record:
            rec = subprocess.Popen(
                ["perf", "record", "-F", "499", "-p", str(server.pid), "-o", str(work / "perf.data")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.3)
        run = bench.produce(size, batch, messages)
        if rec is not None:
            rec.send_signal(2)
            rec.wait(60)
        if perf is not None:
            perf.send_signal(2)
            perf.wait(30)
        m1, t1, p1, v1 = all_metrics(url), threads(server.pid), proc_stat(server.pid), vmstat()
        huge = anon_huge_kb(server.pid)
    finally:
        server.stop()
        shutil.rmtree(work / "data", ignore_errors=True)  # ~1.6 GB of commit log a side
    sent = run.get("messages") or messages
    requests = sent / batch
    per_thread: dict[str, Any] = {}
    for name, row in t1.items():
        before = t0.get(name, {})
        d = {k: row[k] - before.get(k, 0.0) for k in ("user", "sys", "runq_wait", "vol", "invol")}
        if d["user"] + d["sys"] <= 0 and d["vol"] <= 0:
            continue
        per_thread[name] = {
            "user_us_per_msg": round(d["user"] / sent * 1e6, 3),
            "sys_us_per_msg": round(d["sys"] / sent * 1e6, 3),
            "vol_per_request": round(d["vol"] / requests, 3),
            "invol_per_request": round(d["invol"] / requests, 3),
        }
    syscalls: dict[str, float] = {}
    if perf is not None and (work / "perf.stat").exists():
        for line in (work / "perf.stat").read_text().splitlines():
            parts = line.split(",")
            if len(parts) < 3 or not parts[0].strip().replace(".", "").isdigit():
                continue
            event = parts[2].split(":")[-1].replace("sys_enter_", "")
            syscalls[event] = syscalls.get(event, 0.0) + float(parts[0])
    symbols: dict[str, int] = {}
    if args.perf_record and (work / "perf.data").exists():
        report = subprocess.run(
            ["perf", "report", "--stdio", "-n", "--no-children", "--sort", "dso,sym", "-F", "sample,dso,sym"]
            + ["--field-separator", "|", "-i", str(work / "perf.data")],
            capture_output=True,
            text=True,
        ).stdout
        for line in report.splitlines():
            parts = [x.strip() for x in line.split("|")]
            if len(parts) >= 3 and parts[0].isdigit():
                symbols[f"{parts[1]} {parts[2]}"] = symbols.get(f"{parts[1]} {parts[2]}", 0) + int(parts[0])
        shutil.copy(work / "perf.data", Path(args.perf_record) / f"{work.name}.data")
    shutil.rmtree(work, ignore_errors=True)
    dm = {k: round(m1[k] - m0.get(k, 0.0), 3) for k in m1 if m1[k] != m0.get(k, 0.0)}
    return {
        "msgs_per_s": run.get("msgs_per_s"),
        "msgs_per_server_cpu_s": run.get("msgs_per_server_cpu_s"),
        "server_cpu_s": run.get("server_cpu_s"),
        "generator_cpu_s": run.get("generator_cpu_s"),
        "p50_us": run.get("p50_us"),
        "p99_us": run.get("p99_us"),
        "messages": sent,
        "threads": per_thread,
        "threads_seen": sorted(t1),
        "minflt_per_request": round((p1["minflt"] - p0["minflt"]) / requests, 3),
        "rss_kb_end": p1["rss_kb"],
        "hwm_kb": p1["hwm_kb"],
        "anon_huge_kb_end": huge,
        "vmstat_delta": {k: v1[k] - v0.get(k, 0) for k in v1 if v1[k] != v0.get(k, 0)},
        "syscalls_per_request": {k: round(v / requests, 4) for k, v in syscalls.items()},
        "metrics_delta": dm,
        "perf_samples": symbols,
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="produce_1k_batch")
    p.add_argument("--messages", type=int, default=800_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--on", default="", help="TOML of the window-on side")
    p.add_argument("--off", default="[broker]\ndedup_window_s = 0", help="TOML of the window-off side")
    p.add_argument("--perf-stat", action="store_true")
    p.add_argument(
        "--perf-record", default="", help="a directory: perf record -F 499 of each broker, kept there"
    )
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-dedup-served-"))
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = [("on", args.on), ("off", args.off)]
        if i % 2:
            order.reverse()
        row: dict[str, Any] = {}
        for name, toml in order:
            try:
                row[name] = one(work / f"{name}{i}", toml, args)
            finally:
                shutil.rmtree(work / f"{name}{i}", ignore_errors=True)
            print(
                f"[dedup_served_stats] round {i} {name}: {row[name]['msgs_per_server_cpu_s']} msg/server-cpu-s",
                file=sys.stderr,
            )
        rounds.append(row)
    shutil.rmtree(work, ignore_errors=True)
    eff = [
        r["on"]["msgs_per_server_cpu_s"] / r["off"]["msgs_per_server_cpu_s"]
        for r in rounds
        if r["on"]["msgs_per_server_cpu_s"] and r["off"]["msgs_per_server_cpu_s"]
    ]
    print(
        json.dumps(
            {
                "workload": args.workload,
                "messages": args.messages,
                "on": args.on,
                "off": args.off,
                "rounds": rounds,
                "on_over_off_per_cpu": [round(x, 3) for x in eff],
                "median_on_over_off_per_cpu": round(statistics.median(eff), 3) if eff else None,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
