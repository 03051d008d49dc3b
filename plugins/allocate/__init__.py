"""Consumer rebalance strategies (role ``allocate``), after RocketMQ's AllocateMessageQueueStrategy.

Every strategy is a pure function of ``(current_id, queues, consumer_ids)``: each consumer of the
group computes its own share from the same sorted inputs, so the shares never overlap and
together cover every queue (``config`` excepted: the operator names the queues).

Registered names: ``averagely``, ``averagely_by_circle``, ``consistent_hash``, ``config`` and
``machine_room``.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Sequence

import attrs

from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.errors import ConfigError
from tidemq.plugins import PluginContext
from tidemq.queues import MessageQueue

log = logging.getLogger(__name__)

__all__ = [
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateByConfig",
    "AllocateByMachineRoom",
    "AllocateConsistentHash",
]


def _index_of(current_id: str, consumer_ids: Sequence[str]) -> int | None:
    """The consumer's position in the sorted group, or None when it is not (yet) a member."""
    if not current_id or not consumer_ids:
        return None
    try:
        return list(consumer_ids).index(current_id)
    except ValueError:
        # The broker has not seen our heartbeat yet: own nothing rather than overlap others.
        log.info("consumer %s is not in the group's consumer list yet; allocating nothing", current_id)
        return None


class AllocateAveragely:
    """Contiguous blocks: consumer i owns a run of ``len(queues) / len(consumers)`` queues.

    The first ``len(queues) % len(consumers)`` consumers take one extra queue.
    """

    name = "averagely"

    def allocate(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
    ) -> list[MessageQueue]:
        index = _index_of(current_id, consumer_ids)
        if index is None or not queues:
            return []
        n_q, n_c = len(queues), len(consumer_ids)
        mod = n_q % n_c
        if n_q <= n_c:
            size = 1
        elif mod > 0 and index < mod:
            size = n_q // n_c + 1
        else:
            size = n_q // n_c
        start = index * size if mod > 0 and index < mod else index * size + mod
        count = min(size, n_q - start)
        return [queues[(start + i) % n_q] for i in range(max(count, 0))]


class AllocateAveragelyByCircle:
    """Round-robin: consumer i owns queues i, i + n, i + 2n..."""

    name = "averagely_by_circle"

    def allocate(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
    ) -> list[MessageQueue]:
        index = _index_of(current_id, consumer_ids)
        if index is None:
            return []
        return list(queues[index :: len(consumer_ids)])


def md5_hash(key: str) -> int:
    """The ring position of ``key``: the first four MD5 bytes as an unsigned int (RocketMQ's MD5Hash)."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


def queue_key(mq: MessageQueue) -> str:
    """A queue's name on the hash ring, spelled as Java's ``MessageQueue.toString()``."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


@attrs.define
class ConsistentHashOptions:
    """``[allocate.consistent_hash]``: virtual nodes per consumer on the ring."""

    virtual_nodes: int = 10

    def __attrs_post_init__(self) -> None:
        if self.virtual_nodes < 1:
            raise ValueError(f"virtual_nodes = {self.virtual_nodes} must be at least 1")


class AllocateConsistentHash:
    """A hash ring of consumers (with virtual nodes): a queue goes to the next consumer clockwise.

    When a consumer joins or leaves only the queues next to its ring positions move.
    """

    name = "consistent_hash"

    def __init__(self, virtual_nodes: int = 10) -> None:
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes = {virtual_nodes} must be at least 1")
        self.virtual_nodes = virtual_nodes

    def allocate(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
    ) -> list[MessageQueue]:
        if _index_of(current_id, consumer_ids) is None:
            return []
        ring: list[tuple[int, str]] = sorted(
            (md5_hash(f"{cid}-{i}"), cid) for cid in consumer_ids for i in range(self.virtual_nodes)
        )
        points = [p for p, _ in ring]
        owned = []
        for mq in queues:
            pos = bisect.bisect_left(points, md5_hash(queue_key(mq)))
            if ring[pos % len(ring)][1] == current_id:
                owned.append(mq)
        return owned


@attrs.define
class ByConfigOptions:
    """``[allocate.config]``: the queues this consumer owns, as ``"broker_name:queue_id"`` strings."""

    queues: list[str] = attrs.field(factory=list)


class AllocateByConfig:
    """A fixed list of queues set by the operator, whatever the group looks like."""

    name = "config"

    def __init__(self, queues: Sequence[MessageQueue | tuple[str, int]] = ()) -> None:
        self._wanted = {
            (q.broker_name, q.queue_id) if isinstance(q, MessageQueue) else (q[0], int(q[1])) for q in queues
        }

    def allocate(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
    ) -> list[MessageQueue]:
        return [mq for mq in queues if (mq.broker_name, mq.queue_id) in self._wanted]


@attrs.define
class MachineRoomOptions:
    """``[allocate.machine_room]``: the rooms this consumer serves (broker names ``room@name``)."""

    rooms: list[str] = attrs.field(factory=list)


class AllocateByMachineRoom:
    """Only queues of brokers in this consumer's machine rooms, split by blocks plus remainder.

    A broker name ``"hz@broker-a"`` is in room ``hz``.
    """

    name = "machine_room"

    def __init__(self, rooms: Sequence[str] = ()) -> None:
        self.rooms = set(rooms)

    def allocate(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
    ) -> list[MessageQueue]:
        index = _index_of(current_id, consumer_ids)
        if index is None:
            return []
        in_rooms = [
            mq for mq in queues if mq.broker_name.split("@", 1)[0] in self.rooms and "@" in mq.broker_name
        ]
        n_c = len(consumer_ids)
        per, rem = divmod(len(in_rooms), n_c)
        owned = in_rooms[index * per : index * per + per]
        if index < rem:
            owned.append(in_rooms[index + per * n_c])
        return owned


def _parse(cls: type, ctx: PluginContext) -> object:
    return parse_options(cls, ctx.options, f"[allocate.{ctx.name}]")


def _consistent_hash(ctx: PluginContext) -> AllocateConsistentHash:
    opts = _parse(ConsistentHashOptions, ctx)
    return AllocateConsistentHash(opts.virtual_nodes)  # type: ignore[attr-defined]


def _by_config(ctx: PluginContext) -> AllocateByConfig:
    opts = _parse(ByConfigOptions, ctx)
    wanted: list[tuple[str, int]] = []
    for item in opts.queues:  # type: ignore[attr-defined]
        broker, sep, qid = str(item).rpartition(":")
        if not sep or not broker or not qid.isdigit():
            raise ConfigError(f"[allocate.config]: queue {item!r} should look like 'broker-a:0'")
        wanted.append((broker, int(qid)))
    return AllocateByConfig(wanted)


def _machine_room(ctx: PluginContext) -> AllocateByMachineRoom:
    opts = _parse(MachineRoomOptions, ctx)
    return AllocateByMachineRoom(opts.rooms)  # type: ignore[attr-defined]


@hookimpl
def tidemq_register_allocate_strategies(register) -> None:  # noqa: ANN001 - pluggy passes a Register
    register.add("averagely", lambda ctx: AllocateAveragely(), "contiguous equal blocks of queues (default)")
    register.add("averagely_by_circle", lambda ctx: AllocateAveragelyByCircle(), "queues dealt round-robin")
    register.add("consistent_hash", _consistent_hash, "hash ring with virtual nodes; few moves on change")
    register.add("config", _by_config, "a fixed list of queues from the config")
    register.add("machine_room", _machine_room, "only brokers of this consumer's machine rooms")
