"""The compiled PULL_MESSAGE lane (issue 38) against the Python handler, its reference.

One mmap broker holds a backlog (records of many sizes, tags that collide by hash code, files
small enough that pulls cross their ends).  Every pull is sent twice over loopback: once as the
broker serves it (the lane where it may), once while a plugin listens to the consume hooks, which
sends every pull the Python handler's way.  The two answers must be byte-equal: code, remark,
header fields (nextBeginOffset, minOffset, maxOffset, suggestWhichBrokerId) and body.  Pulls come
from hypothesis (offsets inside and outside the queue, counts, tags, malformed values, other
expression types) and as the official client (``rocketmq==0.4.4``) writes them.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq import hookimpl
from tidemq.address import split_address
from tidemq.broker.pull_lane import counters
from tidemq.extensions import compiled_twin
from tidemq.message import BatchItem, encode_batch, properties_to_string
from tidemq.observe import ConsumeContext
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import stringify_fields
from tidemq.store import pull_lane
from tidemq.testing.pytest_plugin import running_broker

pytest.importorskip("tidemq._native._pull_lane")
if compiled_twin("tidemq._native._pull_lane") is None:  # TIDEMQ_NO_EXTENSIONS=1: every pull is the handler's
    pytest.skip("the compiled pull lane is switched off", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)

TOPIC = "PullLaneTopic"
QUEUES = 4
#: "Aa" and "BB" share their Java hash code (the entry's tag code): only the stored TAGS tells them apart.
TAGS = ["TagA", "TagB", "Aa", "BB", None, "TagA"]


class ConsumeListener:
    """A plugin on the consume hooks: while registered, every pull is the Python handler's."""

    def __init__(self) -> None:
        self.seen = 0

    @hookimpl
    def tidemq_before_consume(self, context: ConsumeContext) -> None:
        self.seen += 1


