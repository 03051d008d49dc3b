"""Failover of a controller-mode broker group (issue 25): time to a new master, producer stall, loss.

Starts etcd (the ``etcd`` binary, Debian ``etcd-server``), a NameServer and a group of
``--replicas`` SYNC_MASTER brokers with ``replication = "controller"`` (subprocesses on free
loopback ports).  A producer sends continuously (one send at a time, no retries); each of
``--rounds`` rounds SIGKILLs the master, waits for the first send acknowledged by the new master,
and restarts the killed broker (it rejoins as a slave).  At the end every acknowledged message is
read back through the route.  Prints one JSON object on stdout (progress on stderr):

- ``time_to_new_master_s``: from the SIGKILL to the first send acknowledged by the new master;
- ``producer_stall_s``: the longest gap between two acknowledged sends around each kill;
- ``messages_lost``: acknowledged messages not readable at the end (must be 0).

    python bench/failover_bench.py [--rounds N] [--replicas N] [--ttl S] [--keepalive S] [--margin S]

Timings are noisy on a shared machine: compare medians and maxima, not single rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop

from tidemq.client import BlockingProducer, BlockingPullConsumer, Message, PullStatus, SendStatus

TOPIC = "FailoverBench"


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_etcd(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit("etcd is not installed (Debian package etcd-server)")
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    args = [binary, "--name", "b", "--data-dir", str(directory / "etcd")]
    args += ["--listen-client-urls", url, "--advertise-client-urls", url]
    args += ["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url]
    args += ["--initial-cluster", f"b={peer_url}"]
    with open(directory / "etcd.log", "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as rsp:
                if b'"true"' in rsp.read():
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"etcd did not start; see {directory / 'etcd.log'}")


def write_config(directory: Path, i: int, ns: str, etcd: str, args: argparse.Namespace) -> tuple[Path, str]:
    addr = f"127.0.0.1:{free_port()}"
    path = directory / f"broker-{i}.toml"
    path.write_text(
        f"""[broker]
name = "broker-bench"
id = {i}
role = "SYNC_MASTER"
listen = "{addr}"
namesrv = ["{ns}"]
data_dir = "{directory / f"broker-{i}"}"
register_interval_s = 0.5

[plugins]
replication = "controller"

