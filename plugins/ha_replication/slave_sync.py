"""Slave metadata synchronisation (RocketMQ's SlaveSynchronize), run on the broker's event loop.

Every ``metadata_sync_s`` a slave copies its master's topic config, consumer offsets and delay
offsets (when the master serves them); every ``group_sync_s`` its subscription groups.  It uses
the master broker's admin requests, so any RocketMQ-compatible master works.  Until the master
broker's address is known (configured, or learnt from the NameServers' answer to the slave's
registration) no round runs; learning it wakes the loop at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

from tidemq.address import format_address, split_address
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import DataVersion
from tidemq.replication import MetadataSink
from tidemq.tasks import supervise

if TYPE_CHECKING:
    from tidemq.transport import TransportClient

    from .master_slave import MasterSlaveReplication

log = logging.getLogger(__name__)


REQUEST_TIMEOUT_S = 3.0


class SlaveSynchronize:
    """Pulls the master's metadata into a slave broker, through the broker's :class:`MetadataSink`."""

    def __init__(self, sink: MetadataSink, client: TransportClient, replication: MasterSlaveReplication):
        self.sink = sink
        self.client = client  # the broker's transport client: admin requests to the master
        self.replication = replication  # its options, and where its master is
        self.last_sync: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._no_delay_offsets = False
        self._wake = asyncio.Event()
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start the loop on the running event loop (the broker's)."""
        self._event_loop = asyncio.get_running_loop()
        self._task = supervise(self._loop, "tidemq-slave-sync")

    def wake(self) -> None:
        """Run the next round now (the master's address was just learnt); from any thread."""
        loop = self._event_loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    def cancel(self) -> None:
        """Stop syncing (from a synchronous hook; :meth:`stop` also waits for the task)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    def master_address(self) -> str:
        addr = self.replication.master_broker_address
        if addr:
            return str(addr)
        # Last resort: the broker port is the HA port - 1 (RocketMQ's default layout).
        ha = self.replication.client.master_address if self.replication.client else ""
        if ha:
            host, port = split_address(ha)
            return format_address(host, port - 1)
        return ""

    async def _loop(self) -> None:
        opts = self.replication.options
        next_groups = 0.0
        while True:
            if not self.master_address():
                # Not known yet (the registration answer brings it): no round, which would
                # otherwise take a silent master for one without delay offsets.
                await self._pause(opts.metadata_sync_s)
                continue
            try:
                await self.sync_all(groups=time.monotonic() >= next_groups)
                if time.monotonic() >= next_groups:
                    next_groups = time.monotonic() + opts.group_sync_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("slave metadata sync failed: %s", exc)
                # Topics created on the master after the last sync: keep their messages readable.
                for name in self.sink.adopt_store_topics():
                    log.info("slave adopts topic %s from its replicated commit log", name)
            await self._pause(opts.metadata_sync_s)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or until :meth:`wake` (``asyncio.timeout``: a cancel always wins)."""
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            pass
        self._wake.clear()

    async def _get(self, code: int) -> dict[str, Any] | None:
        addr = self.master_address()
        if not addr:
            return None
        resp = await self.client.invoke(addr, RemotingCommand.request(code), REQUEST_TIMEOUT_S)
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"{RequestCode(code).name} answered {resp.code} {resp.remark}")
        data = orjson.loads(resp.body or b"{}")
        return data if isinstance(data, dict) else None

    async def sync_all(self, groups: bool = True) -> None:
        """One round; raises when the master cannot be reached."""
        await self.sync_topics()
        await self.sync_offsets()
        await self.sync_delay_offsets()
        if groups:
            await self.sync_groups()

    async def sync_topics(self) -> None:
        data = await self._get(RequestCode.GET_ALL_TOPIC_CONFIG)
        if data is None:
            return
        version = DataVersion.from_dict(data.get("dataVersion") or {}).to_dict()
        if version != self.sink.topic_data_version():
            count = self.sink.apply_topic_configs(data)
            log.info("slave synced %d topic configs from %s", count, self.master_address())
        self.last_sync["topics"] = time.time()

    async def sync_offsets(self) -> None:
        data = await self._get(RequestCode.GET_ALL_CONSUMER_OFFSET)
        if data is None:
            return
        self.sink.apply_consumer_offsets(data)
        self.last_sync["offsets"] = time.time()

    async def sync_delay_offsets(self) -> None:
        if self._no_delay_offsets:
            return
        try:
            data = await self._get(RequestCode.GET_ALL_DELAY_OFFSET)
        except RuntimeError:
            data = None
        if data is None:
            self._no_delay_offsets = True  # the master has no schedule service: do not ask again
            return
        self.sink.apply_delay_offsets(data)
        self.last_sync["delay_offsets"] = time.time()

    async def sync_groups(self) -> None:
        data = await self._get(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if data is None:
            return
        self.sink.apply_subscription_groups(data)
        self.last_sync["groups"] = time.time()
