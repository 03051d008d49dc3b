"""Load test: 10 producer and 10 consumer processes against one broker for 10 minutes.

Starts ``tidemq namesrv`` and ``tidemq broker`` subprocesses, then ``--producers`` producer
processes (tidemq's asyncio client, ``--concurrency`` sends in flight each, for ``--minutes``)
and ``--consumers`` push-consumer processes in one CLUSTERING group.  Every acknowledged send is
recorded per producer; every consumed message is counted per (producer, sequence).  After the
producers stop, the consumers drain; then the report says how many acknowledged messages were
never consumed (lost, must be 0), how many were consumed more than once, the throughput, and the
broker's RSS sampled over time (/proc/<pid>/status).

Prints one JSON object on stdout, progress on stderr.

    python bench/load_test.py                 # 10 x 10 for 10 minutes
    python bench/load_test.py --minutes 0.5   # a quick run
    python bench/load_test.py --minutes 0.5 --broker-tree /work/wt/base_pkgs   # the old code's broker
    python bench/load_test.py --minutes 0.5 --broker-set 'dedup_window_s = 0'  # a [broker] option
    python bench/load_test.py --minutes 0.5 --probe [--tracemalloc 1]          # where the memory is

``--broker-tree DIR`` runs the broker (only it: the NameServer and the clients are this tree's)
with ``PYTHONPATH=DIR``, a directory of ``tidemq`` / ``tidemq_<plugin>`` symlinks into a worktree of
older code, as ``bench/compare_ab.py --b-tree``.  ``--probe`` adds ``bench/rss_site`` to the
broker's PYTHONPATH (its sitecustomize starts ``bench/rss_probe.py``'s probe thread) and reports,
at the start, at the peak (the producers just stopped) and idle (drained; then ``malloc_trim``),
the broker's anonymous RSS by mapping (smaps), glibc's arenas, pymalloc's arenas and the live
objects by type; ``--tracemalloc N`` also its Python allocations by file:line (slows the broker).
See docs/operations.md, "Memory".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import rss_probe
from benchutil import free_port, start, stop

_RSS_SITE = Path(__file__).resolve().parent / "rss_site"
_BODY_HEAD = re.compile(rb"^p(\d+):(\d+):")
_STATUS_EVERY_S = 2.0


def log(msg: str) -> None:
    print(f"[load_test] {msg}", file=sys.stderr, flush=True)


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and its anonymous (heap) and file-backed (mapped store files) parts, in KiB."""
    out = {"rss": 0, "anon": 0, "file": 0}
    names = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = names.get(line.split(":", 1)[0] + ":")
            if key:
                out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Marks:
    """Per-producer counters indexed by sequence number (saturating at 255)."""

    def __init__(self) -> None:
        self.by_producer: dict[int, bytearray] = {}

    def add(self, producer: int, seq: int) -> None:
        arr = self.by_producer.get(producer)
        if arr is None:
            arr = self.by_producer[producer] = bytearray()
        if seq >= len(arr):
            arr.extend(bytes(max(seq + 1 - len(arr), len(arr) // 2 + 1024)))
        if arr[seq] < 255:
            arr[seq] += 1

    def dump(self) -> bytes:
        out = bytearray()
        for p, arr in sorted(self.by_producer.items()):
            out += p.to_bytes(4, "big") + len(arr).to_bytes(8, "big") + arr
        return bytes(out)

    @classmethod
    def load(cls, data: bytes) -> Marks:
        m = cls()
        pos = 0
        while pos < len(data):
            p = int.from_bytes(data[pos : pos + 4], "big")
            n = int.from_bytes(data[pos + 4 : pos + 12], "big")
            m.by_producer[p] = bytearray(data[pos + 12 : pos + 12 + n])
            pos += 12 + n
        return m


# ---------------------------------------------------------------------------- producer process


async def run_producer(args: argparse.Namespace) -> None:
    from tidemq.client import Message, Producer, SendStatus

    out = Path(args.out)
    marks = Marks()
    acked = failed = 0
    stop_at = time.monotonic() + args.minutes * 60
    producer = Producer(f"load-pg-{args.id}", args.namesrv, send_timeout=5.0)
    await producer.start()
    pad = b"x" * max(0, args.size - 24)

    async def worker(task: int) -> None:
        nonlocal acked, failed
        seq = task
        while time.monotonic() < stop_at:
            body = b"p%d:%d:" % (args.id, seq) + pad
            try:
                r = await producer.send(Message(args.topic, body, tags=f"T{seq % 4}"))
                ok = r.status is SendStatus.SEND_OK
            except Exception:
                ok = False
            if ok:
                marks.add(args.id, seq)
                acked += 1
            else:
                failed += 1
                await asyncio.sleep(0.05)
            seq += args.concurrency

    async def status() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(_STATUS_EVERY_S)
            _atomic_write(out.with_suffix(".status"), f"{acked} {failed}".encode())

    st = asyncio.ensure_future(status())
    await asyncio.gather(*(worker(t) for t in range(args.concurrency)))
    st.cancel()
    await producer.shutdown()
    _atomic_write(out.with_suffix(".status"), f"{acked} {failed}".encode())
    _atomic_write(out, marks.dump())


# ---------------------------------------------------------------------------- consumer process


async def run_consumer(args: argparse.Namespace) -> None:
    from tidemq.client import ConsumeFrom, ConsumeStatus, PushConsumer

    out = Path(args.out)
    marks = Marks()
    consumed = 0
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)

    async def listener(msgs: list[Any]) -> ConsumeStatus:
        nonlocal consumed
        for m in msgs:
            head = _BODY_HEAD.match(m.body)
            if head is not None:
                marks.add(int(head.group(1)), int(head.group(2)))
            consumed += 1
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(
        args.group,
        args.namesrv,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        consume_batch_size=16,
        rebalance_interval_s=5.0,
    )
    consumer.subscribe(args.topic, "*")
    consumer.register_listener(listener)
    await consumer.start()
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), _STATUS_EVERY_S)
        except TimeoutError:
            pass
        _atomic_write(out.with_suffix(".status"), str(consumed).encode())
        _atomic_write(out, marks.dump())
    await consumer.shutdown()
    _atomic_write(out.with_suffix(".status"), str(consumed).encode())
    _atomic_write(out, marks.dump())