class Broker:
    """One mmap broker with a backlog, on a loop of its own thread."""

    def __init__(self, root: Path, options: dict[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._cm = running_broker(root, {"store": "mmap"}, options={"store": {"mmap": options}})
        self.broker = self.run(self._cm.__aenter__())
        self.address: str = self.broker.address
        self.listener = ConsumeListener()

    def run(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(60)

    def close(self) -> None:
        self.run(self._cm.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def exchange(self, requests: list[RemotingCommand]) -> list[RemotingCommand]:
        return self.run(_exchange(self.address, requests))

    def both(self, requests: list[RemotingCommand]) -> tuple[list[bytes], list[bytes]]:
        """Each request's answer (encoded) as the broker serves it, then from the Python handler."""
        served = [encode_bytes(a) for a in self.exchange(requests)]
        manager = self.broker.manager
        manager.register(self.listener, name="pull-lane-test-listener")
        try:
            reference = [encode_bytes(a) for a in self.exchange(requests)]
        finally:
            manager.hook_manager.unregister(self.listener)
        return served, reference


async def _exchange(address: str, requests: list[RemotingCommand]) -> list[RemotingCommand]:
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    decoder = FrameDecoder()
    answers: dict[int, RemotingCommand] = {}
    try:
        for request in requests:  # one at a time: each pull sees the same queue state
            writer.write(encode_bytes(request))
            await writer.drain()
            while request.opaque not in answers:
                data = await asyncio.wait_for(reader.read(1 << 20), 20)
                assert data, "connection closed"
                for cmd in decoder.feed(data):
                    answers[cmd.opaque] = cmd
    finally:
        writer.close()
    return [answers[r.opaque] for r in requests]


def _send_backlog(b: Broker) -> None:
    fields = {"topic": TOPIC, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6}
    create = RemotingCommand(
        RequestCode.UPDATE_AND_CREATE_TOPIC, opaque=1, ext_fields=stringify_fields(fields)
    )
    (answer,) = b.exchange([create])
    assert answer.code == ResponseCode.SUCCESS
    rnd = random.Random(38)
    requests = []
    for n in range(48):
        items = []
        for j in range(rnd.randint(1, 24)):
            props = {"UNIQ_KEY": f"{n:08X}{j:024X}"}
            tag = rnd.choice(TAGS)
            if tag is not None:
                props["TAGS"] = tag
            size = rnd.choice([1, 16, 100, 1024, 1024, 3000])
            items.append(BatchItem(body=bytes([n % 251]) * size, flag=0, properties=props))
        header = {
            "a": "PG",
            "b": TOPIC,
            "c": "TBW102",
            "d": "4",
            "e": str(n % QUEUES),
            "f": "0",
            "g": "1700000000000",
            "h": "0",
            "i": properties_to_string({}),
            "j": "0",
            "k": "false",
            "m": "true",
        }
        requests.append(
            RemotingCommand(
                RequestCode.SEND_BATCH_MESSAGE, opaque=100 + n, ext_fields=header, body=encode_batch(items)
            )
        )
    for answer in b.exchange(requests):
        assert answer.code == ResponseCode.SUCCESS, answer.remark


def _broker(root: Path, options: dict[str, Any]) -> Iterator[Broker]:
    b = Broker(root, options)
    try:
        _send_backlog(b)
        store = b.broker.store
        for q in range(QUEUES):  # dispatched to the consume queues before any pull
            b.run(_until(lambda q=q: store.get_max_offset_in_queue(TOPIC, q) > 0))
        yield b
    finally:
        b.close()


async def _until(ready: Any) -> None:
    for _ in range(500):
        if ready():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the backlog was not dispatched")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    # commit-log files small enough that some pulls cross their ends (the lane leaves those to the
    # careful path), large enough that most do not
    yield from _broker(tmp_path_factory.mktemp("pull-lane"), {"commitlog_file_size": 256 * 1024})


_OPAQUE = iter(range(1_000, 10**9))


def pull(**fields: Any) -> RemotingCommand:
    header: dict[str, Any] = {
        "consumerGroup": "LaneCG",
        "topic": TOPIC,
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": "4",
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }
    header.update(fields)
    return RemotingCommand(
        RequestCode.PULL_MESSAGE,
        opaque=next(_OPAQUE),
        ext_fields={k: v for k, v in header.items() if v is not None},
    )


def assert_alike(b: Broker, requests: list[RemotingCommand]) -> list[RemotingCommand]:
    served, reference = b.both(requests)
    for request, got, want in zip(requests, served, reference, strict=True):
        assert got == want, request.ext_fields
    return FrameDecoder().feed(b"".join(served))


# --------------------------------------------------------------------------- tests
def test_a_whole_backlog_pulled_through_the_lane_answers_as_the_python_handler(broker: Broker) -> None:
    for expression in ("*", "TagA", "Aa", "TagA || BB"):
        before = dict(counters)
        for q in range(QUEUES):
            offset, pulled = 0, 0
            while True:
                (answer,) = assert_alike(
                    broker,
                    [pull(queueId=str(q), queueOffset=str(offset), maxMsgNums="8", subscription=expression)],
                )
                if answer.code != ResponseCode.SUCCESS:
                    break
                pulled += 1
                offset = int(answer.ext_fields["nextBeginOffset"])
            assert pulled > 0
        assert counters["served"] > before["served"], expression  # the lane took some
        assert counters["declined"] > before["declined"], expression  # and left some to the handler


def test_the_lane_serves_a_backlog_pull_and_leaves_the_rest_to_the_handler(broker: Broker) -> None:
    before = dict(counters)
    (answer,) = broker.exchange([pull(maxMsgNums="16")])
    assert answer.code == ResponseCode.SUCCESS
    assert counters["served"] == before["served"] + 1
    end = broker.broker.store.get_max_offset_in_queue(TOPIC, 0)
    (caught_up,) = broker.exchange([pull(queueOffset=str(end))])
    assert caught_up.code == ResponseCode.PULL_NOT_FOUND  # nothing found: the handler's answer
    assert counters["declined"] == before["declined"] + 1


def test_a_consume_hook_listener_sees_every_pull_the_lane_would_take(broker: Broker) -> None:
    listener = broker.listener
    seen = listener.seen
    served, reference = broker.both([pull(), pull(subscription="TagB")])
    assert served == reference
    assert listener.seen == seen + 2  # each pull reached the hooks (the handler served them)


def test_the_memory_store_and_a_switched_off_mmap_store_offer_no_pull_lane(tmp_path: Path) -> None:
    from tidemq_store_memory import MemoryMessageStore, MemoryStoreOptions

    assert pull_lane(object()) is None
    assert pull_lane(MemoryMessageStore(MemoryStoreOptions())) is None
    off = Broker(tmp_path, {"request_lanes": False})
    try:
        assert pull_lane(off.broker.store) is None
    finally:
        off.close()


EXPRESSIONS = st.sampled_from(
    ["*", "", "TagA", "TagB", "Aa", "BB", "TagA || BB", "TagC", "Aa||TagB", " * ", "a" * 300, "||", "TagA ||"]
)
NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=700).map(str),
    st.sampled_from(["", "x", " 1", "+1", "1_0", "٣", "99999999999999999999", "-1", "2048", "1024"]),
)


@st.composite
def pulls(draw: st.DrawFn) -> RemotingCommand:
    """Mostly pulls the lane may take (a queue's offsets, TAG subscriptions), some anything else."""
    plain = draw(st.integers(0, 3)) > 0
    flag = (
        draw(st.sampled_from([4, 5, 6, 7, 12]))
        if plain
        else draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, "x"]))
    )
    fields: dict[str, Any] = {
        "queueId": str(draw(st.integers(0, QUEUES - 1))) if plain else draw(NUMBERS),
        "queueOffset": str(draw(st.integers(0, 160))) if plain else draw(NUMBERS),
        "maxMsgNums": draw(st.sampled_from(["1", "2", "3", "7", "32", "1000", "1024", "1025", "0", "-1"]))
        if plain
        else draw(NUMBERS),
        "sysFlag": str(flag),
        "subscription": draw(EXPRESSIONS),
        "expressionType": "TAG" if plain else draw(st.sampled_from(["TAG", "SQL92", "", None])),
        "commitOffset": draw(st.sampled_from(["-1", "0", "3"])),
        "subVersion": draw(st.sampled_from(["0", "1", "99999999999999"])),
    }
    if not plain:
        if draw(st.booleans()):
            fields["topic"] = draw(st.sampled_from([TOPIC, "NoSuchTopic", ""]))
        if draw(st.booleans()):
            fields["consumerGroup"] = draw(st.sampled_from(["LaneCG", "OtherCG", "%RETRY%x"]))
        if draw(st.booleans()):
            fields[draw(st.sampled_from(["queueOffset", "topic", "consumerGroup", "maxMsgNums"]))] = None
    return pull(**fields)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(requests=st.lists(pulls(), min_size=1, max_size=4))
