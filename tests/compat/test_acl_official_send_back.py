"""The official client's CONSUMER_SEND_MSG_BACK under the plain ACL: the broker checks SUB on the
stored message's topic (issue 41), which the consuming account has, so a failed message still
goes back for a retry.

Run as a script, this file is the client worker:

    python test_acl_official_send_back.py --namesrv A --topic T --group G --ak AK --sk SK --count N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHANNEL = "ALIYUN"


def worker(argv: list[str] | None = None) -> None:
    from rocketmq.client import PushConsumer, RecvMessage

    p = argparse.ArgumentParser()
    for name in ("--namesrv", "--topic", "--group", "--ak", "--sk"):
        p.add_argument(name, required=True)
    p.add_argument("--count", type=int, default=5)
    args = p.parse_args(argv)
    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_session_credentials(args.ak, args.sk, CHANNEL)
    consumer.set_thread_count(1)
    failed: set[bytes] = set()
    lock = threading.Lock()
    enough = threading.Event()

    def on_message(consumer_handle: Any, msg: Any) -> int:
        with lock:
            failed.add(bytes(RecvMessage(msg).body))
            if len(failed) >= args.count:
                enough.set()
        return 1  # RECONSUME_LATER: the client sends the message back (CONSUMER_SEND_MSG_BACK)

    # The Python wrapper turns a listener's exception into CONSUME_SUCCESS (ctypes ignores the
    # raise), so the raw callback is registered instead to answer RECONSUME_LATER.
    consumer.subscribe(args.topic, lambda msg: None)
    consumer._unregister_callback()
    consumer._register_callback(on_message)
    consumer.start()
    # rocketmq-client-cpp's first rebalance can take 20 s and more on a loaded machine (seen in CI runs:
    # 2 of 3 at 30 s), so the wait is generous; it ends as soon as every message has come.
    enough.wait(75)
    threading.Event().wait(2)  # the client sends back after the listener returns
    print(json.dumps({"failed": len(failed)}), flush=True)
    consumer.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    from test_acl_official import AclCompatCluster

    c = AclCompatCluster(tmp_path_factory.mktemp("aclsendback"))
    yield c
    c.stop()


pytestmark = [pytest.mark.compat, pytest.mark.timeout(240)]


def _schedule_max_offsets(c: Any) -> int:
    from tidemq.client import AdminClient, SessionCredentials
    from tidemq.remoting.codes import RequestCode

    async def main() -> int:
        client = AdminClient(c.namesrv, credentials=SessionCredentials("compat-admin", "compat-admin-secret"))
        try:
            total = 0
            for queue in range(18):
                resp = await client.call(
                    c.broker,
                    RequestCode.GET_MAX_OFFSET,
                    {"topic": "SCHEDULE_TOPIC_XXXX", "queueId": str(queue)},
                    ok=tuple(range(400)),
                )
                total += int((resp.ext_fields or {}).get("offset", 0))
            return total
        finally:
            await client.close()

    return asyncio.run(main())


def test_failed_messages_go_back_under_the_acl(cluster: Any) -> None:
    sent = cluster.run(
        "produce", "--topic", "AclCompat", "--ak", "compat-ak", "--sk", "compat-secret", "--count", "3"
    )
    assert [r.get("status") for r in sent] == [0] * 3, sent
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(Path(__file__)), "--namesrv", cluster.namesrv, "--topic", "AclCompat",
         "--group", "ACL_COMPAT_CG", "--ak", "compat-ak", "--sk", "compat-secret", "--count", "3"],
        capture_output=True, text=True, timeout=120, env=cluster.env, cwd=cluster.tmp,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["failed"] == 3, out.stderr[-3000:]
    assert _schedule_max_offsets(cluster) >= 3  # sent back: waiting in the delay queue for a retry
    log = cluster.broker_log()
    assert "refused" not in log, log[-3000:]


if __name__ == "__main__":
    worker()
