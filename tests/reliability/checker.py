"""Checks acknowledged sends against what a live broker serves, through tidemq's pull client."""

from __future__ import annotations

from collections import Counter

import attrs

from tidemq.client import BlockingPullConsumer, MessageQueue, PullStatus
from tidemq.message import body_crc

from .cluster import digest


@attrs.frozen
class Ack:
    """One acknowledged send as the load generator printed it."""

    at_ms: int
    queue_id: int
    queue_offset: int
    msg_id: str
    offset_msg_id: str
    digest: str


def parse_acks(stdout: bytes) -> list[Ack]:
    """ACK lines of a load generator's output; a line cut by a kill is not an acknowledgement."""
    acks = []
    for line in stdout.split(b"\n")[:-1]:  # the text after the last newline was never completed
        parts = line.decode(errors="replace").split()
        if len(parts) == 7 and parts[0] == "ACK":
            acks.append(Ack(int(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5], parts[6]))
    return acks


@attrs.frozen
class Served:
    """One message a broker served: where, which (UNIQ_KEY) and whether its body matches its CRC."""

    msg_id: str
    digest: str
    crc_ok: bool


@attrs.define
class CheckResult:
    acked: int = 0
    found: int = 0  # acknowledged and served at its queue offset with its body
    lost: int = 0  # acknowledged but absent, or its queue offset now holds another message
    served: int = 0
    corrupt_served: int = 0  # served with a body that does not match its CRC
    duplicated_served: int = 0  # one message id served at more than one queue offset
    offset_gaps: int = 0  # holes in a queue's offsets
    lost_examples: list[Ack] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in attrs.asdict(self).items() if k != "lost_examples"}


def read_topic(namesrv: str, topic: str, group: str = "reliability-checker") -> dict[tuple[int, int], Served]:
    """Every message of every queue of ``topic``, by (queue id, queue offset)."""
    out: dict[tuple[int, int], Served] = {}
    with BlockingPullConsumer(group, namesrv) as consumer:
        queues: list[MessageQueue] = consumer.fetch_subscribe_queues(topic)
        for mq in queues:
            offset = 0
            while True:
                res = consumer.pull(mq, "*", offset, 256)
                if res.status is not PullStatus.FOUND:
                    if res.status is PullStatus.OFFSET_ILLEGAL and res.next_begin_offset > offset:
                        offset = res.next_begin_offset
                        continue
                    break
                for m in res.messages:
                    out[(mq.queue_id, m.queue_offset)] = Served(
                        m.uniq_key or "", digest(m.body), body_crc(m.body) == m.body_crc
                    )
                offset = res.next_begin_offset
    return out


def check(acks: list[Ack], served: dict[tuple[int, int], Served]) -> CheckResult:
    """Compare acknowledgements with what is served; served data is checked whole on its own too."""
    r = CheckResult(acked=len(acks), served=len(served))
    for a in acks:
        s = served.get((a.queue_id, a.queue_offset))
        if s is not None and s.msg_id == a.msg_id and s.digest == a.digest:
            r.found += 1
        else:
            r.lost += 1
            if len(r.lost_examples) < 10:
                r.lost_examples.append(a)
    r.corrupt_served = sum(1 for s in served.values() if not s.crc_ok)
    ids = Counter(s.msg_id for s in served.values())
    r.duplicated_served = sum(n - 1 for n in ids.values() if n > 1)
    by_queue: dict[int, list[int]] = {}
    for qid, qoff in served:
        by_queue.setdefault(qid, []).append(qoff)
    for offsets in by_queue.values():
        offsets.sort()
        r.offset_gaps += (offsets[-1] - offsets[0] + 1) - len(offsets)
    return r