def test_any_pull_answers_as_the_python_handler(broker: Broker, requests: list[RemotingCommand]) -> None:
    assert_alike(broker, requests)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_the_drawn_pulls_mostly_take_the_lane(broker: Broker) -> None:
    """The strategy above exercises the lane: a fair share of its pulls are the lane's."""
    before = dict(counters)
    for request in [pulls().example() for _ in range(60)]:
        broker.exchange([request])
    served = counters["served"] - before["served"]
    assert served >= 10, (served, counters["declined"] - before["declined"])


#: Pull headers as the official C++ client (``rocketmq==0.4.4``) writes them: its push consumer
#: (commit offset, suspend and subscription flags, 15 s suspend, long polling) and pull consumer
#: (subscription flag only), maxMsgNums 32, the field set of its PullMessageRequestHeader.
OFFICIAL = [
    {"sysFlag": "7", "suspendTimeoutMillis": "15000", "commitOffset": "0", "subscription": "*"},
    {"sysFlag": "7", "suspendTimeoutMillis": "15000", "commitOffset": "12", "subscription": "TagA || TagB"},
    {"sysFlag": "6", "suspendTimeoutMillis": "15000", "commitOffset": "0", "subscription": "Aa"},
    {"sysFlag": "4", "suspendTimeoutMillis": "20000", "commitOffset": "0", "subscription": "*"},
    {"sysFlag": "4", "suspendTimeoutMillis": "20000", "commitOffset": "0", "subscription": "BB"},
]


@pytest.mark.parametrize("header", OFFICIAL, ids=range(len(OFFICIAL)))
def test_pulls_as_the_official_client_sends_them_take_the_lane_and_answer_alike(
    broker: Broker, header: dict[str, str]
) -> None:
    requests = [
        pull(queueId=str(q), queueOffset=str(o), maxMsgNums="32", **header)
        for q in range(QUEUES)
        for o in (0, 5)
    ]
    before = counters["served"]
    answers = assert_alike(broker, requests)
    assert all(a.code == ResponseCode.SUCCESS for a in answers)
    if header["subscription"] in (
        "*",
        "TagA || TagB",
    ):  # a rare tag's pull scans the whole queue, across files
        assert counters["served"] > before


# --------------------------------------------------------------------------- the walk, damaged files
def test_a_damaged_entry_pointing_near_2_to_the_63_stops_the_walk_instead_of_crashing() -> None:
    """A ConsumeQueue entry whose offset is 2**63 - 1 made ``pos + size`` wrap past the bounds check:
    the compiled walk read far outside the mapping and the broker died (SIGSEGV) on the pull."""
    from tidemq._native import _pull_lane, _pull_walk
    from tidemq.record import SCAN_CAREFUL, pack_cq_entries

    data = memoryview(bytes(1490))
    entries = pack_cq_entries([(1 << 63) - 1], [102], [2112])
    tags = ((116, 2112), (b"BB", b"t"))
    for selection in (tags, None):
        assert (
            _pull_lane.walk(entries, 0, 20, data, 0, 1490, b"T", 1, 0, 8, 4096, True, selection)[4]
            == SCAN_CAREFUL
        )
        found = _pull_walk.scan_queue(
            entries, 0, 20, data, 0, 1490, b"T", 1, 0, 8, 4096, True, [], [], 0, [], selection
        )
        assert found[3] == SCAN_CAREFUL


def test_the_walk_fuzzer_finds_no_difference_from_the_reference() -> None:
    """A few thousand inputs of ``tests/fuzz/fuzz_pull_lane.py`` (the committed runs do a million)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    try:
        import fuzz_pull_lane
    finally:
        sys.path.pop(0)
    from tidemq._native import _pull_lane

    summary = fuzz_pull_lane.run(_pull_lane, 3000, seed=2)
    assert summary["walks_taking_records"] > 300  # the inputs reach past the first record
