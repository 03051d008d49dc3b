"""Topic routes from the NameServer (GET_ROUTEINFO_BY_TOPIC) and what a client derives from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from tidemq.jsonfile import quote_bare_int_keys
from tidemq.perm import PERM_READ, PERM_WRITE
from tidemq.queues import MessageQueue

MASTER_ID = 0
#: The topic a broker with auto-creation registers; its route stands in for unknown topics.
AUTO_CREATE_TOPIC = "TBW102"


def loads_lenient(data: bytes | str) -> Any:
    """Parse JSON, accepting fastjson's bare integer keys (``{0:"127.0.0.1:10911"}``)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return orjson.loads(quote_bare_int_keys(raw))


@attrs.frozen
class QueueData:
    """One broker's queues of a topic, as a client keeps them.

    The wire object of :class:`tidemq.remoting.protocol.QueueData`, kept apart on purpose: that one
    is a mutable row of the NameServer's tables (WIPE_WRITE_PERM rewrites its ``perm`` in place);
    this one is a frozen part of a :class:`TopicRoute` a client caches and shares between its
    producers and consumers.
    """

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@attrs.frozen
class BrokerData:
    """A broker group's addresses, as a client keeps them (see :class:`QueueData` for why two classes)."""

    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str]

    @property
    def master_address(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def address(self, prefer_id: int = MASTER_ID) -> str | None:
        """The preferred broker id's address, else the master, else any."""
        return (
            self.broker_addrs.get(prefer_id)
            or self.master_address
            or next(iter(self.broker_addrs.values()), None)
        )


@attrs.frozen
class TopicRoute:
    """One topic's route: its queues per broker and the brokers' addresses."""

    topic: str
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]

    @classmethod
    def from_json(cls, topic: str, body: bytes | str) -> TopicRoute:
        d = loads_lenient(body)
        queues = tuple(
            QueueData(
                broker_name=str(q["brokerName"]),
                read_queue_nums=int(q.get("readQueueNums", 0)),
                write_queue_nums=int(q.get("writeQueueNums", 0)),
                perm=int(q.get("perm", PERM_READ | PERM_WRITE)),
            )
            for q in d.get("queueDatas") or []
        )
        brokers = tuple(
            BrokerData(
                cluster=str(b.get("cluster", "")),
                broker_name=str(b["brokerName"]),
                broker_addrs={int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()},
            )
            for b in d.get("brokerDatas") or []
        )
        return cls(topic, queues, brokers)

    def broker(self, name: str) -> BrokerData | None:
        return next((b for b in self.broker_datas if b.broker_name == name), None)

    def publish_queues(self, topic: str | None = None, max_queues: int | None = None) -> list[MessageQueue]:
        """Writable queues on brokers with a live master, in broker-name order (TopicPublishInfo)."""
        out: list[MessageQueue] = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if not qd.perm & PERM_WRITE:
                continue
            bd = self.broker(qd.broker_name)
            if bd is None or bd.master_address is None:
                continue
            n = qd.write_queue_nums if max_queues is None else min(qd.write_queue_nums, max_queues)
            out.extend(MessageQueue(topic or self.topic, qd.broker_name, i) for i in range(n))
        return out

    def subscribe_queues(self) -> list[MessageQueue]:
        """Readable queues, sorted (what consumers rebalance over)."""
        out = [
            MessageQueue(self.topic, qd.broker_name, i)
            for qd in self.queue_datas
            if qd.perm & PERM_READ
            for i in range(qd.read_queue_nums)
        ]
        return sorted(out)

    def addresses(self) -> dict[str, str]:
        """broker name -> master address (brokers without a master are left out)."""
        return {b.broker_name: b.master_address for b in self.broker_datas if b.master_address}
