"""Loopback request rate of the tcp transport (client and server in one process).

Prints JSON: requests/s for a few concurrency levels, on uvloop and on asyncio's loop, and their
ratio.  Run: ``python bench/transport_bench.py [--n 20000] [--body 128]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tidemq.remoting import RemotingCommand
from tidemq_transport_tcp import TcpTransport, uvloop_available


async def measure(n: int, concurrency: int, body: bytes) -> float:
    async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
        return req.reply(ext_fields={"queueOffset": 1}, body=req.body)

    transport = TcpTransport()
    server = transport.server("127.0.0.1", 0, handler)
    await server.start()
    address = "{}:{}".format(*server.address)
    client = transport.client()
    await client.invoke(address, RemotingCommand.request(10), 5)
    per_worker = n // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            await client.invoke(address, RemotingCommand.request(310, {"topic": "T", "queueId": 0}, body), 10)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await client.close()
    await server.stop()
    return per_worker * concurrency / elapsed


def run_on(loop_factory: Any, n: int, body: bytes) -> dict[str, int]:
    out = {}
    for conc in (1, 16, 128):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            out[f"concurrency_{conc}"] = round(runner.run(measure(n if conc > 1 else n // 4, conc, body)))
        print(f"  concurrency {conc}: {out[f'concurrency_{conc}']} req/s", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--body", type=int, default=128, help="request and response body bytes")
    args = ap.parse_args()
    body = b"b" * args.body
    results: dict[str, Any] = {}
    print("asyncio loop:", file=sys.stderr)
    results["asyncio"] = run_on(asyncio.new_event_loop, args.n, body)
    if uvloop_available():
        import uvloop

        print("uvloop:", file=sys.stderr)
        results["uvloop"] = run_on(uvloop.new_event_loop, args.n, body)
        results["uvloop_over_asyncio_c128"] = round(
            results["uvloop"]["concurrency_128"] / results["asyncio"]["concurrency_128"], 3
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
