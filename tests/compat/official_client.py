"""Runs one scenario of the official RocketMQ client (PyPI ``rocketmq==0.4.4``) and prints JSON.

The client is a C++ library loaded with ctypes; running it in its own process keeps a client
crash or hang from taking pytest down and gives it its own HOME (it writes ~/logs/rocketmq-cpp).

    python official_client.py produce --namesrv ADDR --topic T --count N [--mode sync|oneway|orderly|batch]
    python official_client.py push --namesrv ADDR --topic T --group G --count N [--broadcast] [--orderly]
    python official_client.py pull --namesrv ADDR --topic T --group G --count N

``produce`` prints one JSON object per message sent; ``push``/``pull`` print ``ready`` when
started, then one JSON line with every message received.  Message i has body ``<prefix>-i``,
keys ``key-i shared``, tag ``TagA``/``TagB`` by parity and properties ``idx=i``, ``color=blue``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any


def message_fields(prefix: str, i: int) -> dict[str, Any]:
    return {
        "body": f"{prefix}-{i}",
        "keys": f"key-{i} shared",
        "tags": "TagA" if i % 2 == 0 else "TagB",
        "props": {"idx": str(i), "color": "blue"},
    }


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value or "")


def produce(args: argparse.Namespace) -> None:
    from rocketmq.client import Message, Producer

    producer = Producer(args.group or "COMPAT_PRODUCER", timeout=5000)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    try:
        batch = []
        for i in range(args.start, args.start + args.count):
            f = message_fields(args.prefix, i)
            msg = Message(args.topic)
            msg.set_body(f["body"])
            msg.set_keys(f["keys"])
            msg.set_tags(f["tags"])
            for k, v in f["props"].items():
                msg.set_property(k, v)
            if args.mode == "sync":
                r = producer.send_sync(msg)
                print(
                    json.dumps({"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}),
                    flush=True,
                )
            elif args.mode == "oneway":
                producer.send_oneway(msg)
                print(json.dumps({"i": i}), flush=True)
            elif args.mode == "orderly":
                r = producer.send_orderly(msg, i % args.orders)  # the arg picks the queue (arg % queues)
                print(
                    json.dumps({"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}),
                    flush=True,
                )
            elif args.mode == "batch":
                batch.append(msg)
        if batch:
            r = producer.send_batch(batch)
            print(json.dumps({"batch": len(batch), "status": int(r.status), "msg_id": r.msg_id}), flush=True)
        if args.mode == "oneway":
            time.sleep(1.0)  # oneway sends are queued in the client; let them leave before shutdown
    finally:
        producer.shutdown()


def _record(msg: Any) -> dict[str, Any]:
    return {
        "body": _text(msg.body),
        "keys": _text(msg.keys),
        "tags": _text(msg.tags),
        "topic": msg.topic,
        "props": {k: _text(msg.get_property(k)) for k in ("idx", "color")},
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "reconsume_times": msg.reconsume_times,
        "id": msg.id,
    }


def push(args: argparse.Namespace) -> None:
    from rocketmq.client import PushConsumer
    from rocketmq.ffi import MessageModel

    model = MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING
    consumer = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_thread_count(2)
    received: list[dict[str, Any]] = []
    lock = threading.Lock()
    enough = threading.Event()
    failures = {"left": args.fail_first}

    def on_message(msg: Any) -> None:
        rec = _record(msg)
        with lock:
            if failures["left"] > 0 and rec["reconsume_times"] == 0:
                failures["left"] -= 1
                raise RuntimeError("fail on purpose: the broker must redeliver through %RETRY%")
            received.append(rec)
            if len({r["body"] for r in received}) >= args.count:
                enough.set()

    # SIGUSR1 ends the linger early: a test done with the live consumer need not wait it out.
    done_early = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: done_early.set())
    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    print("ready", flush=True)
    enough.wait(args.timeout)
    done_early.wait(args.linger)  # catch duplicates or messages beyond the expected ones
    with lock:
        result = json.dumps({"received": received, "complete": enough.is_set()})
    # Report before shutdown: rocketmq-client-cpp sometimes aborts inside shutdown() with
    # boost::thread_interrupted (apache/rocketmq-client-cpp#335, #411), after the work is done.
    print(result, flush=True)
    consumer.shutdown()


def pull(args: argparse.Namespace) -> None:
    from rocketmq.client import PullConsumer

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    print("ready", flush=True)
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline and len(received) < args.count:
            for msg in consumer.pull(args.topic, args.expression):
                received.append(_record(msg))
            if len(received) < args.count:
                time.sleep(0.2)
        print(json.dumps({"received": received, "complete": len(received) >= args.count}), flush=True)
    finally:
        consumer.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["produce", "push", "pull"])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--prefix", default="msg")
    p.add_argument("--mode", default="sync", choices=["sync", "oneway", "orderly", "batch"])
    p.add_argument("--orders", type=int, default=3)
    p.add_argument("--broadcast", action="store_true")
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--expression", default="*")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--linger", type=float, default=1.0)
    p.add_argument("--fail-first", type=int, default=0, help="push: fail this many first deliveries")
    args = p.parse_args(argv)
    {"produce": produce, "push": push, "pull": pull}[args.scenario](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
