"""Consumer scenarios of the official RocketMQ 5 Python client (PyPI ``rocketmq-python-client``),
written as its README shows them; prints JSON lines.  It runs in the client's own virtual
environment, started by tests/compat/test_grpc_official_consume.py.

    python v5_consume_client.py simple --endpoints E --topic T --group G --count N [--mode M]
    python v5_consume_client.py push --endpoints E --topic T --group G --count N [--fail-first]
    python v5_consume_client.py produce --endpoints E --topic T --count N [--groups g1,g2]
    python v5_consume_client.py recall --endpoints E --topic T --delay S

``simple`` modes: ``ack`` (receive and ack until N messages), ``redeliver`` (one message left
unacknowledged comes back after its invisible time), ``change`` (one message's invisible time
shortened with change_invisible_duration comes back early), ``dlq`` (receive, never ack, for
``--wait`` seconds, or ``--grace`` seconds after ``--deliveries`` deliveries); with ``--pause`` it prints ``{"paused": ...}`` after its first messages and
waits for a line on stdin (the test looks at the broker meanwhile).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any


def line(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def record(msg: Any, **extra: Any) -> dict[str, Any]:
    return {
        "body": msg.body.decode(),
        "message_id": msg.message_id,
        "topic": msg.topic,
        "tag": msg.tag,
        "keys": sorted(msg.keys),
        "props": dict(msg.properties),
        "attempt": msg.delivery_attempt,
        "group": msg.message_group,
        "t": round(time.monotonic(), 3),
        **extra,
    }


def simple(args: argparse.Namespace) -> None:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    config = ClientConfiguration(args.endpoints, Credentials())
    consumer = SimpleConsumer(
        config, args.group, {args.topic: FilterExpression(args.tag)}, await_duration=args.poll
    )
    consumer.startup()
    try:
        deadline = time.monotonic() + args.wait
        if args.mode == "ack":
            got = 0
            paused = False
            while got < args.count and time.monotonic() < deadline:
                for msg in consumer.receive(16, args.invisible):
                    line(**record(msg))
                    consumer.ack(msg)
                    got += 1
                if args.pause and got and not paused:
                    paused = True
                    line(paused=got, client_id=consumer.client_id)
                    sys.stdin.readline()
        elif args.mode in ("redeliver", "change"):
            first = None
            while first is None and time.monotonic() < deadline:
                received = consumer.receive(1, args.invisible)
                first = received[0] if received else None
            assert first is not None, "nothing received"
            line(**record(first, step="first"))
            if args.mode == "change":
                consumer.change_invisible_duration(first, 1)
                line(changed=round(time.monotonic(), 3))
            again = None
            while again is None and time.monotonic() < deadline:
                for msg in consumer.receive(1, args.invisible):
                    if msg.message_id == first.message_id:
                        again = msg
                    else:
                        consumer.ack(msg)
            assert again is not None, "the message never came back"
            line(**record(again, step="again"))
            consumer.ack(again)
            line(acked=again.message_id)
        elif args.mode == "dlq":
            seen = 0
            while time.monotonic() < deadline:
                for msg in consumer.receive(16, args.invisible):
                    line(**record(msg))  # never acknowledged
                    seen += 1
                    if seen == args.deliveries:  # listen ``--grace`` more seconds for one too many
                        deadline = min(deadline, time.monotonic() + args.grace)
    finally:
        consumer.shutdown()


def bench_receive(args: argparse.Namespace) -> None:
    """bench/grpc_bench.py --workload receive: ready, go, receive and ack ``--count`` messages."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    config = ClientConfiguration(args.endpoints, Credentials())
    consumer = SimpleConsumer(config, args.group, {args.topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        started, got, idle = time.monotonic(), 0, 0
        while got < args.count and idle < 5:
            msgs = consumer.receive(32, 30)
            idle = 0 if msgs else idle + 1
            for msg in msgs:
                consumer.ack(msg)
            got += len(msgs)
        line(sent=got, failed=args.count - got, seconds=time.monotonic() - started)
        sys.stdin.readline()
    finally:
        consumer.shutdown()


def push(args: argparse.Namespace) -> None:
    from rocketmq import (
        ClientConfiguration,
        ConsumeResult,
        Credentials,
        FilterExpression,
        MessageListener,
        PushConsumer,
    )

    done = threading.Event()
    succeeded: set[str] = set()
    failed: set[str] = set()
    lock = threading.Lock()

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            body = message.body.decode()
            with lock:
                if args.fail_first and body.endswith("-0") and body not in failed:
                    failed.add(body)
                    line(**record(message, result="failure"))
                    return ConsumeResult.FAILURE
                line(**record(message, result="success"))
                succeeded.add(body)
                if len(succeeded) >= args.count:
                    done.set()
            if args.slow:
                time.sleep(args.slow)
            return ConsumeResult.SUCCESS

    config = ClientConfiguration(args.endpoints, Credentials())
    consumer = PushConsumer(config, args.group, Listener(), {args.topic: FilterExpression(args.tag)})
    consumer.startup()
    line(started=True, fifo=consumer.fifo)
    try:
        done.wait(args.wait)
        time.sleep(1)  # let the last acks reach the broker
    finally:
        consumer.shutdown()
    line(complete=done.is_set(), succeeded=len(succeeded))


def produce(args: argparse.Namespace) -> None:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(args.endpoints, Credentials()), (args.topic,))
    producer.startup()
    groups = [g for g in args.groups.split(",") if g]
    try:
        for i in range(args.count):
            msg = Message()
            msg.topic = args.topic
            group = groups[i % len(groups)] if groups else ""
            msg.body = f"{group or args.prefix}-{i // max(len(groups), 1)}".encode()
            msg.tag = "TagA" if i % 2 == 0 else "TagB"
            msg.keys = f"key-{i}"
            msg.add_property("idx", str(i))
            if group:
                msg.message_group = group
            receipt = producer.send(msg)
            line(i=i, message_id=receipt.message_id, body=msg.body.decode())
    finally:
        producer.shutdown()


def recall(args: argparse.Namespace) -> None:
    """Two timer messages due in ``--delay`` seconds; the second recalled with its handle."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(args.endpoints, Credentials()), (args.topic,))
    producer.startup()
    try:
        due = int(time.time() + args.delay)  # the client takes seconds (Timestamp.seconds)
        receipts = []
        for body in ("kept", "recalled"):
            msg = Message()
            msg.topic = args.topic
            msg.body = body.encode()
            msg.delivery_timestamp = due
            receipts.append(producer.send(msg))
        handle = receipts[1].recall_handle
        recalled = producer.recall_message(args.topic, handle)
        line(
            due_ms=due * 1000,
            kept=receipts[0].message_id,
            recalled=receipts[1].message_id,
            handle=handle,
            recalled_id=recalled,
        )
    finally:
        producer.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["simple", "push", "produce", "recall", "bench-receive"])
    p.add_argument("--endpoints", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--mode", default="ack", choices=["ack", "redeliver", "change", "dlq"])
    p.add_argument("--tag", default="*")
    p.add_argument("--invisible", type=int, default=15, help="simple: invisible duration, seconds")
    p.add_argument("--poll", type=int, default=2, help="simple: await_duration (long polling), seconds")
    p.add_argument("--wait", type=float, default=60.0)
    p.add_argument("--pause", action="store_true")
    p.add_argument(
        "--deliveries", type=int, default=0, help="simple dlq: stop --grace seconds after this many"
    )
    p.add_argument("--grace", type=float, default=0.0, help="simple dlq: see --deliveries")
    p.add_argument("--fail-first", action="store_true", help="push: the first delivery of *-0 fails")
    p.add_argument("--slow", type=float, default=0.0, help="push: seconds each message takes")
    p.add_argument("--groups", default="", help="produce: message groups, round robin (FIFO)")
    p.add_argument("--prefix", default="v5")
    p.add_argument("--delay", type=float, default=5.0, help="recall: seconds until the messages are due")
    args = p.parse_args()
    scenarios = {
        "simple": simple,
        "push": push,
        "produce": produce,
        "recall": recall,
        "bench-receive": bench_receive,
    }
    scenarios[args.scenario](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
