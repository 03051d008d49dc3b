"""What the confirm offset costs a consumer of a SYNC controller-mode group (master + slave).

Each round starts, for each configuration, etcd's group (one shared etcd), a NameServer and two
controller-mode SYNC_MASTER replicas on loopback, waits until both are in the in-sync set, then:

- **consume**: ``--messages`` 1 KiB messages are sent (4 sender threads), then one pull consumer
  reads them all back ``--passes`` times (4 queues, 32 per pull); ``consume_msgs_s`` and the master's CPU seconds
  during the read (``consume_cpu_s``, ``consume_msgs_per_cpu_s``);
- **delay**: a producer sends at ``--rate`` msgs/s for ``--seconds`` s (one thread, SYNC sends,
  so each message waits for the slave) while a push consumer receives; the delay from before
  the send to the receive, p50/p99 (ms), and the master's CPU per received message.

Configurations: ``a`` (this tree: reads bounded by the confirm offset), ``a_uncommitted`` (this
tree with ``read_uncommitted = true``: no bound) and ``b`` (``--b-tree``: the old code on
PYTHONPATH, as compare_ab does), in an order rotated every round.  JSON on stdout.

    python bench/confirm_offset_bench.py --b-tree /work/wt/base_pkgs [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from failover_bench import start_etcd  # noqa: E402
from ha_bench import Proc, cpu_seconds, free_port, runtime_info, sync_set_size, wait_for  # noqa: E402

from tidemq.client import (  # noqa: E402
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    Message,
    PullStatus,
)

TOPIC = "ConfirmBench"


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def write_config(root: Path, name: str, i: int, ns: str, etcd: str, extra: str) -> Path:
    path = root / f"{name}-{i}.toml"
    path.write_text(
        f"""[broker]
cluster = "confirm-bench"
name = "{name}"
id = {i}
role = "SYNC_MASTER"
listen = "127.0.0.1:{free_port()}"
namesrv = ["{ns}"]
data_dir = "{root / f"{name}-{i}"}"
register_interval_s = 0.5
default_topic_queues = 4

[plugins]
replication = "controller"

