"""HA benchmark: send throughput and latency with no slave, ASYNC_MASTER + slave, SYNC_MASTER + slave.

Each mode runs a real NameServer and brokers as subprocesses (``python -m tidemq``) on loopback,
then ``--threads`` producer threads send ``--messages`` messages of ``--size`` bytes through
tidemq's client.  Also measured: how long the slave takes to hold everything after the last send
(replication catch-up) and the replication throughput of an empty slave copying the whole log.

    python bench/ha_bench.py                 # moderate default (< 60 s)
    python bench/ha_bench.py --messages 20000 --threads 8 --compression zstd

Prints one JSON object on stdout: per mode, msgs/s, p50/p99 send latency (ms), plus ratios to the
no-slave baseline.  Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from tidemq.client import BlockingProducer, Message
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: list[str], log: Path):
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "--log-level", "WARNING", *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if " listening on " in line:
                self.address = line.rsplit(" ", 1)[1].strip()
                return
            if not line:
                break
        self.stop()
        raise RuntimeError(f"{args} did not start; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def broker_config(
    root: Path, name: str, role: str, broker_id: int, ns: str, compression: str, replication: str
) -> Path:
    data = root / name
    lines = [
        "[broker]",
        'name = "bench-ha"',
        f"id = {broker_id}",
        f'listen = "127.0.0.1:{free_port()}"',
        f'namesrv = ["{ns}"]',
        f'data_dir = "{data}"',
        f'role = "{role}"',
        "register_interval_s = 0.5",
        "[plugins]",
        f'replication = "{replication}"',
    ]
    if replication == "master_slave":
        lines += [
            "[replication.master_slave]",
            f'listen = "127.0.0.1:{free_port()}"',
            f'compression = "{compression}"',
            "heartbeat_s = 1.0",
        ]
    path = root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def runtime_info(addr: str) -> dict[str, str]:
    async def ask() -> dict[str, str]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            resp = await client.invoke(
                addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3.0
            )
        finally:
            await client.close()
        return dict(orjson.loads(resp.body)["table"])

    return asyncio.run(ask())


def wait_for(pred: Any, timeout: float = 60.0) -> float:
    begin = time.monotonic()
    while time.monotonic() - begin < timeout:
        try:
            if pred():
                return time.monotonic() - begin
        except Exception:
            pass
        time.sleep(0.02)
    raise TimeoutError("condition not met")


def produce(ns: str, messages: int, threads: int, size: int) -> tuple[float, list[float], dict[str, int]]:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    body = os.urandom(size // 2).hex().encode()[:size]
    producer = BlockingProducer(f"bench-ha-{os.getpid()}", ns)
    producer.start()
    try:
        producer.send(Message("BenchHa", body))  # route + topic creation outside the timing
        per = messages // threads

        def worker() -> None:
            local: list[float] = []
            counts: dict[str, int] = {}
            for _ in range(per):
                t0 = time.perf_counter()
                r = producer.send(Message("BenchHa", body))
                local.append((time.perf_counter() - t0) * 1000)
                counts[r.status.value] = counts.get(r.status.value, 0) + 1
            with lock:
                latencies.extend(local)
                for k, v in counts.items():
                    statuses[k] = statuses.get(k, 0) + v

        begin = time.perf_counter()
        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - begin
    finally:
        producer.shutdown()
    return elapsed, latencies, statuses


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))] if values else 0.0


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    progress(f"mode {mode}")
    root.mkdir(parents=True)
    ns = Proc(["namesrv", "--listen", f"127.0.0.1:{free_port()}"], root / "namesrv.log")
    procs = [ns]
    try:
        role = {"no_slave": "ASYNC_MASTER", "async": "ASYNC_MASTER", "sync": "SYNC_MASTER"}[mode]
        replication = "none" if mode == "no_slave" else "master_slave"
        master = Proc(
            [
                "broker",
                "-c",
                str(broker_config(root, "m", role, 0, ns.address, args.compression, replication)),
            ],
            root / "m.log",
        )
        procs.append(master)
        slave = None
        if mode != "no_slave":
            slave = Proc(
                [
                    "broker",
                    "-c",
                    str(broker_config(root, "s", "SLAVE", 1, ns.address, args.compression, replication)),
                ],
                root / "s.log",
            )
            procs.append(slave)
            wait_for(lambda: runtime_info(slave.address)["haMasterConnected"] == "true", 30)
        elapsed, lat, statuses = produce(ns.address, args.messages, args.threads, args.size)
        out: dict[str, Any] = {
            "messages": len(lat),
            "seconds": round(elapsed, 3),
            "msgs_per_s": round(len(lat) / elapsed, 1),
            "p50_ms": round(pct(lat, 0.50), 3),
            "p99_ms": round(pct(lat, 0.99), 3),
            "mean_ms": round(statistics.fmean(lat), 3) if lat else 0.0,
            "statuses": statuses,
        }
        if slave is not None:
            end = runtime_info(master.address)["commitLogMaxOffset"]
            out["slave_catch_up_s"] = round(
                wait_for(lambda: runtime_info(slave.address)["commitLogMaxOffset"] == end), 3
            )
        progress(f"  {json.dumps(out)}")
        return out
    finally:
        for p in reversed(procs):
            p.stop()


def replication_throughput(root: Path, megabytes: int, codec: str) -> dict[str, Any]:
    """An empty slave copying a master's whole commit log (two mmap stores in this process)."""
    from tidemq.testing.store_contract import build_store, message

    opts = {"commitlog_file_size": 64 * 1024 * 1024}
    master_store = build_store("mmap", root / f"rm-{codec}", store_options=opts, flush="async")
    slave_store = build_store("mmap", root / f"rs-{codec}", store_options=opts, flush="async")
    for s in (master_store, slave_store):
        s.load()
        s.start()
    pm = get_plugin_manager()
    master = pm.create("replication", "master_slave", options={"listen": "127.0.0.1:0", "compression": codec})
    slave: Any = None
    try:
        master.start(master_store, {"role": "ASYNC_MASTER"})
        # Text-like bodies (JSON events) so compression has something to do.
        body = b"".join(
            b'{"event":%d,"user":"u%05d","action":"click","page":"/item/%d"},' % (i, i % 977, i % 89)
            for i in range(16)
        )
        futures = [
            master_store.put_message(message("BenchCopy", body, i % 4))
            for i in range(megabytes * 1024 * 1024 // (len(body) + 200))
        ]
        for f in futures:
            f.result(30)
        end = master_store.get_max_phy_offset()
        slave = pm.create(
            "replication",
            "master_slave",
            options={"master_address": master.ha_address(), "compression": codec},
        )
        t0 = time.perf_counter()
        slave.start(slave_store, {"role": "SLAVE", "id": 1})
        wait_for(lambda: slave_store.get_max_phy_offset() == end, 300)
        secs = time.perf_counter() - t0
        return {"bytes": end, "seconds": round(secs, 3), "mb_per_s": round(end / secs / 1e6, 1)}
    finally:
        if slave is not None:
            slave.shutdown()
        master.shutdown()
        for s in (slave_store, master_store):
            s.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--compression", choices=("none", "lz4", "zstd"), default="none")
    ap.add_argument("--copy-mb", type=int, default=24, help="commit-log size for the replication copy test")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidemq-ha-bench-"))
    try:
        results = {m: run_mode(m, args, root / m) for m in ("no_slave", "async", "sync")}
        copies = {}
        for codec in ("none", "lz4", "zstd"):
            progress(f"replication copy, compression {codec}")
            copies[codec] = replication_throughput(root, args.copy_mb, codec)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = results["no_slave"]
    ratios = {
        f"{m}_vs_no_slave": {
            "throughput": round(results[m]["msgs_per_s"] / base["msgs_per_s"], 3),
            "p99_latency": round(results[m]["p99_ms"] / max(base["p99_ms"], 1e-9), 3),
        }
        for m in ("async", "sync")
    }
    ratios["sync_vs_async"] = {
        "throughput": round(results["sync"]["msgs_per_s"] / results["async"]["msgs_per_s"], 3),
        "p99_latency": round(results["sync"]["p99_ms"] / max(results["async"]["p99_ms"], 1e-9), 3),
    }
    ratios["replication_lz4_vs_none"] = round(copies["lz4"]["mb_per_s"] / copies["none"]["mb_per_s"], 3)
    ratios["replication_zstd_vs_none"] = round(copies["zstd"]["mb_per_s"] / copies["none"]["mb_per_s"], 3)
    print(
        json.dumps(
            {"params": vars(args), "results": results, "replication_copy": copies, "ratios": ratios}, indent=2
        )
    )


if __name__ == "__main__":
    main()
