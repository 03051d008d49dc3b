"""The read lane's compiled put (``_send_lane.put_sends``, session 11) against ``SendService.put``.

Two mmap brokers in one process prepare the same runs of send frames with the lane's own prepare
step; one stores them with the compiled ``put_sends`` and settles them with the compiled
``settle_sends`` (whose put outcome is read from the futures' slots), the other with
``SendService.put`` and ``settled_many_py``, the Python reference.  Every send must come out
with the same group, index and outcome, and the commit logs must be byte-equal (but for the
store host's port and the store timestamp, zeroed).  Runs mix topics, queues, batches and
sizes that cut a group at ``GROUP_MAX_BYTES``; a put the store refuses for one message is redone
in halves, and a store that raises is answered as the Python path answers it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_send_lane import Pair

from tidemq.broker.services import put as put_module
from tidemq.broker.services.send import GROUP_MAX_BYTES
from tidemq.message import BatchItem, encode_batch
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.protocol import TopicConfig
from tidemq_store_mmap.lane import compiled_send_lane

lane = pytest.importorskip("tidemq._native._send_lane")
if compiled_send_lane() is None or not hasattr(lane, "put_sends"):
    pytest.skip("the compiled send lane is switched off", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)

TOPICS = ("PutTopicA", "PutTopicB")
QUEUES = 8
BORN = ("127.0.0.1", 40000)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    pair = Pair(tmp_path_factory.mktemp("put"), ("compiled", True), ("python", True))
    try:
        for broker in pair.brokers.values():
            for topic in TOPICS:
                broker.topics.update(TopicConfig(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES))
        yield pair
    finally:
        pair.close()


def frame(seq: int, topic: str, queue: int, size: int, batch: int) -> bytes:
    fields = {
        "a": "PUT_P",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue),
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "j": "0",
        "k": "false",
        "m": "true" if batch else "false",
    }
    if batch:
        fields["i"] = "WAIT\x01true\x02"
        items = [BatchItem(bytes([65 + i]) * size, 0, {"KEYS": f"k{seq}-{i}"}) for i in range(batch)]
        body, code = encode_batch(items), RequestCode.SEND_BATCH_MESSAGE
    else:
        fields["i"] = f"WAIT\x01true\x02KEYS\x01k{seq}\x02"
        body, code = bytes([97 + seq % 26]) * size, RequestCode.SEND_MESSAGE_V2
    return encode_bytes(RemotingCommand(code, opaque=seq + 1, ext_fields=fields, body=body))


async def _put_run(broker: Any, data: bytes, compiled: bool, odd: bool = False) -> list[tuple[Any, ...]]:
    entry = broker.send_lane
    frames, end = entry._take(data, 1 << 26)
    assert end == len(data)
    settings_ = broker.settings
    sends = entry._prepare_frames(
        frames,
        entry._writable_queues,
        settings_.cluster,
        settings_.max_batch_messages,
        BORN,
        broker.store_host,
    )
    assert sends is not None
    if odd:  # a send the compiled put does not read (its messages a tuple): the method's
        sends[-1].msgs = tuple(sends[-1].msgs)
    service = entry._service
    done = [False] * len(sends)
    if compiled:
        lane.put_sends(service, sends)
        put_module.settled_many(service.broker, sends, done)
    else:
        service.put(sends)
        put_module.settled_many_py(service.broker, sends, done)
    assert all(done)
    port = f"{broker.store_host[1]:08X}"
    out = []
    for send in sends:
        group = send.group
        ids = ",".join(i[:8] + "0" * 8 + i[16:] for i in send.msg_id.split(",")) if send.msg_id else ""
        ids = ids.replace(port, "0" * 8)
        out.append(
            (
                send.status,
                send.remark,
                ids,
                send.queue_offset,
                send.epoch,
                send.index,
                group.nsends,
                len(group.msgs),
                group.nbytes,
                group.error,
                group.sends,
                group.result is not None,
                group.replica is not None,
            )
        )
    return out


def _both(pair: Pair, data: bytes) -> None:
    got = {name: pair.run(_put_run(b, data, name == "compiled")) for name, b in pair.brokers.items()}
    assert got["compiled"] == got["python"]
    assert pair.commit_log("compiled") == pair.commit_log("python")


runs = st.lists(
    st.tuples(
        st.sampled_from(TOPICS),
        st.integers(0, QUEUES - 1),
        st.sampled_from((0, 1, 200, 1024, 5000)),
        st.sampled_from((0, 0, 0, 2, 3)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=runs)
def test_compiled_put_groups_stores_and_settles_as_send_service_put(pair: Pair, run: list[Any]) -> None:
    data = b"".join(frame(i, *spec) for i, spec in enumerate(run))
    _both(pair, data)


def test_a_run_with_a_send_it_does_not_read_goes_to_send_service_put(pair: Pair) -> None:
    data = b"".join(frame(i, TOPICS[i % 2], i % 3, 300, 0) for i in range(6))
    got = {
        name: pair.run(_put_run(b, data, name == "compiled", odd=True)) for name, b in pair.brokers.items()
    }
    assert got["compiled"] == got["python"]
    assert pair.commit_log("compiled") == pair.commit_log("python")


def test_a_group_is_cut_at_group_max_bytes_as_the_python_put(pair: Pair) -> None:
    size = 256 * 1024
    count = 2 * GROUP_MAX_BYTES // size + 3  # two cuts of one queue's group, another queue between
    data = b"".join(frame(i, TOPICS[0], 0 if i % 5 else 1, size, 0) for i in range(count))
    _both(pair, data)


def test_a_put_refused_for_one_message_is_redone_in_halves(pair: Pair) -> None:
    """A message over the store's size limit in a coalesced put: the rest stored, it refused."""
    big = 4 * 1024 * 1024 + 1  # over max_message_size: the store refuses the put (MESSAGE_ILLEGAL)
    data = b"".join(frame(i, TOPICS[1], 3, big if i == 2 else 100, 0) for i in range(5))
    got = {name: pair.run(_put_run(b, data, name == "compiled")) for name, b in pair.brokers.items()}
    assert got["compiled"] == got["python"]
    statuses = [row[0].name for row in got["compiled"]]
    assert statuses.count("SUCCESS") == 4 and statuses[2] != "SUCCESS"
    assert pair.commit_log("compiled") == pair.commit_log("python")


class _Raising:
    """A store that raises on put (the case the Python store_group logs and answers)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def put_messages(self, msgs: Any) -> Any:
        raise OSError(5, "injected")

    put_message = put_messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def _raising_run(broker: Any, data: bytes, compiled: bool) -> list[tuple[Any, ...]]:
    context = broker.send_lane._service.broker
    real = context.store
    context.store = _Raising(real)
    try:
        return await _put_run(broker, data, compiled)
    finally:
        context.store = real


def test_a_store_that_raises_is_answered_as_the_python_put_answers_it(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    data = b"".join(frame(i, TOPICS[0], i % 2, 10, 0) for i in range(3))
    got = {}
    for name, broker in pair.brokers.items():
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=put_module.log.name):
            got[name] = pair.run(_raising_run(broker, data, name == "compiled"))
        assert [r.getMessage() for r in caplog.records] == [f"store refused a message for {TOPICS[0]}"] * 2
        assert all(r.exc_info and isinstance(r.exc_info[1], OSError) for r in caplog.records)
    assert got["compiled"] == got["python"]
    assert {row[0].name for row in got["compiled"]} == {"SYSTEM_ERROR"}
