"""The official client (rocketmq==0.4.4) sets RocketMQ 5's timer property by name (issue 36).

``Message.set_property("TIMER_DELAY_SEC", "3")`` is all a 4.x client can do; the broker must hold
the message 3 s, then deliver it to the official push consumer with the producer's message id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

#: The broker's default timer_precision_ms.
PRECISION_MS = 1000
#: Beyond the precision: the consumer's pull and a loaded machine.
SLACK_MS = 1500

SCENARIO = """
import json, sys, threading, time
from rocketmq.client import Message, Producer, PushConsumer
namesrv, topic = sys.argv[1], sys.argv[2]
got, done = [], threading.Event()
def text(v):
    return v.decode() if isinstance(v, bytes) else str(v or "")
def on_message(msg):
    got.append({"id": msg.id, "body": text(msg.body), "store": msg.store_timestamp,
                "timer_out": text(msg.get_property("TIMER_OUT_MS")), "arrived": int(time.time() * 1000)})
    done.set()
consumer = PushConsumer("timer-official-cg")
consumer.set_namesrv_addr(namesrv)
consumer.subscribe(topic, on_message, "*")
producer = Producer("timer-official-pg")
producer.set_namesrv_addr(namesrv)
producer.start()
warm = Message(topic)
warm.set_body(b"warm-up")
producer.send_sync(warm)  # the topic and its route exist before the consumer starts
consumer.start()
time.sleep(2)
msg = Message(topic)
msg.set_body(b"in-3s")
msg.set_keys(b"timer-key")
msg.set_property("TIMER_DELAY_SEC", "3")
sent_at = int(time.time() * 1000)
r = producer.send_sync(msg)
deadline = time.time() + 20
while time.time() < deadline and not any(g["body"] == "in-3s" for g in got):
    time.sleep(0.05)
time.sleep(1.0)
print(json.dumps({"status": int(r.status), "msg_id": r.msg_id, "sent_at": sent_at, "got": got}), flush=True)
producer.shutdown()
consumer.shutdown()
"""


def test_official_client_timer_delay_sec_is_honoured(spawn: Any, tmp_path: Path, port: int) -> None:
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-timer"\nlisten = "127.0.0.1:{port}"\nnamesrv = ["{namesrv}"]\n'
        f'data_dir = "{tmp_path / "data"}"\n'
    )
    spawn("broker", "-c", str(tmp_path / "broker.toml"))
    out = subprocess.run(
        [sys.executable, "-c", SCENARIO, namesrv, "TimerOfficial"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-3000:]
    result = json.loads(lines[-1])
    assert result["status"] == 0
    timed = [g for g in result["got"] if g["body"] == "in-3s"]
    assert len(timed) == 1, result["got"]
    m = timed[0]
    assert m["id"] == result["msg_id"]  # the producer's message id
    due = result["sent_at"] + 3000
    # Not early (the consumer's own clock, same machine), and within precision + slack.
    assert m["arrived"] >= due - 5, m["arrived"] - due
    assert m["store"] - due <= PRECISION_MS + SLACK_MS, m["store"] - due
    assert int(m["timer_out"]) >= due - 5
