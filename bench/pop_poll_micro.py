"""In-process: CPU time per POP that finds a message, with a long poll (pollTime 1000) and without.

A/B: run it with this tree, then with PYTHONPATH=<old tree>; prints one JSON line (microseconds per
pop, each poll setting measured twice, the first round warms up).
"""

import asyncio
import json
import sys
import tempfile
import time

from tidemq.broker import Broker
from tidemq.config import compose, parse_config
from tidemq.message import MessageInner
from tidemq.remoting.protocol import TopicConfig


async def main(n: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        raw = {"broker": {"name": "b", "listen": "127.0.0.1:0", "namesrv": [], "data_dir": d}}
        b = Broker(compose(parse_config(raw)))
        b.topics.update(TopicConfig("T", read_queue_nums=1, write_queue_nums=1))
        await b.start()
        try:
            futs = [
                b.store.put_message(
                    MessageInner("T", b"x" * 128, 0, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2))
                )
                for _ in range(n * 2 * 4)
            ]
            for f in futs:
                f.result(30)
            out = {}
            for poll in (1000, 0, 1000, 0):
                t0 = time.process_time()
                for _ in range(n):
                    r = await b.pop.pop("G", "T", max_nums=1, invisible_ms=60_000, poll_ms=poll)
                    assert r.found
                out.setdefault(f"poll{poll}_us", []).append(round((time.process_time() - t0) / n * 1e6, 2))
            return out
        finally:
            await b.stop()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000))))
