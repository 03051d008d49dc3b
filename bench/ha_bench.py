"""HA benchmark: send throughput and latency with no slave, ASYNC_MASTER + slave, SYNC_MASTER + slave.

Each mode runs a real NameServer and brokers as subprocesses (``python -m tidemq``) on loopback,
then ``--threads`` producer threads send ``--messages`` messages of ``--size`` bytes through
tidemq's client.  Also measured: how long the slave takes to hold everything after the last send
(replication catch-up), the brokers' CPU seconds during the load (``/proc/<pid>/stat``), and the
replication throughput of an empty slave copying the whole log.

Modes: ``no_slave`` (alias ``none``), ``async`` and ``sync`` (master + 1 slave, ``master_slave``),
and ``sync_controller``: etcd plus ``--controller-replicas`` (3) SYNC_MASTER replicas with
``replication = "controller"`` (issue 25), loaded once a master is elected and its in-sync set holds
them all; it also counts etcd writes during the load (skipped, with a line on stderr, when the
``etcd`` binary is missing).

    python bench/ha_bench.py                 # moderate default (< 60 s)
    python bench/ha_bench.py --messages 20000 --threads 8 --compression zstd
    python bench/ha_bench.py --modes none,sync,sync_controller --threads 1 --copy-mb 0

Prints one JSON object on stdout: per mode, msgs/s, p50/p99 send latency (ms), broker CPU, plus
ratios to the no-slave baseline (and controller / master_slave SYNC).  Progress goes to stderr.
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
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from failover_bench import start_etcd, write_config

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


MODES = ("no_slave", "async", "sync", "sync_controller")


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (s), from /proc/<pid>/stat."""
    # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sync_set_size(addr: str) -> int:
    members = runtime_info(addr).get("controllerSyncSet", "")
    return len([m for m in members.split(",") if m])


def etcd_revision(url: str) -> int:
    """etcd's store revision: it grows by one per write transaction (lease renewals do not count)."""
    req = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=3) as rsp:
        return int(orjson.loads(rsp.read())["header"]["revision"])


def start_controller_group(
    args: argparse.Namespace, root: Path, ns: str, procs: list[Any]
) -> tuple[Proc, list[Proc], subprocess.Popen[bytes], str] | None:
    """etcd and ``--controller-replicas`` controller-mode SYNC_MASTER replicas; (master, slaves,
    etcd, its URL) once the master's in-sync set holds them all, or None when etcd is missing."""
    if shutil.which("etcd") is None:
        progress("  sync_controller skipped: the etcd binary is not installed (Debian package etcd-server)")
        return None
    etcd, etcd_url = start_etcd(root)
    # write_config reads the lease timing from an argparse namespace: failover_bench's defaults.
    lease = argparse.Namespace(ttl=2, keepalive=0.4, margin=0.6)
    replicas: list[Proc] = []
    try:
        for i in range(1, args.controller_replicas + 1):
            path, _ = write_config(root, i, ns, etcd_url, lease)
            replicas.append(Proc(["broker", "-c", str(path)], root / f"broker-{i}.log"))
            procs.append(replicas[-1])

        def masters() -> list[Proc]:
            return [r for r in replicas if runtime_info(r.address).get("controllerRole") == "SYNC_MASTER"]

        elected = wait_for(lambda: len(masters()) == 1, 60)
        master = masters()[0]
        progress(f"  master {master.address} elected after {elected:.2f} s")
        try:
            full = wait_for(lambda: sync_set_size(master.address) == len(replicas), 60)
        except TimeoutError:
            info = runtime_info(master.address)
            raise SystemExit(
                f"in-sync set stuck at {info.get('controllerSyncSet')!r} "
                f"(waiting for {info.get('controllerSyncRequired')!r}); logs in {root}"
            ) from None
        progress(f"  in-sync set {runtime_info(master.address)['controllerSyncSet']} after {full:.2f} s more")
    except BaseException:
        etcd.terminate()
        etcd.wait(10)
        raise
    return master, [r for r in replicas if r is not master], etcd, etcd_url


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any] | None:
    progress(f"mode {mode}")
    root.mkdir(parents=True)
    ns = Proc(["namesrv", "--listen", f"127.0.0.1:{free_port()}"], root / "namesrv.log")
    procs: list[Any] = [ns]
    etcd: subprocess.Popen[bytes] | None = None
    etcd_url = ""
    try:
        slaves: list[Proc] = []
        if mode == "sync_controller":
            group = start_controller_group(args, root, ns.address, procs)
            if group is None:
                return None
            master, slaves, etcd, etcd_url = group
        else:
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
                slaves.append(slave)
                wait_for(lambda: runtime_info(slave.address)["haMasterConnected"] == "true", 30)
        brokers = [master, *slaves]
        pids = [b.proc.pid for b in brokers]
        if etcd is not None:
            pids.append(etcd.pid)
        cpu_before = [cpu_seconds(pid) for pid in pids]
        rev_before = etcd_revision(etcd_url) if etcd_url else 0
        elapsed, lat, statuses = produce(ns.address, args.messages, args.threads, args.size)
        cpu = [round(cpu_seconds(pid) - before, 3) for pid, before in zip(pids, cpu_before, strict=True)]
        etcd_writes = etcd_revision(etcd_url) - rev_before if etcd_url else 0
        broker_cpu = sum(cpu[: len(brokers)])
        out: dict[str, Any] = {
            "messages": len(lat),
            "seconds": round(elapsed, 3),
            "msgs_per_s": round(len(lat) / elapsed, 1),
            "p50_ms": round(pct(lat, 0.50), 3),
            "p99_ms": round(pct(lat, 0.99), 3),
            "mean_ms": round(statistics.fmean(lat), 3) if lat else 0.0,
            "statuses": statuses,
            # Over the load only (the untimed first send included); master first, then slaves.
            "broker_cpu_s": cpu[: len(brokers)],
            "broker_cpu_total_s": round(broker_cpu, 3),
            "msgs_per_broker_cpu_s": round(len(lat) / broker_cpu, 1) if broker_cpu > 0 else None,
        }
        if etcd is not None:
            out["etcd_cpu_s"] = cpu[-1]
            # Offset reports and set changes only: no write per acknowledgement any more.
            out["etcd_writes"] = etcd_writes
            out["etcd_writes_per_s"] = round(etcd_writes / elapsed, 1)
            out["sync_set_after"] = runtime_info(master.address).get("controllerSyncSet", "")
        if slaves:
            end = runtime_info(master.address)["commitLogMaxOffset"]
            out["slave_catch_up_s"] = round(
                wait_for(lambda: all(runtime_info(s.address)["commitLogMaxOffset"] == end for s in slaves)),
                3,
            )
        progress(f"  {json.dumps(out)}")
        return out
    finally:
        for p in reversed(procs):
            p.stop()
        if etcd is not None:
            etcd.terminate()
            etcd.wait(10)