[replication.controller]
etcd = ["{etcd}"]
ttl_s = {args.ttl}
keepalive_s = {args.keepalive}
fence_margin_s = {args.margin}
request_timeout_s = {min(1.0, args.keepalive)}
listen = "127.0.0.1:{free_port()}"
heartbeat_s = 1.0
housekeeping_s = 5.0
metadata_sync_s = 1.0
"""
    )
    return path, addr


def runtime_role(addr: str) -> str:
    import asyncio

    import orjson

    from tidemq.client.admin import AdminClient
    from tidemq.remoting.codes import RequestCode

    async def ask() -> str:
        client = AdminClient("127.0.0.1:1")
        try:
            resp = await client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        finally:
            await client.close()
        return str(orjson.loads(resp.body or b"{}").get("table", {}).get("controllerRole", ""))

    try:
        return asyncio.run(ask())
    except Exception:
        return ""


class Load:
    def __init__(self, ns: str) -> None:
        self.acked: dict[str, bytes] = {}
        self.times: list[tuple[float, int]] = []  # (monotonic, store port)
        self._stop = threading.Event()
        self.producer = BlockingProducer("bench-fo", ns, retry_times=0, send_timeout=3.0, route_refresh_s=0.5)
        self.producer.start()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = b"bench-%08d" % i
            i += 1
            try:
                r = self.producer.send(Message(TOPIC, body))
            except Exception:
                time.sleep(0.02)
                continue
            if r.status is SendStatus.SEND_OK:
                self.acked[r.msg_id] = body
                self.times.append((time.monotonic(), int(r.offset_msg_id[8:16], 16)))

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.thread.join(10)
        self.producer.shutdown()


def read_back(ns: str) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    consumer = BlockingPullConsumer(f"bench-check-{uuid.uuid4().hex[:6]}", ns)
    consumer.start()
    try:
        for mq in consumer.fetch_subscribe_queues(TOPIC):
            offset = 0
            while True:
                res = consumer.pull(mq, "*", offset, 256)
                if res.status is not PullStatus.FOUND:
                    break
                for m in res.messages:
                    got[m.uniq_key or ""] = m.body
                offset = res.next_begin_offset
    finally:
        consumer.shutdown()
    return got


def wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=2, help="lease TTL (s); the plugin's default is 6")
    parser.add_argument("--keepalive", type=float, default=0.4)
    parser.add_argument("--margin", type=float, default=0.6)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-failover-bench-"))
    procs: dict[int, subprocess.Popen[bytes]] = {}
    etcd, etcd_url = start_etcd(work)
    ns_addr = f"127.0.0.1:{free_port()}"
    namesrv = start(["namesrv", "--listen", ns_addr], work, "namesrv")
    configs = {i: write_config(work, i, ns_addr, etcd_url, args) for i in range(1, args.replicas + 1)}
    load: Load | None = None
    rounds: list[dict[str, float]] = []
    try:
        for i, (path, _) in configs.items():
            procs[i] = start(["broker", "-c", str(path)], work, f"broker-{i}")

        def master() -> int | None:
            found = [
                i for i, (_, addr) in configs.items() if i in procs and runtime_role(addr) == "SYNC_MASTER"
            ]
            return found[0] if len(found) == 1 else None

        if not wait(lambda: master() is not None, 30):
            raise SystemExit(f"no master elected; see {work}")
        load = Load(ns_addr)
        wait(lambda: len(load.acked) >= 100, 30)
        for n in range(args.rounds):
            old = master()
            assert old is not None
            killed = time.monotonic()
            procs[old].send_signal(signal.SIGKILL)
            procs[old].wait()
            del procs[old]
            ports = {int(addr.rsplit(":", 1)[1]) for i, (_, addr) in configs.items() if i != old}

            def first_ack(after: float = killed, ports: set[int] = ports) -> float | None:
                return next((t for t, p in list(load.times) if t > after and p in ports), None)

            if not wait(lambda: first_ack() is not None, 60):
                raise SystemExit(f"round {n}: no new master acknowledged within 60 s; see {work}")
            first = first_ack()
            assert first is not None
            before = max((t for t, _ in list(load.times) if t <= killed), default=killed)
            rounds.append({"time_to_new_master_s": first - killed, "producer_stall_s": first - before})
            progress(f"round {n + 1}: new master acknowledging {first - killed:.2f} s after the kill")
            procs[old] = start(["broker", "-c", str(configs[old][0])], work, f"broker-{old}")
            wait(lambda o=old: runtime_role(configs[o][1]) == "SLAVE", 30)
            time.sleep(1.0)  # the restarted replica catches up before the next kill
        load.stop()
        got = read_back(ns_addr)
        lost = sum(1 for k in load.acked if k not in got)
        wrong = sum(1 for k, body in load.acked.items() if k in got and got[k] != body)
    finally:
        if load is not None:
            load.stop()
        for proc in procs.values():
            stop(proc)
        stop(namesrv)
        etcd.terminate()
        etcd.wait(10)
    times = [r["time_to_new_master_s"] for r in rounds]
    stalls = [r["producer_stall_s"] for r in rounds]
    print(
        json.dumps(
            {
                "rounds": len(rounds),
                "replicas": args.replicas,
                "lease": {"ttl_s": args.ttl, "keepalive_s": args.keepalive, "fence_margin_s": args.margin},
                "time_to_new_master_s": {
                    "median": round(statistics.median(times), 3),
                    "max": round(max(times), 3),
                    "all": [round(t, 3) for t in times],
                },
                "producer_stall_s": {
                    "median": round(statistics.median(stalls), 3),
                    "max": round(max(stalls), 3),
                },
                "messages_acknowledged": len(load.acked) if load is not None else 0,
                "messages_lost": lost,
                "messages_changed": wrong,
            },
            indent=2,
        )
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
