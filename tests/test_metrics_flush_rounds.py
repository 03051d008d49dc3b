"""How the sync flush's rounds ran, as an operator reads it: ``/metrics``
(``tidemq_flush_*_total``) and GET_BROKER_RUNTIME_INFO (``flush*`` keys, ``tidemq admin
brokerStatus``) of a real broker under ``flush = "sync"``, moved by real sends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, runtime_info, wait_for
from test_metrics_prometheus import TOPIC, _create_topic, _sample, _scrape, _standalone

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq_flush import native_rounds

pytestmark = pytest.mark.timeout(120)

ROUND_KEYS = (
    "flushRounds",
    "flushRequests",
    "flushInlineRounds",
    "flushCompiledRounds",
    "flushGatheredRounds",
    "flushGatherTimeouts",
    "flushKicksHeld",
    "flushKicksSparse",
    "flushWorkerGatheredRounds",
    "flushWorkerGatherTimeouts",
)


def _sync_standalone(spawn: Any, tmp_path: Path, metrics_port: int, flush_sync: str = "") -> tuple[Any, str]:
    return _standalone(
        spawn,
        tmp_path,
        metrics_port,
        metrics="min_scrape_interval_s = 0\n",
        plugins='flush = "sync"\n',
        tail=f"\n[flush.sync]\n{flush_sync}" if flush_sync else "",
    )


def _rounds(url: str) -> dict[str, float]:
    samples = _scrape(url)
    names = (
        "rounds",
        "inline_rounds",
        "compiled_rounds",
        "gathered_rounds",
        "gather_timeouts",
        "kicks_held",
        "kicks_sparse",
        "worker_gathered_rounds",
        "worker_gather_timeouts",
    )
    found = {name: _sample(samples, f"tidemq_flush_{name}_total") for name in names}
    assert None not in found.values(), found  # every family is served, zero or not
    return {name: float(value or 0.0) for name, value in found.items()}


@pytest.mark.skipif(not native_rounds.available(), reason="the compiled flush worker is not built")
def test_sync_flush_kicks_and_compiled_rounds_move_in_metrics_and_runtime_info(
    spawn: Any, tmp_path: Path
) -> None:
    """Lone sends are sparse kicks (posted to the idle compiled worker at once); a batch of 32
    messages is held a loop turn (``kick_polls``); both counted on ``/metrics`` and in the runtime
    info, with the compiled rounds that flushed them.  Before: neither showed them."""
    server, url = _sync_standalone(spawn, tmp_path, free_port())
    namesrv, broker = server.addresses["namesrv"], server.addresses["broker"]
    _create_topic(namesrv, broker)
    before_info, before = runtime_info(broker), _rounds(url)
    assert set(ROUND_KEYS) <= set(before_info), sorted(before_info)
    with BlockingProducer("flush-rounds-pg", namesrv) as producer:
        for i in range(5):
            assert producer.send(Message(TOPIC, b"lone %d" % i)).status is SendStatus.SEND_OK
        for n in range(3):
            batch = [Message(TOPIC, b"batch %d/%d" % (n, i)) for i in range(32)]
            assert producer.send_batch(batch).status is SendStatus.SEND_OK
    info = runtime_info(broker)
    moved = {key: int(info[key]) - int(before_info[key]) for key in ROUND_KEYS}
    assert moved["flushRequests"] >= 8, moved
    assert moved["flushKicksSparse"] >= 5, moved  # each lone send found the worker idle
    assert moved["flushKicksHeld"] >= 3, moved  # each batch of 32 waited a turn
    assert 1 <= moved["flushCompiledRounds"] <= moved["flushRounds"], moved
    assert moved["flushInlineRounds"] == 0 and moved["flushGatheredRounds"] == 0, moved  # both off by default
    after = _rounds(url)
    assert after["kicks_sparse"] - before["kicks_sparse"] >= 5, (before, after)
    assert after["kicks_held"] - before["kicks_held"] >= 3, (before, after)
    assert after["compiled_rounds"] - before["compiled_rounds"] >= 1, (before, after)
    assert after["compiled_rounds"] <= after["rounds"], after


def test_sync_flush_inline_rounds_move_in_metrics_and_runtime_info(spawn: Any, tmp_path: Path) -> None:
    """``inline_max_us``: lone sends are flushed on the loop at their kick (the disk is trusted at
    start), counted as inline rounds, compiled worker or not."""
    server, url = _sync_standalone(spawn, tmp_path, free_port(), "inline_max_us = 10000000\n")
    namesrv, broker = server.addresses["namesrv"], server.addresses["broker"]
    _create_topic(namesrv, broker)
    before = int(runtime_info(broker)["flushInlineRounds"])
    with BlockingProducer("flush-inline-pg", namesrv) as producer:
        for i in range(5):
            assert producer.send(Message(TOPIC, b"inline %d" % i)).status is SendStatus.SEND_OK
    info = runtime_info(broker)
    assert int(info["flushInlineRounds"]) - before >= 5, info
    assert int(info["flushInlineRounds"]) <= int(info["flushRounds"]), info
    assert wait_for(lambda: _rounds(url)["inline_rounds"] >= before + 5, 10)
