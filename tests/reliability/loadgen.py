"""Load generator with per-message acknowledgements: ``python loadgen.py --namesrv ... --topic ...``.

Every acknowledged send is one stdout line, written and flushed once the broker answered
SEND_OK::

    ACK <ack time ms> <queue id> <queue offset> <msg id (UNIQ_KEY)> <offset msg id> <body digest>

A line cut short by a kill was never a whole acknowledgement; readers drop it.  Failed sends go
to stderr as counts.  Runs until ``--count`` messages are acknowledged or it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import sys
import time

from tidemq.client import Message, Producer, SendStatus


def body_for(rnd: int, task: int, seq: int, size: int) -> bytes:
    head = b"r%d-t%d-s%d|" % (rnd, task, seq)
    # Varying lengths so records straddle file ends at many different positions.
    filler = hashlib.blake2b(head).digest() * (1 + (seq * 7919 + task * 104729) % max(1, size // 64))
    return head + filler[: max(0, size - len(head) + (seq % 97))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--count", type=int, default=0, help="stop after this many acks (0: never)")
    ap.add_argument("--size", type=int, default=300)
    ap.add_argument("--group", default="")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    out = sys.stdout
    acked = 0
    failed = 0
    done = asyncio.Event()
    producer = Producer(args.group or f"loadgen-{os.getpid()}", args.namesrv, retry_times=0, send_timeout=3.0)
    await producer.start()
    out.write("START\n")
    out.flush()

    async def worker(task: int) -> None:
        nonlocal acked, failed
        seq = 0
        while not done.is_set():
            body = body_for(args.round, task, seq, args.size)
            msg = Message(args.topic, body, tags=f"T{seq % 5}", keys=f"k{args.round}-{task}-{seq}")
            seq += 1
            try:
                r = await producer.send(msg)
            except Exception as exc:  # the broker is being killed: count and go on
                failed += 1
                if failed % 50 == 1:
                    print(f"send failed ({failed}): {exc}", file=sys.stderr, flush=True)
                await asyncio.sleep(0.05)
                continue
            if r.status is not SendStatus.SEND_OK:
                failed += 1
                continue
            out.write(
                f"ACK {time.time_ns() // 1_000_000} {r.queue.queue_id} {r.queue_offset} {r.msg_id} "
                f"{r.offset_msg_id} {hashlib.blake2b(body, digest_size=8).hexdigest()}\n"
            )
            out.flush()
            acked += 1
            if args.count and acked >= args.count:
                done.set()

    await asyncio.gather(*(worker(t) for t in range(args.concurrency)))
    await producer.shutdown()
    print(f"acked {acked} failed {failed}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