[replication.controller]
etcd = ["{etcd}"]
ttl_s = 2
keepalive_s = 0.4
fence_margin_s = 0.6
request_timeout_s = 0.4
listen = "127.0.0.1:{free_port()}"
heartbeat_s = 1.0
housekeeping_s = 5.0
{extra}
"""
    )
    return path


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else 0.0


def run_config(
    root: Path, etcd_url: str, label: str, tree: str, extra: str, args: argparse.Namespace
) -> dict[str, Any]:
    name = f"cb-{label}-{uuid.uuid4().hex[:6]}"
    saved = os.environ.get("PYTHONPATH")
    procs: list[Proc] = []
    try:
        if tree:
            os.environ["PYTHONPATH"] = tree  # the children import the old packages first
        ns_proc = Proc(["namesrv", "--listen", f"127.0.0.1:{free_port()}"], root / f"{name}-ns.log")
        procs.append(ns_proc)
        ns = ns_proc.address
        for i in (1, 2):
            path = write_config(root, name, i, ns, etcd_url, extra)
            procs.append(Proc(["broker", "-c", str(path)], root / f"{name}-{i}.log"))
    finally:
        if tree:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
    try:
        replicas = procs[1:]

        def masters() -> list[Proc]:
            return [r for r in replicas if runtime_info(r.address).get("controllerRole") == "SYNC_MASTER"]

        wait_for(lambda: len(masters()) == 1, 60)
        master = masters()[0]
        wait_for(lambda: sync_set_size(master.address) == 2, 60)
        pid = master.proc.pid
        out: dict[str, Any] = {}

        # ---- consume: fill, then read everything back
        body = os.urandom(512).hex().encode()
        producer = BlockingProducer(f"cb-pg-{label}", ns, send_timeout=5.0)
        producer.start()
        try:
            wait_for(lambda: producer.send(Message(TOPIC, body)).status.value == "SEND_OK", 30)
            per = args.messages // 4

            def fill() -> None:
                for _ in range(per):
                    producer.send(Message(TOPIC, body))

            ts = [threading.Thread(target=fill) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        finally:
            producer.shutdown()
        consumer = BlockingPullConsumer(f"cb-pull-{label}", ns)
        consumer.start()
        try:
            queues = consumer.fetch_subscribe_queues(TOPIC)
            cpu0, t0, got = cpu_seconds(pid), time.perf_counter(), 0
            for _ in range(args.passes):  # /proc's CPU figures tick every 10 ms: read long enough
                for mq in queues:
                    offset = 0
                    while True:
                        res = consumer.pull(mq, "*", offset, 32)
                        if res.status is not PullStatus.FOUND:
                            break
                        got += len(res.messages)
                        offset = res.next_begin_offset
            elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        finally:
            consumer.shutdown()
        out.update(
            consume_msgs=got,
            consume_msgs_s=round(got / elapsed, 1),
            consume_cpu_s=round(cpu, 3),
            consume_msgs_per_cpu_s=round(got / cpu, 1) if cpu else None,
        )

        # ---- delay: fixed-rate SYNC sends, a push consumer receiving
        delays: list[float] = []
        lock = threading.Lock()
        group = f"cb-push-{label}-{uuid.uuid4().hex[:4]}"
        push = BlockingPushConsumer(group, ns, consume_from="CONSUME_FROM_LAST_OFFSET")
        push.subscribe(TOPIC)

        def listener(msgs: list[Any]) -> None:
            now = time.time_ns()
            with lock:
                for m in msgs:
                    if m.body.startswith(b"t="):
                        delays.append((now - int(m.body[2:].split(b";")[0])) / 1e6)

        push.register_listener(listener)
        push.start()
        sender = BlockingProducer(f"cb-rate-{label}", ns, send_timeout=5.0)
        sender.start()
        try:
            time.sleep(2.0)  # the push consumer's rebalance and first (held) pulls
            pad = b";" + b"x" * 900
            n = int(args.rate * args.seconds)
            cpu0 = cpu_seconds(pid)
            start = time.perf_counter()
            for k in range(n):
                due = start + k / args.rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                sender.send(Message(TOPIC, b"t=%d" % time.time_ns() + pad))
            wait_for(lambda: len(delays) >= n, 20)
            cpu = cpu_seconds(pid) - cpu0
        except TimeoutError:
            cpu = cpu_seconds(pid) - cpu0
        finally:
            sender.shutdown()
            push.shutdown()
        out.update(
            delay_received=len(delays),
            delay_p50_ms=round(pct(delays, 0.5), 3),
            delay_p99_ms=round(pct(delays, 0.99), 3),
            delay_max_ms=round(max(delays), 3) if delays else None,
            delay_master_cpu_ms_per_msg=round(cpu * 1000 / max(len(delays), 1), 4),
        )
        return out
    finally:
        for p in reversed(procs):
            p.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--b-tree", default="", help="PYTHONPATH of configuration b (the old code)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--passes", type=int, default=10, help="times the consumer reads the topic")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--configs", default="a,a_uncommitted,b")
    args = p.parse_args()
    configs = {
        "a": ("", ""),
        "a_uncommitted": ("", "read_uncommitted = true"),
        "b": (args.b_tree, ""),
    }
    chosen = [c for c in args.configs.split(",") if c]
    if "b" in chosen and not args.b_tree:
        raise SystemExit("configuration b needs --b-tree")
    root = Path(tempfile.mkdtemp(prefix="confirm-bench-"))
    etcd, etcd_url = start_etcd(root)
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
            row: dict[str, Any] = {"load_before": os.getloadavg()[0]}
            for label in order:
                tree, extra = configs[label]
                progress(f"round {r + 1}: {label}")
                row[label] = run_config(root, etcd_url, label, tree, extra, args)
                progress(f"  {row[label]}")
            rounds.append(row)
    finally:
        etcd.terminate()
        etcd.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    keys = (
        "consume_msgs_s",
        "consume_msgs_per_cpu_s",
        "delay_p50_ms",
        "delay_p99_ms",
        "delay_master_cpu_ms_per_msg",
    )
    medians = {
        label: {
            k: statistics.median([x[label][k] for x in rounds if x[label].get(k) is not None] or [0])
            for k in keys
        }
        for label in chosen
    }
    print(
        json.dumps(
            {
                "bench": "confirm_offset_bench",
                "args": vars(args),
                "rounds": rounds,
                "medians": medians,
                "load_after": os.getloadavg()[0],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
