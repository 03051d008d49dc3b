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

``--rate R --seconds S`` drives it open loop at R single 1 KiB sends a second instead (compare.py's
``latency_fixed``: every send its own round), so the per-round figures are a round's whole cost.
``--name-threads`` puts a ``sitecustomize`` on the broker's path that gives each Python thread its
name as the OS thread name (``prctl(PR_SET_NAME)``), so the rows read ``tidemq-zeros-ahead``,
``reput`` and so on instead of thread ids.
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


_NAME_SITE = """\
import ctypes, threading
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None
_inner = threading.Thread._bootstrap_inner
def _named(self):
    if _prctl is not None:
        _prctl(15, self.name.encode()[:15], 0, 0, 0)
    _inner(self)
threading.Thread._bootstrap_inner = _named
# Run the next sitecustomize on the path too (--env's experiment, a venv's own): only one is imported.
import importlib.util, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _f = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_f):
        _spec = importlib.util.spec_from_file_location("_next_sitecustomize", _f)
        if _spec is not None and _spec.loader is not None:
            _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
"""


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
            comm = (task / "comm").read_text().strip()
            if comm == "tidemq-flush" or (name != "loop" and not comm.startswith("python")):
                name = comm  # the compiled flush worker names itself; --name-threads the others
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
    p.add_argument("--rate", type=float, default=0.0, help="open loop: single 1 KiB sends a second")
    p.add_argument("--seconds", type=float, default=10.0, help="with --rate: how long")
    p.add_argument("--name-threads", action="store_true", help="OS thread names from Python's")
    p.add_argument("--perf-record", default="", help="also `perf record -g` the run into this file")
    args = p.parse_args()
    size = 128 if "128" in args.workload else 1024
    batch = 32 if "batch" in args.workload else 1
    messages = args.messages or (160_000 if batch > 1 else 40_000)
    port = systems.free_port()
    extra = f'metrics = "prometheus"\n{args.extra}\n[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n'
    work = Path(tempfile.mkdtemp(prefix="tidemq-rounds-"))
    path = [args.env] if args.env else []
    if args.name_threads:
        site = work / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_NAME_SITE)
        path.insert(0, str(site))
    if path:
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
    server = systems.start_tidemq(work / "tidemq", args.flush, extra)
    pid = server.pid
    os.environ.pop("PYTHONPATH", None)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        bench = Bench(argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=0), server)
        bench.setup()
        if args.rate:
            size, batch = 1024, 1
            bench.rate(args.rate, 2.0, 2.0)  # warm up
        else:
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
        record = None
        if args.perf_record:
            record = subprocess.Popen(
                ["perf", "record", "-F", "1999", "-g", "-p", str(server.pid), "-o", args.perf_record],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.3)
        if args.rate:
            run = bench.rate(args.rate, args.seconds, args.seconds)
            messages = int(run.get("messages") or run.get("sent") or args.rate * args.seconds)
        else:
            run = bench.produce(size, batch, messages)
        for proc in (perf, record):
            if proc is not None:
                proc.send_signal(2)
                proc.wait(30)
        m1, t1, wall = metrics(url), threads(server.pid), time.monotonic() - w0
        loadavg = os.getloadavg()
    finally:
        server.stop()
        stat_file = work / "perf.stat"
        perf_text = stat_file.read_text() if stat_file.exists() else ""
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
    if perf_text:  # read before the work directory went (it was read after: always empty)
        for line in perf_text.splitlines():
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
