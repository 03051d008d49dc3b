"""Runs one scenario of the official RocketMQ 5 Python client (PyPI ``rocketmq-python-client``)
and prints JSON lines.  It runs in the client's own virtual environment (its top-level
``rocketmq`` package is not ``rocketmq==0.4.4``'s), started by tests/compat/test_grpc_official.py.

    python v5_client.py produce --endpoints HOST:PORT --topic T --count N [--prefix P] [--message-group G]
    python v5_client.py transaction --endpoints HOST:PORT --topic T --actions commit,rollback,unknown

``produce`` is written as the client's README shows a producer: ``Producer(config, (topic,))``,
``startup()``, ``send`` (sync) for the first half, ``send_async`` for the rest, ``shutdown()``.
Message i has body ``<prefix>-i``, tag ``TagA``/``TagB`` by parity, key ``key-i`` and properties
``idx=i``, ``color=blue``; one JSON line per receipt (``{"i", "message_id", "offset"}``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def produce(args: argparse.Namespace) -> None:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    # --ak/--sk: the client's Credentials (it signs every call); a refused start or send is
    # printed as {"error": ...} (ACL tests), not raised.
    config = ClientConfiguration(args.endpoints, Credentials(args.ak, args.sk))
    # --tls: the client's tls_enable; it trusts the CA named by GRPC_DEFAULT_SSL_ROOTS_FILE_PATH.
    producer = Producer(config, (args.topic,), tls_enable=args.tls)
    started = time.monotonic()
    try:
        producer.startup()
    except Exception as exc:
        print(json.dumps({"start_error": f"{type(exc).__name__}: {exc}"}), flush=True)
        producer.shutdown()
        return
    print(json.dumps({"started_s": round(time.monotonic() - started, 3)}), flush=True)
    try:
        futures = []
        for i in range(args.count):
            msg = Message()
            msg.topic = args.topic
            msg.body = f"{args.prefix}-{i}".encode()
            msg.tag = "TagA" if i % 2 == 0 else "TagB"
            msg.keys = f"key-{i}"
            msg.add_property("idx", str(i))
            msg.add_property("color", "blue")
            if args.message_group:
                msg.message_group = args.message_group  # a FIFO message: sent in order, sync
                receipt = producer.send(msg)
                print(
                    json.dumps(
                        {"i": i, "mode": "fifo", "message_id": receipt.message_id, "offset": receipt.offset}
                    ),
                    flush=True,
                )
            elif i < args.count // 2:
                try:
                    receipt = producer.send(msg)
                except Exception as exc:
                    print(json.dumps({"i": i, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
                    continue
                print(
                    json.dumps(
                        {"i": i, "mode": "sync", "message_id": receipt.message_id, "offset": receipt.offset}
                    ),
                    flush=True,
                )
            else:
                try:
                    futures.append((i, producer.send_async(msg)))
                except Exception as exc:
                    print(json.dumps({"i": i, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        for i, future in futures:
            try:
                receipt = future.result(timeout=30)
            except Exception as exc:
                print(json.dumps({"i": i, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
                continue
            print(
                json.dumps(
                    {"i": i, "mode": "async", "message_id": receipt.message_id, "offset": receipt.offset}
                ),
                flush=True,
            )
    finally:
        producer.shutdown()


def transaction(args: argparse.Namespace) -> None:
    """One transaction per action, as the client's README shows them: ``begin_transaction()``,
    ``send(msg, transaction)``, then ``commit()``, ``rollback()`` or nothing (``unknown``: the
    broker's check asks the producer's checker, which commits).  One JSON line per send
    (``{"i", "action", "message_id", "transaction_id"}``) and per check (``{"checked"}``); waits up
    to ``--wait`` seconds for the checks of the unknown ones."""
    import threading

    from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker
    from rocketmq import TransactionResolution as Resolution

    actions = args.actions.split(",")
    pending = actions.count("unknown")
    checked: list[str] = []
    all_checked = threading.Event()

    class Checker(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Message) -> int:
            checked.append(message.message_id)
            print(json.dumps({"checked": message.message_id, "body": message.body.decode()}), flush=True)
            if len(set(checked)) >= pending:
                all_checked.set()
            return Resolution.COMMIT

    producer = Producer(ClientConfiguration(args.endpoints, Credentials()), (args.topic,), checker=Checker())
    producer.startup()
    try:
        for i, action in enumerate(actions):
            tx = producer.begin_transaction()
            msg = Message()
            msg.topic = args.topic
            msg.body = f"{args.prefix}-{action}-{i}".encode()
            msg.tag = "TxTag"
            msg.keys = f"key-{i}"
            msg.add_property("idx", str(i))
            receipt = producer.send(msg, tx)
            if action == "commit":
                tx.commit()
            elif action == "rollback":
                tx.rollback()
            print(
                json.dumps(
                    {
                        "i": i,
                        "action": action,
                        "message_id": receipt.message_id,
                        "transaction_id": receipt.transaction_id,
                    }
                ),
                flush=True,
            )
        if pending:
            all_checked.wait(args.wait)
    finally:
        producer.shutdown()


def bench(args: argparse.Namespace) -> None:
    """Send ``--count`` messages of ``--body`` bytes, sync, one at a time; print the totals."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(args.endpoints, Credentials()), (args.topic,))
    producer.startup()
    body = b"x" * args.body
    try:
        print("ready", flush=True)
        sys.stdin.readline()  # the benchmark reads the broker's CPU time, then says go
        started = time.monotonic()
        failed = 0
        for _ in range(args.count):
            msg = Message()
            msg.topic = args.topic
            msg.body = body
            try:
                producer.send(msg)
            except Exception:
                failed += 1
        elapsed = time.monotonic() - started
        print(json.dumps({"sent": args.count - failed, "failed": failed, "seconds": elapsed}), flush=True)
        sys.stdin.readline()
    finally:
        producer.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["produce", "transaction", "bench"])
    p.add_argument("--endpoints", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--prefix", default="v5")
    p.add_argument("--body", type=int, default=1024)
    p.add_argument("--tls", action="store_true", help="produce: connect with TLS")
    p.add_argument("--ak", default="", help="produce: the Credentials' access key")
    p.add_argument("--sk", default="", help="produce: the Credentials' secret key")
    p.add_argument("--message-group", default="", help="produce: FIFO messages of this group")
    p.add_argument(
        "--actions", default="commit", help="transaction: commit/rollback/unknown, comma-separated"
    )
    p.add_argument("--wait", type=float, default=60.0, help="transaction: seconds to wait for the checks")
    args = p.parse_args()
    {"produce": produce, "transaction": transaction, "bench": bench}[args.scenario](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
