"""Request-reply with message trace: a price service answers quote requests, and every send,
consume and reply is traced and read back as ``tidemq admin queryMsgTraceById`` prints it.

    python examples/request_reply_traced.py

Starts an in-process NameServer and broker (``trace_topic_enable = true``) in a temporary
directory, a responder (a push consumer that answers each request with ``create_reply`` and
``send_reply``) and a requester (``producer.request``), then prints the replies and the trace of
the first request.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_cluster import start_cluster, stop_cluster  # noqa: E402

from tidemq.client import (  # noqa: E402
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    create_reply,
)

PRICES = {"apple": 120, "pear": 95, "plum": 240}


def admin(namesrv: str, *args: str) -> str:
    """``tidemq admin ...`` as an operator runs it."""
    cmd = [sys.executable, "-m", "tidemq", "admin", *args, "-n", namesrv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return out.stdout or out.stderr


async def serve_and_ask(namesrv: str) -> str:
    responder = Producer("quote-service", namesrv, enable_msg_trace=True)
    consumer = PushConsumer("quote-service", namesrv, enable_msg_trace=True)
    consumer.subscribe("QuoteRequests")

    served: list[str] = []  # the requests' message ids, as the service saw them

    async def answer(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            served.append(m.uniq_key)
            price = PRICES.get(m.body.decode(), -1)
            await responder.send_reply(create_reply(m, str(price).encode()))
        return ConsumeStatus.SUCCESS

    consumer.register_listener(answer)
    async with responder, Producer("shop", namesrv, enable_msg_trace=True) as requester:
        await consumer.start()
        try:
            for fruit in PRICES:
                request = Message("QuoteRequests", fruit.encode(), keys=f"quote-{fruit}")
                reply = await requester.request(request, timeout=10.0)
                print(f"{fruit}: {reply.body.decode()} cents")
        finally:
            await consumer.shutdown()
    return served[0]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tidemq-rr-") as tmp:
        loop, namesrv = start_cluster(Path(tmp), broker={"trace_topic_enable": True})
        try:
            admin(namesrv, "updateTopic", "-t", "QuoteRequests", "-c", "DefaultCluster", "-r", "2", "-w", "2")
            msg_id = loop.run(serve_and_ask(namesrv))
            print(f"\ntrace of the first request ({msg_id}):")
            # The clients' dispatchers sent their last records when the clients stopped.
            print(admin(namesrv, "queryMsgTraceById", "-i", msg_id), end="")
        finally:
            stop_cluster(loop)


if __name__ == "__main__":
    main()
