"""Apache RocketMQ 5's official Python client against tidemq's gRPC endpoint: send, then receive
and acknowledge with a SimpleConsumer.

    tidemq standalone                                 # serves gRPC on 127.0.0.1:8081
    python examples/v5_client.py                      # in the v5 client's own venv (below)
    python examples/v5_client.py --endpoints 10.0.0.5:8081 --topic orders --no-receive

The v5 client (``pip install rocketmq-python-client==5.1.2``) installs a top-level ``rocketmq``
package, as ``rocketmq==0.4.4`` does: run this in a virtual environment of its own, not in
tidemq's (README's Quick start).  It sends one message synchronously and one asynchronously, as
the client's README shows, then a SimpleConsumer of group ``--group`` receives them and acks
each (``--no-receive`` stops after the sends; a 4.x consumer, ``examples/official_client.py``,
reads them too).  With ``--ak``/``--sk`` the client signs its calls for a broker with ACL.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description="send and receive with the RocketMQ 5 Python client")
    ap.add_argument("--endpoints", default="127.0.0.1:8081", help="the broker's gRPC address")
    ap.add_argument("--topic", default="orders")
    ap.add_argument("--group", default="v5-example-consumers", help="the SimpleConsumer's group")
    ap.add_argument("--no-receive", action="store_true", help="only send")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the messages")
    ap.add_argument("--ak", default="", help="access key (a broker with ACL)")
    ap.add_argument("--sk", default="", help="secret key")
    args = ap.parse_args()
    try:
        from rocketmq import (
            ClientConfiguration,
            Credentials,
            FilterExpression,
            Message,
            Producer,
            SimpleConsumer,
        )
    except ImportError:
        sys.exit("v5_client.py: pip install rocketmq-python-client==5.1.2 (in a venv of its own)")

    config = ClientConfiguration(args.endpoints, Credentials(args.ak, args.sk))
    producer = Producer(config, (args.topic,))
    producer.startup()
    sent = set()
    try:
        msg = Message()
        msg.topic = args.topic
        msg.body = b"hello from a RocketMQ 5 client"
        msg.tag = "v5"
        msg.keys = "order-1"
        msg.add_property("send", "sync")
        receipt = producer.send(msg)
        sent.add(receipt.message_id)
        print(f"sync send: message id {receipt.message_id}, offset {receipt.offset}", flush=True)

        msg = Message()
        msg.topic = args.topic
        msg.body = b"hello again, asynchronously"
        msg.tag = "v5"
        msg.add_property("send", "async")
        receipt = producer.send_async(msg).result(timeout=10)
        sent.add(receipt.message_id)
        print(f"async send: message id {receipt.message_id}, offset {receipt.offset}", flush=True)
    finally:
        producer.shutdown()
    if args.no_receive:
        return 0

    consumer = SimpleConsumer(config, args.group, {args.topic: FilterExpression("v5")}, await_duration=5)
    consumer.startup()
    try:
        deadline = time.monotonic() + args.timeout
        while sent and time.monotonic() < deadline:
            try:
                messages = consumer.receive(16, 15)  # up to 16, invisible for 15 s until acked
            except Exception as exc:
                print(f"receive failed: {type(exc).__name__}: {exc}", flush=True)
                return 1
            for message in messages:
                consumer.ack(message)
                sent.discard(message.message_id)
                print(f"received and acked: {message.message_id} {message.body.decode()!r}", flush=True)
    finally:
        consumer.shutdown()
    if sent:
        print(f"not received within {args.timeout} s: {sorted(sent)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
