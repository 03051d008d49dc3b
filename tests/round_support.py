"""What the held-answer tests share: V2 sends as bytes, reading answers, making the topic, and the
commit log's ``flush`` behind a gate (``test_flush_round_answers.py``, the read lane's rounds;
``test_decoded_round_answers.py``, the decoded-command path's); the flush worker tests' waits
(``test_flush_kick_polls.py``, ``test_flush_gather_compiled.py``)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from tidemq.address import split_address
from tidemq.futures import resolved
from tidemq.message import properties_to_string
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import stringify_fields

_KEYS = itertools.count(1)


def v2_send(topic: str, opaque: int, queue: int) -> bytes:
    """A SEND_MESSAGE_V2 frame of a new 100-byte message (its own UNIQ_KEY) to ``topic``'s ``queue``."""
    fields = {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue),
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": properties_to_string({"UNIQ_KEY": f"{next(_KEYS):032X}", "TAGS": "t"}),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    return encode_bytes(
        RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, ext_fields=fields, body=b"m" * 100)
    )


async def read_answers(
    reader: asyncio.StreamReader, count: int, timeout: float = 20
) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    answers: list[RemotingCommand] = []
    while len(answers) < count:
        data = await asyncio.wait_for(reader.read(1 << 16), timeout)
        assert data, "connection closed"
        answers += decoder.feed(data)
    return answers


async def create_topic(broker: Any, topic: str) -> None:
    """``topic`` with 4 queues, written to topics.json before it returns."""
    host, port = split_address(broker.address)
    reader, writer = await asyncio.open_connection(host, port)
    fields = {"topic": topic, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    writer.write(
        encode_bytes(
            RemotingCommand(
                RequestCode.UPDATE_AND_CREATE_TOPIC, opaque=1, ext_fields=stringify_fields(fields)
            )
        )
    )
    (answer,) = await read_answers(reader, 1)
    assert answer.code == ResponseCode.SUCCESS
    writer.close()
    while broker.topics.unwritten:  # sends wait for topics.json (the Python path) until it is written
        await asyncio.sleep(0.01)


class GatedFlush:
    """Wraps the commit log's ``flush``: each call waits for ``gate`` (or raises while ``fail``).

    The commit log then declines the sync policy's compiled rounds (``direct_round``), whose
    ``fdatasync`` would not go through ``flush``: every round is gated."""

    def __init__(self, commitlog: Any) -> None:
        self.real: Callable[[int], int] = commitlog.flush
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.returned: list[float] = []  # loop-independent times each flush returned (monotonic)
        self.fail = False
        commitlog.flush = self
        commitlog.direct_round = lambda end: None

    def __call__(self, least_pages: int = 0) -> int:
        self.entered.set()
        if self.fail:
            raise OSError("the disk is gone")
        self.gate.wait(30)
        flushed = self.real(least_pages)
        self.returned.append(time.monotonic())
        return flushed


async def acknowledged(store: Any, *futures: Any) -> list[Any]:
    """Each put's result, checking at its acknowledgement that the flushed offset covers it."""
    results = []
    for fut in futures:
        r = await resolved(fut)
        assert r.ok and store.commitlog.flushed_where >= r.wrote_offset + r.wrote_bytes
        results.append(r)
    return results


def wait_taken(worker: Any) -> None:
    """Block (the loop too) until the flush worker took the posted request into its held slot."""
    deadline = time.monotonic() + 10
    while worker.inflight == 0:
        assert time.monotonic() < deadline, "the flush worker did not take the posted round"
        time.sleep(0.001)
