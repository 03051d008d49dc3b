"""POP consumption (issue 39): cost against classic pulls, redelivery lateness, SIGKILL in flight.

Starts a NameServer and a broker (subprocesses on free loopback ports), sends ``--messages``
messages of ``--size`` bytes to a 4-queue topic, then measures, in one run:

* classic: tidemq's PullConsumer reads them all (32 per pull); broker CPU seconds;
* pop+ack: tidemq's SimpleConsumer receives them (32 per POP) and acknowledges each with its own
  ACK_MESSAGE (the 32 sent together);
* pop+batch-ack: the same with one BATCH_ACK_MESSAGE per received batch;
  each as messages per broker CPU-second (utime+stime of the broker process, /proc/<pid>/stat);
* lateness: ``--redeliver`` messages popped with a 2 s invisible time and not acknowledged; each
  redelivery's lateness past ``popTime + invisibleTime`` (p50, p99, max);
* crash: ``--inflight`` messages popped (30 s invisible), half acknowledged, the broker SIGKILLed and
  restarted: how many unacknowledged ones come back (must be all) and how many acknowledged ones do.

``--baseline DIR`` runs the three cost phases on a second NameServer and broker too, whose
``tidemq`` package is imported from DIR first (``PYTHONPATH``: a directory holding a ``tidemq``
package of another version, e.g. a copy of ``core/`` at an older commit), phase by phase in turn
with this tree's (A/B in one run on a shared machine); ``--rounds`` repeats them.

Prints one JSON object on stdout, progress on stderr.

    python bench/pop_bench.py [--messages N] [--size BYTES] [--redeliver N] [--inflight N]
                              [--baseline DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop

from tidemq.client import Message, Producer, PullConsumer, ReceivedMessage, SimpleConsumer
from tidemq.client.admin import AdminClient
from tidemq.remoting.codes import RequestCode

TOPIC = "PopBench"
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[pop_bench] {msg}", file=sys.stderr, flush=True)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Cluster:
    def __init__(self, work: Path, pythonpath: str = "") -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.pythonpath = pythonpath  # the broker imports tidemq from here first ("": this tree)
        self.ns_addr = f"127.0.0.1:{free_port()}"
        self.broker_addr = f"127.0.0.1:{free_port()}"
        (work / "broker.toml").write_text('[broker]\nname = "pop-bench"\n')
        self.ns = start(["namesrv", "--listen", self.ns_addr], work, "namesrv")
        self.broker = self._broker()

    def _broker(self) -> Any:
        if not self.pythonpath:
            return self._start_broker()
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = self.pythonpath
        try:
            return self._start_broker()
        finally:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before

    def _start_broker(self) -> Any:
        return start(
            [
                "broker",
                "-c",
                str(self.work / "broker.toml"),
                "--listen",
                self.broker_addr,
                "--namesrv",
                self.ns_addr,
            ]
            + ["--data-dir", str(self.work / "data")],
            self.work,
            "broker",
        )

    def kill_and_restart(self) -> None:
        self.broker.send_signal(signal.SIGKILL)
        self.broker.wait()
        self.broker = self._broker()

    def close(self) -> None:
        stop(self.broker)
        stop(self.ns)


async def send(ns: str, topic: str, n: int, size: int) -> None:
    body = b"x" * size
    async with Producer("PG_POP_BENCH", namesrv=ns) as p:
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                await p.send(Message(topic, body, keys=f"k{i}"))

        await asyncio.gather(*(one(i) for i in range(n)))


async def classic(ns: str, n: int, group: str = "GCLASSIC_BENCH") -> int:
    got = 0
    async with PullConsumer(group, ns) as pc:
        queues = await pc.fetch_subscribe_queues(TOPIC)
        offsets = {mq: 0 for mq in queues}
        while got < n:
            progressed = False
            for mq in queues:
                r = await pc.pull(mq, "*", offsets[mq], 32)
                if r.messages:
                    got += len(r.messages)
                    offsets[mq] = r.next_begin_offset
                    progressed = True
            if not progressed:
                break
    return got


async def pop_consume(ns: str, group: str, n: int, batch_ack: bool, workers: int = 4) -> int:
    got = 0
    async with SimpleConsumer(
        group, ns, subscriptions={TOPIC: "*"}, consume_from="first", await_duration=0
    ) as c:

        async def worker() -> None:
            nonlocal got
            idle = 0
            while got < n and idle < 3:
                msgs = await c.receive(32, 60, 0)
                if not msgs:
                    idle += 1
                    continue
                idle = 0
                got += len(msgs)
                if batch_ack:
                    await c.ack_many(msgs)
                else:  # one ACK_MESSAGE per message, sent together (as a consumer acking as it goes)
                    await asyncio.gather(*(c.ack(m) for m in msgs))

        await asyncio.gather(*(worker() for _ in range(workers)))
    return got


async def lateness(ns: str, n: int) -> dict[str, Any]:
    topic = "PopBenchLate"
    await send(ns, topic, n, 100)
    async with SimpleConsumer("GLATE_BENCH", ns, subscriptions={topic: "*"}, consume_from="first") as c:
        first: list[ReceivedMessage] = []
        while len(first) < n:
            got = await c.receive(32, 2.0, 0.5)
            if not got:
                break
            first += got
        due = {m.message_id: int(m.handle.split(" ")[1]) + int(m.handle.split(" ")[2]) for m in first}
        late: list[float] = []
        total = len(due)
        deadline = time.monotonic() + 30
        while len(late) < total and time.monotonic() < deadline:
            got = await c.receive(32, 60, 1.0)
            now = time.time() * 1000
            for m in got:
                if m.message_id in due:
                    late.append(now - due.pop(m.message_id))
            if got:
                await c.ack_many(got)
    late.sort()
    return {
        "messages": n,
        "popped": len(first),
        "redelivered": len(late),
        "lateness_ms_p50": round(statistics.median(late), 1) if late else None,
        "lateness_ms_p99": round(late[min(len(late) - 1, int(len(late) * 0.99))], 1) if late else None,
        "lateness_ms_max": round(late[-1], 1) if late else None,
    }


async def crash(cluster: Cluster, n: int) -> dict[str, Any]:
    topic = "PopBenchCrash"
    ns = cluster.ns_addr
    await send(ns, topic, n, 100)
    c = SimpleConsumer("GCRASH_BENCH", ns, subscriptions={topic: "*"}, consume_from="first")
    await c.start()
    popped: list[ReceivedMessage] = []
    while len(popped) < n:
        got = await c.receive(32, 30.0, 0.5)
        if not got:
            break
        popped += got
    acked = popped[: len(popped) // 2]
    await c.ack_many(acked)
    await c.shutdown()
    log(f"crash: {len(popped)} popped, {len(acked)} acknowledged; SIGKILL")
    await asyncio.to_thread(cluster.kill_and_restart)
    acked_ids = {m.message_id for m in acked}
    unacked_ids = {m.message_id for m in popped} - acked_ids
    back: set[str] = set()
    acked_back = 0
    async with SimpleConsumer("GCRASH_BENCH", ns, subscriptions={topic: "*"}, consume_from="first") as c2:
        deadline = time.monotonic() + 60
        while back != unacked_ids and time.monotonic() < deadline:
            got = await c2.receive(32, 60, 1.0)
            for m in got:
                if m.message_id in acked_ids:
                    acked_back += 1
                back.add(m.message_id)
            if got:
                await c2.ack_many(got)
    return {
        "in_flight": len(popped),
        "acknowledged_before_kill": len(acked),
        "unacknowledged_redelivered": len(back & unacked_ids),
        "unacknowledged_lost": len(unacked_ids - back),
        "acknowledged_redelivered": acked_back,
    }


async def prepare(cluster: Cluster, messages: int, size: int) -> None:
    admin = AdminClient(cluster.ns_addr)
    try:
        await admin.call(
            cluster.broker_addr,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6},
        )
    finally:
        await admin.close()
    log(f"sending {messages} x {size} B to {cluster.broker_addr}")
    await send(cluster.ns_addr, TOPIC, messages, size)


PHASES = ("classic_pull", "pop_ack", "pop_batch_ack")


async def phase(cluster: Cluster, name: str, messages: int, round_no: int) -> dict[str, Any]:
    ns = cluster.ns_addr
    runs = {
        "classic_pull": lambda: classic(ns, messages, f"GCLASSIC_BENCH_{round_no}"),
        "pop_ack": lambda: pop_consume(ns, f"GPOP_BENCH_ACK_{round_no}", messages, False),
        "pop_batch_ack": lambda: pop_consume(ns, f"GPOP_BENCH_BATCH_{round_no}", messages, True),
    }
    pid = cluster.broker.pid
    c0, t0 = cpu_s(pid), time.monotonic()
    got = await runs[name]()
    cpu, wall = cpu_s(pid) - c0, time.monotonic() - t0
    return {
        "messages": got,
        "wall_s": round(wall, 2),
        "broker_cpu_s": round(cpu, 2),
        "msgs_per_broker_cpu_s": round(got / cpu) if cpu else None,
        "msgs_per_s": round(got / wall),
    }


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each phase's best round (the least disturbed by the other tenants) and the ratios."""
    out: dict[str, Any] = {}
    for name, rounds in runs.items():
        best = max(rounds, key=lambda r: r["msgs_per_broker_cpu_s"] or 0)
        out[name] = {**best, "rounds_msgs_per_broker_cpu_s": [r["msgs_per_broker_cpu_s"] for r in rounds]}
    base = out["classic_pull"]["msgs_per_broker_cpu_s"] or 1
    out["pop_ack_vs_classic"] = round((out["pop_ack"]["msgs_per_broker_cpu_s"] or 0) / base, 2)
    out["pop_batch_ack_vs_classic"] = round((out["pop_batch_ack"]["msgs_per_broker_cpu_s"] or 0) / base, 2)
    return out


