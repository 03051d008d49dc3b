"""Consume progress: on the broker for clustering, in a local JSON file for broadcasting.

Offsets are kept in memory as the consumer advances and persisted every few seconds and at
shutdown (RocketMQ's RemoteBrokerOffsetStore / LocalFileOffsetStore).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from tidemq.client.instance import ClientInstance
from tidemq.client.message import queue_from_json, queue_to_json
from tidemq.client.rebalance import CLUSTERING
from tidemq.config import DEFAULT_HOME
from tidemq.jsonfile import read_json, write_json
from tidemq.names import require_group
from tidemq.queues import MessageQueue
from tidemq.remoting.errors import RemotingError

log = logging.getLogger(__name__)


class OffsetStore(Protocol):
    async def load(self) -> None: ...

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = True) -> None: ...

    async def read(self, mq: MessageQueue, *, from_store: bool = False) -> int:
        """The next offset to consume; -1 when none is known (then consume-from-where decides)."""

    async def persist(self, mqs: Iterable[MessageQueue]) -> None: ...

    def remove(self, mq: MessageQueue) -> None: ...


class _MemoryOffsets:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = True) -> None:
        current = self.table.get(mq)
        if current is None or not increase_only or offset > current:
            self.table[mq] = offset

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)


class RemoteBrokerOffsetStore(_MemoryOffsets):
    """Offsets committed to the queue's master broker (QUERY/UPDATE_CONSUMER_OFFSET)."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self.instance = instance
        self.group = group

    async def load(self) -> None:
        """Nothing to load: offsets are read from the broker per queue."""

    async def _address(self, mq: MessageQueue) -> str | None:
        addr = self.instance.broker_address(mq.broker_name)
        if addr is None:
            await self.instance.get_route(mq.topic, refresh=True)
            addr = self.instance.broker_address(mq.broker_name)
        if addr is None:
            # HA (issue 7): no master in the route, the offsets go to a slave (findBrokerAddressInAdmin).
            addr = self.instance.read_address(mq.broker_name)
        return addr

    async def read(self, mq: MessageQueue, *, from_store: bool = False) -> int:
        if not from_store and mq in self.table:
            return self.table[mq]
        addr = await self._address(mq)
        if addr is None:
            raise LookupError(f"broker {mq.broker_name} of {mq} has no known master")
        try:
            offset = await self.instance.require_api().query_consumer_offset(addr, self.group, mq)
        except (OSError, TimeoutError, RemotingError):
            # HA (issue 7): the master is unreachable: ask a slave (it syncs offsets from the master).
            other = self.instance.read_address(mq.broker_name, 1)
            if other is None or other == addr:
                raise
            self.instance.mark_down(addr)
            offset = await self.instance.require_api().query_consumer_offset(other, self.group, mq)
        if offset >= 0:
            self.update(mq, offset, increase_only=False)
        return offset

    async def persist(self, mqs: Iterable[MessageQueue]) -> None:
        api = self.instance.require_api()
        for mq in list(mqs):
            offset = self.table.get(mq)
            if offset is None:
                continue
            addr = await self._address(mq)
            if addr is None:
                continue
            try:
                await api.update_consumer_offset(addr, self.group, mq, offset)
            except Exception as exc:
                # HA (issue 7): the master first; when it does not answer, a slave of the same broker.
                other = self.instance.read_address(mq.broker_name, 1)
                if other is not None and other != addr:
                    self.instance.mark_down(addr)
                    try:
                        await api.update_consumer_offset(other, self.group, mq, offset)
                        continue
                    except Exception:
                        pass
                log.warning("committing offset %d of %s failed: %s", offset, mq, exc)


class LocalFileOffsetStore(_MemoryOffsets):
    """Offsets in ``<dir>/<instance>/<group>/offsets.json`` (each broadcasting consumer keeps its own)."""

    def __init__(self, directory: Path | str, instance_name: str, group: str) -> None:
        super().__init__()
        # The group becomes a directory: RocketMQ's rules keep it one (InvalidNameError otherwise).
        self.path = Path(directory).expanduser() / instance_name / require_group(group) / "offsets.json"

    async def load(self) -> None:
        data = read_json(self.path, default=None)
        if not data:
            return
        for entry in data.get("offsetTable", []):
            self.table[queue_from_json(entry)] = int(entry["offset"])
        log.info("loaded %d offsets from %s", len(self.table), self.path)

    async def read(self, mq: MessageQueue, *, from_store: bool = False) -> int:
        if from_store:
            await self.load()
        return self.table.get(mq, -1)

    async def persist(self, mqs: Iterable[MessageQueue]) -> None:
        # The whole table is written, not just ``mqs``: the file is this consumer's only copy.
        rows = [{**queue_to_json(mq), "offset": off} for mq, off in sorted(self.table.items())]
        write_json(self.path, {"offsetTable": rows})


def consumer_offset_store(
    instance: ClientInstance, group: str, message_model: str, offset_dir: str | Path | None
) -> OffsetStore:
    """A consumer's offset store: on the brokers for CLUSTERING; for BROADCASTING a local file
    under ``offset_dir`` (default ``~/.tidemq/offsets``) named as RocketMQ names it, by the
    instance ("DEFAULT" for an unnamed one, so a restarted consumer finds its file)."""
    if message_model == CLUSTERING:
        return RemoteBrokerOffsetStore(instance, group)
    directory = Path(offset_dir) if offset_dir else DEFAULT_HOME / "offsets"
    name = instance.instance_name if instance.named else "DEFAULT"
    return LocalFileOffsetStore(directory, name, group)