# ---------------------------------------------------------------------------- coordinator


def _merge(paths: list[Path]) -> dict[int, bytearray]:
    total: dict[int, bytearray] = {}
    for p in paths:
        try:
            m = Marks.load(p.read_bytes())
        except OSError:
            continue
        for prod, arr in m.by_producer.items():
            acc = total.setdefault(prod, bytearray())
            if len(acc) < len(arr):
                acc.extend(bytes(len(arr) - len(acc)))
            for i, v in enumerate(arr):
                if v:
                    acc[i] = min(255, acc[i] + v)
    return total


def _compare(acked: dict[int, bytearray], consumed: dict[int, bytearray]) -> dict[str, int]:
    n_acked = lost = dup = unacked_consumed = 0
    for prod, arr in acked.items():
        got = consumed.get(prod, bytearray())
        for seq, a in enumerate(arr):
            if not a:
                continue
            n_acked += 1
            c = got[seq] if seq < len(got) else 0
            if c == 0:
                lost += 1
            elif c > 1:
                dup += c - 1
    for prod, arr in consumed.items():
        acks = acked.get(prod, bytearray())
        unacked_consumed += sum(1 for seq, c in enumerate(arr) if c and (seq >= len(acks) or not acks[seq]))
    return {"acked": n_acked, "lost": lost, "duplicates": dup, "consumed_not_acked": unacked_consumed}


def _status_sum(paths: list[Path]) -> tuple[int, int]:
    a = b = 0
    for p in paths:
        try:
            parts = p.read_text().split()
        except OSError:
            continue
        if parts:
            a += int(parts[0])
            b += int(parts[1]) if len(parts) > 1 else 0
    return a, b


def _start_broker(
    args: argparse.Namespace, cfg: Path, work: Path, probe_dir: Path
) -> subprocess.Popen[bytes]:
    """The broker, with --broker-tree and the probe's sitecustomize first on its PYTHONPATH."""
    path = [p for p in (args.broker_tree, str(_RSS_SITE) if args.probe else "") if p]
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "TIDEMQ_RSS_PROBE_DIR", "TIDEMQ_RSS_TRACEMALLOC")}
    try:
        if path:
            os.environ["PYTHONPATH"] = os.pathsep.join(path)
        if args.probe:
            os.environ["TIDEMQ_RSS_PROBE_DIR"] = str(probe_dir)
            os.environ["TIDEMQ_RSS_TRACEMALLOC"] = str(args.tracemalloc)
        return start(["broker", "-c", str(cfg)], work)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _probe(
    args: argparse.Namespace, pid: int, probe_dir: Path, label: str, trim: bool = False
) -> dict[str, Any]:
    """The broker's memory now: smaps from outside, the rest from its probe thread."""
    out: dict[str, Any] = {"smaps": rss_probe.smaps_breakdown(pid)}
    out.update(rss_probe.request(probe_dir, label, trim=trim))
    log(f"probe {label}: RssAnon {out['smaps']['status_kib'].get('RssAnon')} KiB")
    return out


