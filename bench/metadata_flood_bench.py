"""How long a burst of new consumer groups takes, and what a bystander producer sees meanwhile.

Each HEART_BEAT naming a new group creates the group (subscriptionGroup.json) and its retry topic
(topics.json).  The script starts ``tidemq standalone``, lets a producer send one message at a time,
pipelines ``--groups`` such heartbeats on one raw connection and reports how long their answers
took and the producer's send latencies.  JSON on stdout, progress on stderr.

    python bench/metadata_flood_bench.py --groups 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
from benchutil import free_port, start, stop

from tidemq.client import BlockingProducer, Message
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import FLAG_RESPONSE, RequestCode


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2000)
    args = ap.parse_args()
    import socket

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ns_port, broker_port = free_port(), free_port()
        proc = start(
            [
                "standalone",
                "--data-dir",
                str(root / "data"),
                "--namesrv-listen",
                f"127.0.0.1:{ns_port}",
                "--broker-listen",
                f"127.0.0.1:{broker_port}",
            ],
            root,
        )
        latencies: list[float] = []
        stop_sending = threading.Event()
        try:
            with BlockingProducer("flood-bystander", f"127.0.0.1:{ns_port}") as producer:
                producer.send(Message("FloodBystander", b"warm-up"))

                def send() -> None:
                    while not stop_sending.is_set():
                        started = time.monotonic()
                        producer.send(Message("FloodBystander", b"x" * 64))
                        latencies.append(time.monotonic() - started)
                        time.sleep(0.001)

                sender = threading.Thread(target=send)
                sender.start()
                time.sleep(0.5)
                print(f"pipelining {args.groups} heartbeats with new groups", file=sys.stderr)
                sock = socket.create_connection(("127.0.0.1", broker_port))
                decoder = FrameDecoder(64 << 20)
                started = time.monotonic()
                for i in range(args.groups):
                    body = {"clientID": "flood", "consumerDataSet": [{"groupName": f"flood-{i}"}]}
                    sock.sendall(
                        encode_bytes(RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(body)))
                    )
                answered = 0
                sock.settimeout(120)
                while answered < args.groups:
                    data = sock.recv(1 << 20)
                    if not data:
                        break
                    answered += sum(1 for c in decoder.feed(data) if c.flag & FLAG_RESPONSE)
                flood_s = time.monotonic() - started
                sock.close()
                time.sleep(0.5)
                stop_sending.set()
                sender.join()
        finally:
            stop_sending.set()
            stop(proc)
    result = {
        "groups": args.groups,
        "answered": answered,
        "flood_s": round(flood_s, 3),
        "bystander_sends": len(latencies),
        "bystander_p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "bystander_p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "bystander_max_ms": round(max(latencies, default=0.0) * 1000, 1),
    }
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
