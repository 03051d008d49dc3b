"""A produce/consume round trip with Apache RocketMQ's official Python client (``rocketmq==0.4.4``).

    python examples/official_client.py                       # against `tidemq standalone`
    python examples/official_client.py --namesrv "127.0.0.1:9876;127.0.0.1:9877"

Needs the ``compat`` extra (``pip install -e '.[compat]'``; the README's set-up command installs
it).  Sends one message to topic ``orders`` (auto-created by the broker), then consumes the topic
with a push consumer until that message arrives.
"""

from __future__ import annotations

import argparse
import sys
import threading


def main() -> int:
    ap = argparse.ArgumentParser(description="send one message and consume it with the official client")
    ap.add_argument("--namesrv", default="127.0.0.1:9876", help="NameServer address(es), ';'-separated")
    ap.add_argument("--topic", default="orders")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the message")
    args = ap.parse_args()
    try:
        from rocketmq.client import Message, Producer, PushConsumer
    except ImportError:
        sys.exit("official_client.py: the official client is not installed: pip install -e '.[compat]'")

    producer = Producer("example-producers")
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    try:
        msg = Message(args.topic)
        msg.set_keys("order-1")
        msg.set_tags("created")
        msg.set_body(b"hello from the official client")
        sent = producer.send_sync(msg)
    finally:
        producer.shutdown()
    print(f"sent {sent.msg_id} to {args.topic}")

    arrived = threading.Event()

    def on_message(received) -> None:  # noqa: ANN001 - rocketmq.client.RecvMessage
        print(f"received {received.id} tags={received.tags.decode()} body={received.body.decode()}")
        if received.id == sent.msg_id:
            arrived.set()

    consumer = PushConsumer("example-consumers")
    consumer.set_namesrv_addr(args.namesrv)
    consumer.subscribe(args.topic, on_message)
    consumer.start()
    try:
        if not arrived.wait(args.timeout):
            print(f"message {sent.msg_id} not received within {args.timeout:g} s", file=sys.stderr)
            return 1
    finally:
        consumer.shutdown()
    print("round trip OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
