"""What the POP engine answers and refuses with, and its limits (plain values, no broker)."""

from __future__ import annotations

import time
from typing import Any

import attrs

from tidemq.broker.pop.handle import AckHandle, retry_mark

#: RocketMQ 5 response codes absent from 4.x (209/210 are 4.x ACL codes, hence not in ResponseCode).
POLLING_FULL = 209
POLLING_TIMEOUT = 210
INVALID_PARAMETER = 29
#: RocketMQ's ConsumeInitMode.
INIT_MIN, INIT_MAX = 0, 1
MAX_POP_NUMS = 32  # RocketMQ refuses more per pop
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # the RocketMQ 5 proxy's maxInvisibleTime
MAX_CHECKPOINTS = 500_000  # open pop batches per broker: the in-memory bound
MAX_POLLERS = 100_000  # RocketMQ's maxPopPollingSize
MAX_BATCH_ACK = 1024  # BatchAck entries in one BATCH_ACK_MESSAGE
RETRY_FIRST_PERCENT = 20  # RocketMQ's popFromRetryProbability
SYNC_INTERVAL_S = 1.0
REVIVE_BATCH = 256  # expired checkpoints revived together


class PopError(Exception):
    """A refusal with the RocketMQ response code and a remark for the client."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark


@attrs.define
class PoppedBatch:
    """Messages of one queue in a pop answer (one checkpoint)."""

    topic: str  # the stored topic (retry topic for redeliveries)
    queue_id: int
    start: int  # the checkpoint's start offset (handles' ckQueueOffset)
    offsets: tuple[int, ...]
    buffers: tuple[Any, ...]  # stored records, as the store returned them
    attempt: int = 0
    #: The same bytes in fewer chunks (the store's ``wire``): what the answer writes.
    wire: tuple[Any, ...] = ()


@attrs.define
class PopResult:
    pop_time: int
    invisible_ms: int
    revive_qid: int
    rest_num: int
    batches: list[PoppedBatch] = attrs.field(factory=list)

    @property
    def found(self) -> bool:
        return bool(self.batches)

    def handles(self, broker_name: str) -> list[str]:
        """Each message's ack handle, in answer order (what a RocketMQ client computes)."""
        return [
            AckHandle(
                b.start,
                self.pop_time,
                self.invisible_ms,
                self.revive_qid,
                retry_mark(b.topic),
                broker_name,
                b.queue_id,
                o,
            ).format()
            for b in self.batches
            for o in b.offsets
        ]


def now_ms() -> int:
    return int(time.time() * 1000)