async def main_async(args: argparse.Namespace, cluster: Cluster, baseline: Cluster | None) -> dict[str, Any]:
    ns = cluster.ns_addr
    clusters = {"this": cluster} if baseline is None else {"baseline": baseline, "this": cluster}
    for c in clusters.values():
        await prepare(c, args.messages, args.size)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {p: [] for p in PHASES} for k in clusters}
    for round_no in range(args.rounds):
        for name in PHASES:
            for label, c in clusters.items():  # A then B, phase by phase: the same machine load
                r = await phase(c, name, args.messages, round_no)
                runs[label][name].append(r)
                log(f"round {round_no} {label} {name}: {r}")
    out: dict[str, Any] = summarise(runs["this"])
    if baseline is not None:
        out["baseline"] = summarise(runs["baseline"])
        out["baseline"]["pythonpath"] = baseline.pythonpath
    log("redelivery lateness")
    out["redelivery"] = await lateness(ns, args.redeliver)
    log(f"redelivery: {out['redelivery']}")
    out["sigkill"] = await crash(cluster, args.inflight)
    log(f"sigkill: {out['sigkill']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--redeliver", type=int, default=2000)
    ap.add_argument("--inflight", type=int, default=10_000)
    ap.add_argument("--baseline", default="", help="PYTHONPATH of a baseline tidemq for an A/B run")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pop-bench-") as tmp:
        cluster = Cluster(Path(tmp) / "this")
        baseline = Cluster(Path(tmp) / "baseline", args.baseline) if args.baseline else None
        try:
            result = asyncio.run(main_async(args, cluster, baseline))
        finally:
            cluster.close()
            if baseline is not None:
                baseline.close()
    result["params"] = vars(args)
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
