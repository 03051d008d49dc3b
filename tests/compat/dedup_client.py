"""The official RocketMQ client (``rocketmq==0.4.4``) producing for the duplicate-window tests.

    python dedup_client.py --namesrv ADDR --topic T --count N [--prefix P] [--timeout MS] [--tries K]

Sends messages ``<prefix>-0`` .. ``<prefix>-<N-1>`` with ``send_sync``; a send that raises is sent
again (the same Message object, up to ``--tries`` times) as an application would.  Prints one JSON
line per acknowledged message (``i``, ``msg_id``, ``offset``, ``status``) and one per message
given up on (``failed``), then ``{"done": true}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--prefix", default="dd")
    p.add_argument("--group", default="DEDUP_PRODUCER")
    p.add_argument("--timeout", type=int, default=3000, help="send timeout, ms")
    p.add_argument("--tries", type=int, default=20, help="sends of one message before giving up")
    args = p.parse_args(argv)
    from rocketmq.client import Message, Producer

    producer = Producer(args.group, timeout=args.timeout)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    try:
        for i in range(args.start, args.start + args.count):
            msg = Message(args.topic)
            msg.set_body(f"{args.prefix}-{i}")
            msg.set_keys(f"{args.prefix}-{i}")
            for attempt in range(args.tries):
                try:
                    r = producer.send_sync(msg)
                except Exception as exc:  # the broker went away, or its answer did
                    print(json.dumps({"i": i, "error": str(exc)[:200], "attempt": attempt}), flush=True)
                    time.sleep(0.2)
                    continue
                ack = {
                    "p": args.prefix,
                    "i": i,
                    "status": int(r.status),
                    "msg_id": r.msg_id,
                    "offset": r.offset,
                }
                print(json.dumps(ack), flush=True)
                break
            else:
                print(json.dumps({"i": i, "failed": True}), flush=True)
        print(json.dumps({"done": True}), flush=True)
    finally:
        producer.shutdown()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
