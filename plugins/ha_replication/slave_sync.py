"""Slave metadata synchronisation (RocketMQ's SlaveSynchronize), run on the broker's event loop.

Every ``metadata_sync_s`` a slave copies its master's topic config, consumer offsets and delay
offsets (when the master serves them); every ``group_sync_s`` its subscription groups.  It uses
the master broker's admin requests, so any RocketMQ-compatible master works.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from tidemq.names import check_group_name, check_stored_topic_name
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.tasks import supervise

log = logging.getLogger(__name__)


def _valid(problem: str | None, what: str, name: str) -> bool:
    """A name from the master is checked like any other: a bad one is skipped, never stored."""
    if problem:
        log.warning("slave sync skips %s %r from the master: %s", what, name[:200], problem)
        return False
    return True


REQUEST_TIMEOUT_S = 3.0
#: json files other plugins keep delay offsets in (the broker's schedule service), relative to config/.
DELAY_OFFSET_FILE = "delayOffset.json"


class SlaveSynchronize:
    """Pulls the master's metadata into a slave broker."""

    def __init__(self, broker: Any, replication: Any):
        self.broker = broker
        self.replication = replication
        self.last_sync: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._no_delay_offsets = False

    def start(self) -> None:
        self._task = supervise(self._loop, "tidemq-slave-sync")

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
            host, _, port = ha.rpartition(":")
            return f"{host}:{int(port) - 1}"
        return ""

    async def _loop(self) -> None:
        opts = self.replication.options
        next_groups = 0.0
        while True:
            try:
                await self.sync_all(groups=time.monotonic() >= next_groups)
                if time.monotonic() >= next_groups:
                    next_groups = time.monotonic() + opts.group_sync_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("slave metadata sync failed: %s", exc)
                self.adopt_store_topics()
            await asyncio.sleep(opts.metadata_sync_s)

    async def _get(self, code: int) -> dict[str, Any] | None:
        addr = self.master_address()
        if not addr:
            return None
        resp = await self.broker.client.invoke(addr, RemotingCommand.request(code), REQUEST_TIMEOUT_S)
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
        from tidemq.broker.topics import DataVersion, TopicConfig

        data = await self._get(RequestCode.GET_ALL_TOPIC_CONFIG)
        if data is None:
            return
        topics = self.broker.topics
        version = DataVersion.from_dict(data.get("dataVersion") or {})
        if version.to_dict() == topics.data_version.to_dict():
            self.last_sync["topics"] = time.time()
            return
        table = data.get("topicConfigTable") or {}
        wanted = {
            name: TopicConfig.from_dict({"topicName": name, **cfg})
            for name, cfg in table.items()
            if _valid(check_stored_topic_name(name), "topic", name)
        }
        current = topics.all()
        for name, cfg in wanted.items():
            if current.get(name) != cfg:
                topics.update(cfg)
        for name in set(current) - set(wanted):
            topics.delete(name)
        topics.data_version = version
        topics.persist()
        self.last_sync["topics"] = time.time()
        log.info("slave synced %d topic configs from %s", len(wanted), self.master_address())

    def adopt_store_topics(self) -> None:
        """Topics the replicated commit log holds but the topic table lacks (created on the master
        after the last sync): register them so their messages stay readable with the master gone."""
        from tidemq.broker.topics import TopicConfig

        topics = self.broker.topics
        for name, queue_ids in self.broker.store.topics().items():
            if topics.get(name) is None and queue_ids:
                n = max(queue_ids) + 1
                log.info("slave adopts topic %s (%d queues) from its replicated commit log", name, n)
                topics.update(TopicConfig(name, n, n))

    async def sync_offsets(self) -> None:
        data = await self._get(RequestCode.GET_ALL_CONSUMER_OFFSET)
        if data is None:
            return
        offsets = self.broker.offsets
        for key, queues in (data.get("offsetTable") or {}).items():
            topic, sep, group = key.partition("@")
            if not sep or not _valid(
                check_stored_topic_name(topic) or check_group_name(group), "offsets", key
            ):
                continue
            for qid, off in queues.items():
                offsets.commit(group, topic, int(qid), int(off))
        offsets.persist()
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
        schedule = getattr(self.broker, "schedule", None)
        if schedule is not None and isinstance(getattr(schedule, "offsets", None), dict):
            # The slave's schedule service owns delayOffset.json: update its table, let it write.
            for level, offset in (data.get("offsetTable") or {}).items():
                schedule.offsets[int(level)] = int(offset)
            schedule.persist(force=True)
        else:
            from tidemq.jsonfile import write_json

            write_json(self.broker.data_dir / "config" / DELAY_OFFSET_FILE, data)
        self.last_sync["delay_offsets"] = time.time()

    async def sync_groups(self) -> None:
        from tidemq.broker.subscriptions import SubscriptionGroupConfig

        data = await self._get(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if data is None:
            return
        groups = self.broker.groups
        current = groups.all()
        for name, cfg in (data.get("subscriptionGroupTable") or {}).items():
            if not _valid(check_group_name(name), "group", name):
                continue
            wanted = SubscriptionGroupConfig.from_json({"groupName": name, **cfg})
            if current.get(name) != wanted:
                groups.update(wanted)
        self.last_sync["groups"] = time.time()
