"""How a service operation ended: :class:`Status`, and :class:`Outcome` for operations with no
other fields (refusals, commits, ends of transactions)."""

from __future__ import annotations

import enum

import attrs


class Status(enum.IntEnum):
    """The outcome of an operation of :mod:`tidemq.broker.services`.

    The names and values are RocketMQ's response codes (``ResponseCode``): the remoting
    processors pass a status on as the response code unchanged, and another transport (gRPC's
    ``Code``) maps this one table.  Only the outcomes a service gives are listed.
    """

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206


@attrs.frozen(slots=True)
class Outcome:
    """An operation's status, why (``remark``, None on success) and, in controller mode, the
    epoch the broker follows (``epoch``: sends and their refusals carry it)."""

    status: Status
    remark: str | None = None
    epoch: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS


#: The one success without fields (shared: no allocation per call).
DONE = Outcome(Status.SUCCESS)
