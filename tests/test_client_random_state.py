"""tidemq's client and broker leave the process's global ``random`` state to the application.

An application (or a test framework such as Hypothesis) that seeds ``random`` and draws from it
must see the same sequence whether or not a producer or an in-process broker runs beside it.
Before, a producer's message-id generator and its queue selector drew from the global generator,
and Hypothesis flagged it (``Do not use the random module inside strategies``) when a producer
thread sent while it drew.
"""

from __future__ import annotations

import random
from pathlib import Path

from conftest import free_port

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.client.message import UniqueIdGenerator


def test_a_message_id_generator_does_not_draw_from_the_global_random() -> None:
    random.seed(1234)
    state = random.getstate()
    ids = {UniqueIdGenerator().next_id() for _ in range(3)}
    assert len(ids) == 3
    assert random.getstate() == state


def test_a_producer_sending_does_not_draw_from_the_global_random(spawn, tmp_path: Path) -> None:
    server = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{free_port()}",
        "--broker-listen",
        f"127.0.0.1:{free_port()}",
    )
    random.seed(99)
    state = random.getstate()
    with BlockingProducer("random-state-pg", server.addresses["namesrv"]) as producer:
        for i in range(20):
            assert producer.send(Message("RandomStateTopic", b"m%d" % i)).status is SendStatus.SEND_OK
    assert random.getstate() == state
