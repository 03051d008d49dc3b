"""Probe: does tidemq cause the official C++ client's "GetTransport ... timed_mutex timeout"?

Runs the e2e benchmark's official-client produce phase (``rocketmq==0.4.4``, several sender
threads) through a recording TCP proxy placed in front of the NameServer and of the broker (the
broker advertises the proxy's address, so the client reaches it only through the proxy).  The
proxy timestamps every frame and matches responses to requests by opaque, so it shows from the
wire, without touching either side, whether tidemq answered every request and how fast, and how
many connections the client opened.  The client's own log (~/logs/rocketmq-cpp/<pid>_*) is then
searched for the lock-timeout errors.

    python bench/cpp_client_probe.py [--messages 20000] [--producers 4] [--oneway]

Prints one JSON object on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop

from tidemq.remoting import FrameDecoder


def log(msg: str) -> None:
    print(f"[cpp_client_probe] {msg}", file=sys.stderr, flush=True)


class Recorder:
    """Request/response timing seen on the wire, per proxied service."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.connections = 0
        self.pending: dict[tuple[int, int], tuple[float, int]] = {}  # (conn, opaque) -> (t, code)
        self.latencies: dict[int, list[float]] = {}
        self.requests: dict[int, int] = {}
        self.oneway: dict[int, int] = {}
        self.errors: dict[int, int] = {}

    def request(self, conn: int, code: int, opaque: int, oneway: bool) -> None:
        self.requests[code] = self.requests.get(code, 0) + 1
        if oneway:
            self.oneway[code] = self.oneway.get(code, 0) + 1
        else:
            self.pending[(conn, opaque)] = (time.monotonic(), code)

    def response(self, conn: int, opaque: int, resp_code: int) -> None:
        hit = self.pending.pop((conn, opaque), None)
        if hit is None:
            return
        t, code = hit
        self.latencies.setdefault(code, []).append((time.monotonic() - t) * 1000)
        if resp_code != 0:
            self.errors[resp_code] = self.errors.get(resp_code, 0) + 1

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"connections_accepted": self.connections, "by_request_code": {}}
        for code, n in sorted(self.requests.items()):
            lat = sorted(self.latencies.get(code, []))
            row: dict[str, Any] = {"requests": n, "oneway": self.oneway.get(code, 0), "answered": len(lat)}
            if lat:
                row.update(
                    p50_ms=round(lat[len(lat) // 2], 2),
                    p99_ms=round(lat[min(len(lat) - 1, len(lat) * 99 // 100)], 2),
                    max_ms=round(lat[-1], 2),
                )
            out["by_request_code"][str(code)] = row
        out["unanswered"] = len(self.pending)
        out["error_responses"] = {str(k): v for k, v in self.errors.items()}
        return out


async def proxy(listen_port: int, target: tuple[str, int], rec: Recorder) -> asyncio.AbstractServer:
    counter = [0]

    async def pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: int, upstream: bool
    ) -> None:
        dec = FrameDecoder(64 * 1024 * 1024)
        try:
            while data := await reader.read(256 * 1024):
                writer.write(data)
                try:
                    cmds = dec.feed(data)
                except Exception:
                    cmds = []
                for c in cmds:
                    if upstream and not c.flag & 1:
                        rec.request(conn, c.code, c.opaque, bool(c.flag & 2))
                    elif not upstream and c.flag & 1:
                        rec.response(conn, c.opaque, c.code)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        counter[0] += 1
        rec.connections += 1
        conn = counter[0]
        sreader, swriter = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(creader, swriter, conn, True), pipe(sreader, cwriter, conn, False))

    return await asyncio.start_server(handle, "127.0.0.1", listen_port)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--oneway", action="store_true")
    ap.add_argument("--direct", action="store_true", help="no proxy (the client talks to tidemq itself)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from e2e_bench import produce

    work = Path(tempfile.mkdtemp(prefix="tidemq-cpp-probe-"))
    ns_port, broker_port, ns_proxy, broker_proxy = (free_port() for _ in range(4))
    recs = {"namesrv": Recorder("namesrv"), "broker": Recorder("broker")}
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    procs = []
    try:
        procs.append(start(["namesrv", "--listen", f"127.0.0.1:{ns_port}"], work))
        advertise = f"127.0.0.1:{broker_port if args.direct else broker_proxy}"
        cfg = work / "broker.toml"
        cfg.write_text(
            f'[broker]\nlisten = "127.0.0.1:{broker_port}"\nadvertise = "{advertise}"\n'
            f'namesrv = ["127.0.0.1:{ns_port}"]\ndata_dir = "{work / "store"}"\n'
        )
        procs.append(start(["broker", "-c", str(cfg)], work))
        if not args.direct:
            for port, target, rec in (
                (ns_proxy, ns_port, recs["namesrv"]),
                (broker_proxy, broker_port, recs["broker"]),
            ):
                asyncio.run_coroutine_threadsafe(proxy(port, ("127.0.0.1", target), rec), loop).result(10)
        namesrv = f"127.0.0.1:{ns_port if args.direct else ns_proxy}"
        topic = "ProbeTopic"
        from rocketmq.client import Message, Producer

        p = Producer("PROBE_WARM")
        p.set_namesrv_addr(namesrv)
        p.start()
        m = Message(topic)
        m.set_body(b"warm")
        p.send_sync(m)
        p.shutdown()
        time.sleep(1)
        log(f"producing {args.messages} messages from {args.producers} threads (oneway={args.oneway})")
        t0 = time.time()
        sent, elapsed, troubles = produce(
            namesrv, topic, args.messages, args.size, args.producers, args.oneway
        )
        time.sleep(1)
        logs = sorted(Path.home().glob(f"logs/rocketmq-cpp/{os.getpid()}_*"))
        lines = [ln for p in logs for ln in p.read_text(errors="replace").splitlines()]
        lock_timeouts = [ln for ln in lines if "timed_mutex timeout" in ln]
        result = {
            "messages": args.messages,
            "producers": args.producers,
            "oneway": args.oneway,
            "proxied": not args.direct,
            "seconds": round(elapsed, 2),
            "client_send_retries_or_failures": troubles,
            "client_log_lock_timeouts": len(lock_timeouts),
            "client_log_lock_timeout_examples": lock_timeouts[:3],
            "client_log_errors": sum(1 for ln in lines if "ERROR" in ln),
            "started_at": t0,
            **({} if args.direct else {k: r.summary() for k, r in recs.items()}),
        }
        print(json.dumps(result, indent=2))
    finally:
        for proc in reversed(procs):
            stop(proc)
        loop.call_soon_threadsafe(loop.stop)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
