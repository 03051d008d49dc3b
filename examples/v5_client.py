"""Send with Apache RocketMQ 5's official Python client over tidemq's gRPC endpoint.

    # a broker with the gRPC endpoint on (its TOML file has a [transport.grpc] table):
    #   [transport.grpc]
    #   listen = "127.0.0.1:8081"
    python examples/v5_client.py                      # against 127.0.0.1:8081
    python examples/v5_client.py --endpoints 10.0.0.5:8081 --topic orders

The v5 client (``pip install rocketmq-python-client==5.1.2``) installs a top-level ``rocketmq``
package, as ``rocketmq==0.4.4`` does: run this in a virtual environment of its own, not in
tidemq's.  It sends one message synchronously and one asynchronously, as the client's README
shows; a 4.x consumer (``examples/official_client.py``) reads them.  Receiving with the v5
SimpleConsumer or PushConsumer needs the POP engine, which tidemq does not have yet.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description="send two messages with the RocketMQ 5 Python client")
    ap.add_argument("--endpoints", default="127.0.0.1:8081", help="the broker's gRPC address")
    ap.add_argument("--topic", default="orders")
    args = ap.parse_args()
    try:
        from rocketmq import ClientConfiguration, Credentials, Message, Producer
    except ImportError:
        sys.exit("v5_client.py: pip install rocketmq-python-client==5.1.2 (in a venv of its own)")

    config = ClientConfiguration(args.endpoints, Credentials())
    producer = Producer(config, (args.topic,))
    producer.startup()
    try:
        msg = Message()
        msg.topic = args.topic
        msg.body = b"hello from a RocketMQ 5 client"
        msg.tag = "v5"
        msg.keys = "order-1"
        msg.add_property("send", "sync")
        receipt = producer.send(msg)
        print(f"sync send: message id {receipt.message_id}, offset {receipt.offset}")

        msg = Message()
        msg.topic = args.topic
        msg.body = b"hello again, asynchronously"
        msg.tag = "v5"
        msg.add_property("send", "async")
        receipt = producer.send_async(msg).result(timeout=10)
        print(f"async send: message id {receipt.message_id}, offset {receipt.offset}")
    finally:
        producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
