"""CPU and wake-ups of an idle ``tidemq standalone`` (session 13, loose13).

    python bench/idle_cpu.py [--window 60] [--warmup 10] [--b-tree DIR] [--out FILE]

Starts ``tidemq standalone`` (NameServer + broker, default plugins; gRPC off) on free loopback
ports with a fresh data directory, sends nothing, waits ``--warmup`` seconds, then reads over
``--window`` seconds: the process's CPU seconds (utime + stime of /proc/<pid>/stat) and, per
thread, its context switches (voluntary + involuntary of /proc/<pid>/task/*/status: each is a
wake-up of that thread).  With ``--b-tree DIR`` a second broker runs the code under ``DIR``
(``PYTHONPATH=DIR``; e.g. the session's baseline) right after the first, so the JSON holds both.
Prints JSON.  Not a timed test: the machine's load shows in the figures (the load average is in
the output).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def _switches(pid: int) -> dict[str, int]:
    """Context switches by thread (``tid/comm``: Python leaves its threads' comm ``python``)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            total = 0
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        except OSError:
            continue
        out[f"{task.name}/{name}"] = total
    return out


def measure(tree: str, window: float, warmup: float) -> dict[str, Any]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "tidemq",
            "standalone",
            "--no-grpc",
            "--data-dir",
            str(Path(tmp) / "data"),
            "--namesrv-listen",
            f"127.0.0.1:{_free_port()}",
            "--broker-listen",
            f"127.0.0.1:{_free_port()}",
        ]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 60
            seen = 0
            while time.monotonic() < deadline and seen < 2:
                line = proc.stdout.readline()
                if not line:
                    raise SystemExit("the standalone exited before listening")
                seen += "listening on" in line
            time.sleep(warmup)
            cpu0, sw0, t0 = _cpu_s(proc.pid), _switches(proc.pid), time.monotonic()
            time.sleep(window)
            cpu1, sw1, t1 = _cpu_s(proc.pid), _switches(proc.pid), time.monotonic()
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    took = t1 - t0
    per_thread = {k: round((sw1.get(k, 0) - sw0.get(k, 0)) / took, 2) for k in sorted(sw1)}
    return {
        "tree": tree or "worktree",
        "window_s": round(took, 2),
        "cpu_s": round(cpu1 - cpu0, 3),
        "cpu_pct": round(100 * (cpu1 - cpu0) / took, 3),
        "wakeups_per_s": round(sum(per_thread.values()), 2),
        "wakeups_per_s_by_thread": {k: v for k, v in per_thread.items() if v},
        "threads": len(sw1),
        "note": "wakeups: voluntary + involuntary context switches of each thread over the window",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--b-tree", default="", help="PYTHONPATH of a second run (the old code)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    runs = [measure("", args.window, args.warmup)]
    if args.b_tree:
        runs.append(measure(args.b_tree, args.window, args.warmup))
    result = {"runs": runs, "loadavg": os.getloadavg(), "cpus": os.cpu_count()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
