"""RouteInfoManager: the NameServer's in-memory view of brokers and topic routes.

Tables follow RocketMQ's RouteInfoManager:

* ``topic_queue_table``: topic -> broker name -> QueueData (queue counts and permissions)
* ``broker_addr_table``: broker name -> BrokerData (cluster and broker id -> address)
* ``cluster_addr_table``: cluster -> broker names
* ``broker_live_table``: broker address -> BrokerLiveInfo (last heartbeat, data version, connection)
* ``filter_server_table``: broker address -> filter server addresses

Every method takes the lock, so the tables may also be read from other threads (admin tools).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from tidemq.perm import PERM_READ, PERM_WRITE
from tidemq.remoting.protocol import (
    MASTER_ID,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
)

log = logging.getLogger(__name__)

#: TopicSysFlag bits used by the unit-topic queries.
FLAG_UNIT = 0x1
FLAG_UNIT_SUB = 0x2


@attrs.define
class BrokerLiveInfo:
    last_update: float
    data_version: DataVersion
    connection: Any = None
    ha_server_addr: str = ""


@attrs.frozen
class RegisterBrokerResult:
    ha_server_addr: str = ""
    master_addr: str = ""


class RouteInfoManager:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.RLock()
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ registration
    def register_broker(
        self,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str = "",
        topic_config_wrapper: TopicConfigSerializeWrapper | None = None,
        filter_server_list: list[str] | None = None,
        connection: Any = None,
    ) -> RegisterBrokerResult:
        with self._lock:
            self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
            broker_data = self.broker_addr_table.get(broker_name)
            register_first = broker_data is None
            if broker_data is None:
                broker_data = BrokerData(cluster_name, broker_name, {})
                self.broker_addr_table[broker_name] = broker_data
            elif broker_data.cluster != cluster_name:
                old = self.cluster_addr_table.get(broker_data.cluster)
                if old is not None:
                    old.discard(broker_name)
                    if not old:
                        del self.cluster_addr_table[broker_data.cluster]
                broker_data.cluster = cluster_name
            # A slave promoted to master keeps its address under a new id: drop the old id.
            for bid, addr in list(broker_data.broker_addrs.items()):
                if addr == broker_addr and bid != broker_id:
                    del broker_data.broker_addrs[bid]
            old_addr = broker_data.broker_addrs.get(broker_id)
            broker_data.broker_addrs[broker_id] = broker_addr
            register_first = register_first or old_addr is None

            if topic_config_wrapper is not None and broker_id == MASTER_ID:
                if register_first or self._topic_config_changed(
                    broker_addr, topic_config_wrapper.data_version
                ):
                    self._update_broker_topics(broker_name, topic_config_wrapper.topic_config_table)

            data_version = (
                topic_config_wrapper.data_version if topic_config_wrapper is not None else DataVersion(0, 0)
            )
            previous = self.broker_live_table.get(broker_addr)
            self.broker_live_table[broker_addr] = BrokerLiveInfo(
                self._clock(), data_version, connection, ha_server_addr or ""
            )
            if previous is None:
                log.info(
                    "new broker registered: %s %s id=%s at %s",
                    cluster_name,
                    broker_name,
                    broker_id,
                    broker_addr,
                )
            if filter_server_list:
                self.filter_server_table[broker_addr] = list(filter_server_list)
            else:
                self.filter_server_table.pop(broker_addr, None)

            if broker_id != MASTER_ID:
                master_addr = broker_data.broker_addrs.get(MASTER_ID)
                if master_addr:
                    master_live = self.broker_live_table.get(master_addr)
                    if master_live is not None:
                        return RegisterBrokerResult(master_live.ha_server_addr, master_addr)
            return RegisterBrokerResult()

    def _topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def _update_broker_topics(self, broker_name: str, table: dict[str, TopicConfig]) -> None:
        for topic, tc in table.items():
            self.topic_queue_table.setdefault(topic, {})[broker_name] = QueueData(
                broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag
            )
        # Topics the master no longer has were deleted on it: forget its queues there.
        for topic in [
            t for t, qds in self.topic_queue_table.items() if broker_name in qds and t not in table
        ]:
            qds = self.topic_queue_table[topic]
            del qds[broker_name]
            if not qds:
                del self.topic_queue_table[topic]
                log.info("topic %s removed: its last broker %s dropped it", topic, broker_name)

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        with self._lock:
            return self._topic_config_changed(broker_addr, data_version)

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        with self._lock:
            live = self.broker_live_table.get(broker_addr)
            return live.data_version if live is not None else None

    def update_broker_info_update_timestamp(self, broker_addr: str) -> None:
        with self._lock:
            live = self.broker_live_table.get(broker_addr)
            if live is not None:
                live.last_update = self._clock()

    # ------------------------------------------------------------------ removal
    def unregister_broker(
        self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        with self._lock:
            self.broker_live_table.pop(broker_addr, None)
            self.filter_server_table.pop(broker_addr, None)
            broker_data = self.broker_addr_table.get(broker_name)
            removed_name = False
            if broker_data is not None:
                if broker_data.broker_addrs.get(broker_id) == broker_addr:
                    del broker_data.broker_addrs[broker_id]
                if not broker_data.broker_addrs:
                    del self.broker_addr_table[broker_name]
                    removed_name = True
            if removed_name:
                self._forget_broker_names({broker_name})
            log.info(
                "broker unregistered: %s %s id=%s at %s", cluster_name, broker_name, broker_id, broker_addr
            )

    def _remove_broker_addr(self, broker_addr: str) -> None:
        """Forget everything known about the broker at ``broker_addr`` (expired or disconnected)."""
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        gone: set[str] = set()
        for name, bd in list(self.broker_addr_table.items()):
            for bid, addr in list(bd.broker_addrs.items()):
                if addr == broker_addr:
                    del bd.broker_addrs[bid]
            if not bd.broker_addrs:
                del self.broker_addr_table[name]
                gone.add(name)
        if gone:
            self._forget_broker_names(gone)

    def _forget_broker_names(self, names: set[str]) -> None:
        for cluster in list(self.cluster_addr_table):
            members = self.cluster_addr_table[cluster]
            members -= names
            if not members:
                del self.cluster_addr_table[cluster]
        for topic in list(self.topic_queue_table):
            qds = self.topic_queue_table[topic]
            for name in names:
                qds.pop(name, None)
            if not qds:
                del self.topic_queue_table[topic]

    def scan_not_active_brokers(self, expire_s: float) -> list[BrokerLiveInfo]:
        """Drop brokers silent for ``expire_s``; returns their live infos (to close connections)."""
        now = self._clock()
        expired: list[BrokerLiveInfo] = []
        with self._lock:
            for addr, live in list(self.broker_live_table.items()):
                if now - live.last_update > expire_s:
                    log.warning("broker %s expired: silent for %.0fs", addr, now - live.last_update)
                    self._remove_broker_addr(addr)
                    expired.append(live)
        return expired

    def on_connection_closed(self, connection: Any) -> str | None:
        """The broker whose registration came over ``connection`` is gone; returns its address."""
        with self._lock:
            for addr, live in self.broker_live_table.items():
                if live.connection is connection:
                    log.info("broker %s disconnected: removing its routes", addr)
                    self._remove_broker_addr(addr)
                    return addr
        return None

    # ------------------------------------------------------------------ queries
    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        with self._lock:
            qds = self.topic_queue_table.get(topic)
            if not qds:
                return None
            route = TopicRouteData()
            for name in sorted(qds):
                qd = qds[name]
                route.queue_datas.append(QueueData(**attrs.asdict(qd)))
                bd = self.broker_addr_table.get(name)
                if bd is None:
                    continue
                route.broker_datas.append(bd.copy())
                for addr in bd.broker_addrs.values():
                    servers = self.filter_server_table.get(addr)
                    if servers:
                        route.filter_server_table[addr] = list(servers)
            if not route.broker_datas:
                return None
            return route

    def get_all_cluster_info(self) -> ClusterInfo:
        with self._lock:
            return ClusterInfo(
                {name: bd.copy() for name, bd in self.broker_addr_table.items()},
                {c: set(names) for c, names in self.cluster_addr_table.items()},
            )

    def get_all_topic_list(self) -> TopicList:
        with self._lock:
            return TopicList(set(self.topic_queue_table))

    def get_topics_by_cluster(self, cluster: str) -> TopicList:
        with self._lock:
            names = self.cluster_addr_table.get(cluster, set())
            return TopicList({t for t, qds in self.topic_queue_table.items() if names & qds.keys()})

    def get_system_topic_list(self) -> TopicList:
        """Cluster and broker names (RocketMQ uses them as system topics) and one broker address."""
        with self._lock:
            topics: set[str] = set()
            for cluster, names in self.cluster_addr_table.items():
                topics.add(cluster)
                topics |= names
            addr = None
            for bd in self.broker_addr_table.values():
                addr = bd.select_broker_addr()
                if addr:
                    break
            return TopicList(topics, addr)

    def get_unit_topics(self, kind: str) -> TopicList:
        """``unit``: topics flagged unit; ``unit_sub``: with unit subscriptions; ``unit_sub_ununit``: both but not unit."""
        with self._lock:
            out = set()
            for topic, qds in self.topic_queue_table.items():
                flag = next(iter(qds.values())).topic_syn_flag if qds else 0
                unit, unit_sub = bool(flag & FLAG_UNIT), bool(flag & FLAG_UNIT_SUB)
                if (
                    (kind == "unit" and unit)
                    or (kind == "unit_sub" and unit_sub)
                    or (kind == "unit_sub_ununit" and unit_sub and not unit)
                ):
                    out.add(topic)
            return TopicList(out)

    # ------------------------------------------------------------------ admin
    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Remove a topic's route (only the cluster's brokers when ``cluster_name`` is given)."""
        with self._lock:
            if not cluster_name:
                return self.topic_queue_table.pop(topic, None) is not None
            qds = self.topic_queue_table.get(topic)
            if qds is None:
                return False
            for name in self.cluster_addr_table.get(cluster_name, set()):
                qds.pop(name, None)
            if not qds:
                del self.topic_queue_table[topic]
            return True

    def register_topic(self, topic: str, queue_datas: list[QueueData]) -> None:
        """REGISTER_TOPIC_IN_NAMESRV: add queues on brokers already registered."""
        with self._lock:
            for qd in queue_datas:
                if qd.broker_name in self.broker_addr_table:
                    self.topic_queue_table.setdefault(topic, {})[qd.broker_name] = qd

    def _change_write_perm(self, broker_name: str, wipe: bool) -> int:
        count = 0
        with self._lock:
            for qds in self.topic_queue_table.values():
                qd = qds.get(broker_name)
                if qd is not None:
                    # RocketMQ's operateWritePermOfBroker: a wipe clears the write bit, an add
                    # sets read+write outright (a read-only topic becomes writable too).
                    qd.perm = qd.perm & ~PERM_WRITE if wipe else PERM_READ | PERM_WRITE
                    count += 1
        return count

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        return self._change_write_perm(broker_name, wipe=True)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        return self._change_write_perm(broker_name, wipe=False)
