"""Fold a ``perf record -g`` file into per-thread buckets by the frames that name the work (issue 38).

    python bench/perf_stacks.py PERF_DATA [--per N] [--depth 8] [--top 25] [--comm NAME]

Runs ``perf script`` on the file and counts each sample once, under its thread's name (comm) and
the first *bucket* its stack matches, innermost frame first (``BUCKETS``: fdatasync, the block
layer's notify, futex wait/wake, epoll, socket read/write, pwrite, the scheduler...).  With
``--per N`` (messages, rounds) the counts become µs of on-CPU time per unit at the file's sample
period.  ``--top`` also prints the most frequent innermost ``--depth`` frames of each thread.  Made
for the sync-against-async comparison of a served broker (``sync_round_stats.py --perf-record``).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys

#: Interrupt entry frames: the sample is the interrupt's, whatever it interrupted.
IRQ = (
    "asm_common_interrupt",
    "asm_sysvec_apic_timer_interrupt",
    "asm_sysvec_call_function_single",
    "asm_sysvec_reschedule_ipi",
    "handle_softirqs",
    "asm_exc_page_fault",
)


def samples(path: str, comm: str = "") -> tuple[list[tuple[str, list[str]]], int]:
    cmd = ["perf", "script", "-i", path, "-F", "comm,tid,period,ip,sym,dso"]
    if comm:
        cmd += ["--comm", comm]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    result: list[tuple[str, list[str]]] = []
    period = 0
    for block in out.split("\n\n"):
        lines = block.strip("\n").split("\n")
        if not lines or not lines[0].strip():
            continue
        head = lines[0].split()
        name = head[0]
        if len(head) >= 3 and head[-1].isdigit():
            period = int(head[-1])
        frames = []
        for ln in lines[1:]:
            parts = ln.split(None, 1)
            if len(parts) < 2:
                continue
            sym, _, dso = parts[1].rpartition(" (")
            sym = sym.split("+0x")[0].strip()
            frames.append(sym if sym and sym != "[unknown]" else dso.rstrip(")").rsplit("/", 1)[-1])
        result.append((name, frames))
    return result, period


def bucket(frames: list[str], dsos: bool = True) -> str:
    """The syscall a sample is in (``sys:write``), else an interrupt or fault, else its user DSO."""
    for f in reversed(frames):  # outermost first: the syscall entered, not what it called
        if f.startswith("__x64_sys_") or f.startswith("__do_sys_"):
            return "sys:" + f.split("sys_", 1)[1]
    for f in frames:
        if f in IRQ:
            return "irq:" + f.replace("asm_", "").replace("sysvec_", "")
    if any(f == "schedule" or f.startswith("finish_task_switch") for f in frames):
        return "kernel:schedule"
    if not dsos:
        return "user"
    return "user:" + (frames[0] if frames else "?")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--per", type=float, default=0.0, help="divide into µs per this many units")
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--comm", default="")
    p.add_argument("--user-symbols", action="store_true", help="split user time by innermost symbol")
    p.add_argument(
        "--paths",
        default="",
        help="comma-separated frame names: also count each thread's samples by which of them its "
        "stack holds (outermost first) and its innermost frame, e.g. the parts of an fdatasync",
    )
    a = p.parse_args()
    got, period = samples(a.data, a.comm)
    if not got:
        sys.exit("no samples")
    by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    stacks: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    marks = [m for m in a.paths.split(",") if m]
    paths: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for name, frames in got:
        by[name][bucket(frames, a.user_symbols)] += 1
        if marks:
            seen = [m for m in marks if m in frames]
            seen.sort(key=lambda m: -frames.index(m))
            paths[name][" > ".join(seen) + " | " + (frames[0] if frames else "?")] += 1
        stacks[name][" < ".join(frames[: a.depth])] += 1
    scale = (period / 1e3 / a.per) if a.per and period else 0.0  # period in ns -> µs per unit
    out: dict[str, object] = {"samples": len(got), "period_ns": period, "per": a.per, "threads": {}}
    for name, c in sorted(by.items(), key=lambda kv: -sum(kv[1].values())):
        row = {k: (round(v * scale, 2) if scale else v) for k, v in c.most_common()}
        row["_total"] = round(sum(c.values()) * scale, 2) if scale else sum(c.values())
        out["threads"][name] = row  # type: ignore[index]
        if marks:
            row["_paths"] = [  # type: ignore[assignment]
                [round(v * scale, 2) if scale else v, k] for k, v in paths[name].most_common(a.top or 20)
            ]
        if a.top:
            row["_stacks"] = [[v, k] for k, v in stacks[name].most_common(a.top)]  # type: ignore[assignment]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