def ratio(a: float, b: float) -> float:
    return round(a / max(b, 1e-9), 3)


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


def parse_modes(text: str) -> list[str]:
    modes = [{"none": "no_slave"}.get(m.strip(), m.strip()) for m in text.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise argparse.ArgumentTypeError(f"unknown mode {m!r}; choose from none, {', '.join(MODES)}")
    return modes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--compression", choices=("none", "lz4", "zstd"), default="none")
    ap.add_argument(
        "--modes",
        type=parse_modes,
        default=["no_slave", "async", "sync"],
        help="comma-separated, run in this order: none (= no_slave), async, sync, sync_controller",
    )
    ap.add_argument(
        "--controller-replicas",
        type=int,
        default=3,
        help="replicas of the sync_controller group (default 3; 2 matches sync's master + 1 slave)",
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, data); path on stderr"
    )
    ap.add_argument(
        "--copy-mb", type=int, default=24, help="commit-log size for the replication copy test (0: skip it)"
    )
    args = ap.parse_args()
    if args.controller_replicas < 2:
        ap.error("--controller-replicas: at least 2 (a SYNC group needs a slave)")
    root = Path(tempfile.mkdtemp(prefix="tidemq-ha-bench-"))
    try:
        ran = {m: run_mode(m, args, root / m) for m in args.modes}
        results = {m: r for m, r in ran.items() if r is not None}
        copies = {}
        if args.copy_mb > 0:
            for codec in ("none", "lz4", "zstd"):
                progress(f"replication copy, compression {codec}")
                copies[codec] = replication_throughput(root, args.copy_mb, codec)
    finally:
        if args.keep:
            progress(f"logs and data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    ratios: dict[str, Any] = {}
    pairs = [(m, "no_slave") for m in ("async", "sync", "sync_controller")]
    pairs += [("sync", "async"), ("sync_controller", "sync")]
    for a, b in pairs:
        if a in results and b in results:
            ra, rb = results[a], results[b]
            ratios[f"{a}_vs_{b}"] = {
                "throughput": ratio(ra["msgs_per_s"], rb["msgs_per_s"]),
                "p50_latency": ratio(ra["p50_ms"], rb["p50_ms"]),
                "p99_latency": ratio(ra["p99_ms"], rb["p99_ms"]),
                "msgs_per_broker_cpu_s": ratio(
                    ra["msgs_per_broker_cpu_s"] or 0.0, rb["msgs_per_broker_cpu_s"] or 0.0
                ),
            }
    if copies:
        ratios["replication_lz4_vs_none"] = ratio(copies["lz4"]["mb_per_s"], copies["none"]["mb_per_s"])
        ratios["replication_zstd_vs_none"] = ratio(copies["zstd"]["mb_per_s"], copies["none"]["mb_per_s"])
    print(
        json.dumps(
            {
                "params": vars(args),
                "skipped": [m for m, r in ran.items() if r is None],
                "results": results,
                "replication_copy": copies,
                "ratios": ratios,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
