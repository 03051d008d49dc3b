"""The official client's CONSUMER_SEND_MSG_BACK under the plain ACL: the broker checks SUB on the
stored message's topic (issue 41), which the consuming account has, so a failed message still
goes back for a retry: the broker redelivers it from the group's retry topic.

The C API behind the Python wrapper (rocketmq-client-cpp's ``CPushConsumer.cpp``) hands a pulled
batch to the callback one message at a time and stops at the first one that does not succeed:
the whole batch is sent back, but the messages after the first never reach the callback. Which
messages share a batch depends on timing (two of the three land on one queue), so the worker
cannot count failed messages in its callback; it fails every first delivery and counts the
messages that come back (``reconsume_times`` >= 1), answering CONSUME_SUCCESS to those so that a
redelivered batch is walked in full.

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
    failed: set[bytes] = set()  # first deliveries the callback saw (not all: see the docstring)
    retried: set[bytes] = set()  # messages that came back after a send-back
    lock = threading.Lock()
    enough = threading.Event()

    def on_message(consumer_handle: Any, msg: Any) -> int:
        m = RecvMessage(msg)
        with lock:
            if m.reconsume_times == 0:
                failed.add(bytes(m.body))
                return 1  # RECONSUME_LATER: the client sends its batch back (CONSUMER_SEND_MSG_BACK)
            retried.add(bytes(m.body))
            if len(retried) >= args.count:
                enough.set()
        return 0  # CONSUME_SUCCESS: the retry came; the rest of its batch reaches the callback too

    # The Python wrapper turns a listener's exception into CONSUME_SUCCESS (ctypes ignores the
    # raise), so the raw callback is registered instead to answer RECONSUME_LATER.
    consumer.subscribe(args.topic, lambda msg: None)
    consumer._unregister_callback()
    consumer._register_callback(on_message)
    consumer.start()
    # A sent-back message waits out delay level 3 (10 s) before the retry topic serves it; the
    # wait ends as soon as every message has come back.
    enough.wait(75)
    with lock:
        result = {"failed": len(failed), "retried": sorted(b.decode() for b in retried)}
    print(json.dumps(result), flush=True)
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
    assert lines, out.stderr[-3000:]
    # Every message failed once and came back from the retry topic: the send-back was accepted.
    assert lines[-1]["retried"] == ["acl-0", "acl-1", "acl-2"], (lines, out.stderr[-3000:])
    assert _schedule_max_offsets(cluster) >= 3  # each went back through the delay queue
    log = cluster.broker_log()
    assert "refused" not in log, log[-3000:]


if __name__ == "__main__":
    worker()