def _tree_name(tree: str) -> str:
    """The commit of the tree the broker imports (a --broker-tree's symlinks lead to its worktree)."""
    src = Path(tree, "tidemq").resolve() if tree else Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "log", "-1", "--format=%h %cs"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def coordinate(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tidemq-load-"))
    probe_dir = work / "probe"
    probe_dir.mkdir()
    probes: dict[str, Any] = {}
    topic = "LoadTopic"
    procs: list[subprocess.Popen[bytes]] = []
    ns = broker = None
    try:
        ns_addr = f"127.0.0.1:{free_port()}"
        ns = start(["namesrv", "--listen", ns_addr], work)
        cfg = work / "broker.toml"
        cfg.write_text(
            f"""
[broker]
name = "load-broker"
listen = "127.0.0.1:{free_port()}"
namesrv = ["{ns_addr}"]
data_dir = "{work / "store"}"
default_topic_queues = {args.queues}
{chr(10).join(args.broker_set)}

[plugins]
flush = "{args.flush}"

[store.mmap]
commitlog_file_size = {64 * 1024 * 1024}
{args.toml}
"""
        )
        broker = _start_broker(args, cfg, work, probe_dir)
        log(
            f"broker pid {broker.pid}; {args.producers} producers x {args.consumers} consumers, {args.minutes} min"
        )
        me = str(Path(__file__).resolve())
        common = ["--namesrv", ns_addr, "--topic", topic, "--minutes", str(args.minutes)]
        # Create the topic with its queues before consumers subscribe (a producer's auto-creation
        # would make only 4, leaving most of the consumers without a queue).
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tidemq",
                "admin",
                "updateTopic",
                "-n",
                ns_addr,
                "-t",
                topic,
                "-r",
                str(args.queues),
                "-w",
                str(args.queues),
            ],
            check=True,
            timeout=60,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                sys.executable,
                me,
                "--role",
                "producer",
                "--id",
                "999",
                "--out",
                str(work / "warm.acks"),
                "--minutes",
                "0.02",
                "--namesrv",
                ns_addr,
                "--topic",
                topic,
                "--concurrency",
                "1",
            ],
            check=True,
            timeout=120,
        )
        cons_out = [work / f"consumer-{i}.marks" for i in range(args.consumers)]
        for i, out in enumerate(cons_out):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        me,
                        "--role",
                        "consumer",
                        "--id",
                        str(i),
                        "--out",
                        str(out),
                        "--group",
                        "load-cg",
                        *common,
                    ],
                    stderr=open(work / f"consumer-{i}.log", "wb"),
                )
            )
        time.sleep(3)  # let the group rebalance before the load starts
        if args.probe:
            probes["start"] = _probe(args, broker.pid, probe_dir, "start")
        prod_out = [work / f"producer-{i}.acks" for i in range(args.producers)]
        producers = [
            subprocess.Popen(
                [
                    sys.executable,
                    me,
                    "--role",
                    "producer",
                    "--id",
                    str(i),
                    "--out",
                    str(out),
                    "--concurrency",
                    str(args.concurrency),
                    "--size",
                    str(args.size),
                    *common,
                ],
                stderr=open(work / f"producer-{i}.log", "wb"),
            )
            for i, out in enumerate(prod_out)
        ]
        procs.extend(producers)
        began = time.monotonic()
        timeline: list[dict[str, Any]] = []
        prod_status = [p.with_suffix(".status") for p in prod_out]
        cons_status = [p.with_suffix(".status") for p in cons_out]
        last_log = 0.0
        while any(p.poll() is None for p in producers):
            time.sleep(args.sample_s)
            acked, failed = _status_sum(prod_status)
            consumed, _ = _status_sum(cons_status)
            t = time.monotonic() - began
            timeline.append(
                {
                    "t_s": round(t, 1),
                    "acked": acked,
                    "failed": failed,
                    "consumed": consumed,
                    **{f"broker_{k}_kib": v for k, v in rss_kib(broker.pid).items()},
                }
            )
            if t - last_log >= 30:
                last_log = t
                log(
                    f"t={t:.0f}s acked={acked} consumed={consumed} failed={failed} rss={timeline[-1]['broker_rss_kib']} KiB (anon {timeline[-1]['broker_anon_kib']})"
                )
        produce_s = time.monotonic() - began
        if args.probe:
            probes["peak"] = _probe(args, broker.pid, probe_dir, "peak")
        for p in producers:
            if p.returncode != 0:
                log(f"producer exited with {p.returncode}")
        acked_marks = _merge([*prod_out, work / "warm.acks"])
        n_acked = sum(1 for arr in acked_marks.values() for v in arr if v)
        # Drain: wait until every acknowledged message was consumed (or the drain times out).
        drain_deadline = time.monotonic() + args.drain_s
        while time.monotonic() < drain_deadline:
            consumed, _ = _status_sum(cons_status)
            if consumed >= n_acked:
                cmp = _compare(acked_marks, _merge(cons_out))
                if cmp["lost"] == 0:
                    break
            time.sleep(2)
        drain_s = time.monotonic() - began - produce_s
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.probe:
            time.sleep(5)
            probes["idle"] = _probe(args, broker.pid, probe_dir, "idle", trim=True)
        cmp = _compare(acked_marks, _merge(cons_out))
        acked, failed = _status_sum(prod_status)
        consumed, _ = _status_sum(cons_status)

        def series(key: str) -> dict[str, Any]:
            vals = [s[key] for s in timeline if s[key]]
            steady = vals[len(vals) // 4 :] or vals
            return {
                "first": vals[0] if vals else 0,
                "max": max(vals, default=0),
                "last": vals[-1] if vals else 0,
                # Growth over the last three quarters of the run: a leak shows as a large ratio.
                "steady_growth_ratio": round(steady[-1] / steady[0], 3) if steady and steady[0] else 0,
            }

        return {
            "tree": _tree_name(args.broker_tree),
            "broker_tree": args.broker_tree,
            "broker_set": args.broker_set,
            "toml": args.toml,
            "producers": args.producers,
            "consumers": args.consumers,
            "minutes": args.minutes,
            "flush": args.flush,
            "queues": args.queues,
            "queues_in_store": len(list((work / "store" / "consumequeue" / topic).iterdir())),
            "message_size": args.size,
            "produce_seconds": round(produce_s, 1),
            "drain_seconds": round(drain_s, 1),
            **cmp,
            "send_failures": failed,
            "consumed_total": consumed,
            "produce_msgs_per_s": round(cmp["acked"] / produce_s, 1) if produce_s else 0,
            "consume_msgs_per_s": round(consumed / (produce_s + drain_s), 1),
            "broker_rss_kib": series("broker_rss_kib"),
            "broker_rss_anon_kib": series("broker_anon_kib"),
            "broker_rss_file_kib": series("broker_file_kib"),
            "timeline": timeline if args.timeline else timeline[:: max(1, len(timeline) // 20)],
            "work_dir": str(work) if args.keep else "",
            **({"probes": probes} if probes else {}),
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if broker is not None:
            stop(broker)
        if ns is not None:
            stop(ns)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=("coordinator", "producer", "consumer"), default="coordinator")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--producers", type=int, default=10)
    ap.add_argument("--consumers", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=4, help="sends in flight per producer")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--queues", type=int, default=20)
    ap.add_argument("--flush", choices=("async", "sync"), default="async")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--drain-s", type=float, default=120.0)
    ap.add_argument("--timeline", action="store_true", help="print every RSS/throughput sample")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--broker-tree", default="", help="PYTHONPATH for the broker: older code (see above)")
    ap.add_argument(
        "--broker-set", action="append", default=[], help="a line for [broker], e.g. 'dedup_window_s = 0'"
    )
    ap.add_argument("--toml", default="", help="TOML appended to the broker's configuration (other tables)")
    ap.add_argument("--probe", action="store_true", help="the broker's memory by component (see above)")
    ap.add_argument("--tracemalloc", type=int, default=0, help="with --probe: tracemalloc frames (0: off)")
    # worker-process options
    ap.add_argument("--namesrv")
    ap.add_argument("--topic")
    ap.add_argument("--id", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--group", default="load-cg")
    args = ap.parse_args()
    if args.role == "producer":
        asyncio.run(run_producer(args))
    elif args.role == "consumer":
        asyncio.run(run_consumer(args))
    else:
        print(json.dumps(coordinate(args), indent=2))


if __name__ == "__main__":
    main()
