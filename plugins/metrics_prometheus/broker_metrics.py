"""A broker's figures as Prometheus metric families, read on its event loop at scrape time.

Names and labels follow apache/rocketmq-exporter where it has the figure
(``RMQMetricsCollector``/``MetricsCollectTask``), so its Grafana dashboards work against tidemq:

* ``rocketmq_producer_offset{cluster,broker,topic}``: the sum of the topic's queue max offsets;
  ``rocketmq_topic_retry_offset`` for ``%RETRY%`` topics, ``rocketmq_topic_dlq_offset{group}``
  for ``%DLQ%`` ones;
* ``rocketmq_consumer_offset{cluster,broker,topic,group}``: the sum of the group's committed
  offsets; ``rocketmq_group_diff{group,topic,countOfOnlineConsumers,msgModel}`` its lag in
  messages (``rocketmq_group_retrydiff``/``dlqdiff`` for its retry and dead-letter topics);
  ``rocketmq_group_get_latency_by_storetime{cluster,broker,topic,group}``: how old, in ms, the
  oldest message the group has not consumed is; ``rocketmq_group_count{caddr,localaddr,group}``;
* ``rocketmq_brokeruntime_msg_put_total_today_now`` / ``..._msg_gettotal_today_now`` with
  rocketmq-exporter's broker-runtime labels.

A broker is one exporter target, so figures are this broker's; ``sum by`` over targets gives the
cluster's.  tidemq's own figures are under ``tidemq_`` (store positions and disk use, flush
rounds and how they ran, replication, held pulls, connections).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from tidemq import __version__
from tidemq._native import ACTIVE as COMPILED_CODEC
from tidemq.address import split_address
from tidemq.context import BrokerFiguresView
from tidemq.flush import RoundStatistics
from tidemq.index import IndexBacklog
from tidemq.metrics import Buckets
from tidemq.replication import MasterAware
from tidemq.store import store_introspection
from tidemq_metrics_prometheus.dedup_metrics import dedup_families
from tidemq_metrics_prometheus.flush_metrics import flush_round_families
from tidemq_metrics_prometheus.lane_metrics import lane_families
from tidemq_metrics_prometheus.pop_metrics import pop_families
from tidemq_metrics_prometheus.timer_metrics import timer_families

_RETRY = "%RETRY%"
_DLQ = "%DLQ%"
#: MessageModel.ordinal() in RocketMQ: BROADCASTING 0, CLUSTERING 1 (rocketmq-exporter's msgModel label).
_MODEL_ORDINAL = {"BROADCASTING": "0", "CLUSTERING": "1"}
_RUNTIME_LABELS = ["cluster", "brokerIP", "brokerHost", "des", "boottime", "broker_version"]


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


def broker_families(broker: BrokerFiguresView) -> list[Metric]:
    """Every metric family of ``broker`` (call on its event loop)."""
    out: list[Metric] = []
    out += _runtime(broker)
    _rates(broker, out)
    max_offsets = _topic_offsets(broker, out)
    _consumer_offsets(broker, max_offsets, out)
    _store(broker, out)
    _service(broker, out)
    out += pop_families(broker)  # POP consumption (issue 39)
    out += timer_families(broker)  # timer messages (issue 36)
    out += dedup_families(broker)  # the duplicate window (issue 37)
    out += lane_families()  # the compiled request lanes (issue 38), this process's
    return out


def _ids(broker: BrokerFiguresView) -> tuple[str, str, str]:
    settings = broker.settings
    host = split_address(broker.address)[0]
    return settings.cluster, settings.name, host


def _runtime(broker: BrokerFiguresView) -> list[Metric]:
    cluster, name, host = _ids(broker)
    stats = broker.stats
    labels = [cluster, host, name, "", str(int(stats.started_at * 1000)), __version__]
    put = _gauge(
        "rocketmq_brokeruntime_msg_put_total_today_now", "Messages put today (brokerRuntime)", _RUNTIME_LABELS
    )
    put.add_metric(labels, stats.put_count)
    got = _gauge(
        "rocketmq_brokeruntime_msg_gettotal_today_now", "Messages got today (brokerRuntime)", _RUNTIME_LABELS
    )
    got.add_metric(labels, stats.get_count)
    info = _gauge(
        "tidemq_build_info", "tidemq version and codec of this broker", ["version", "codec", "role"]
    )
    codec = "compiled" if COMPILED_CODEC else "python"
    info.add_metric([__version__, codec, broker.role], 1)  # the role in force (controller mode changes it)
    up = _gauge("tidemq_uptime_seconds", "Seconds since the broker started")
    up.add_metric([], time.time() - stats.started_at)
    totals = []
    for metric, doc, value in (
        ("tidemq_messages_put", "Messages stored since start", stats.put_count),
        ("tidemq_message_bytes_put", "Bytes of messages stored since start", stats.put_bytes),
        ("tidemq_messages_got", "Messages served to pulls since start", stats.get_count),
        ("tidemq_message_bytes_got", "Bytes of messages served to pulls since start", stats.get_bytes),
    ):
        family = CounterMetricFamily(metric, doc)
        family.add_metric([], value)
        totals.append(family)
    runtime = [put, got, info, up, *totals]
    for metric, doc, value in (
        ("msg_puttotal_todaymorning", "Messages put by this morning", stats.put_total_today_morning),
        (
            "msg_puttotal_yesterdaymorning",
            "Messages put by yesterday morning",
            stats.put_total_yesterday_morning,
        ),
        ("msg_gettotal_todaymorning", "Messages got by this morning", stats.get_total_today_morning),
        (
            "msg_gettotal_yesterdaymorning",
            "Messages got by yesterday morning",
            stats.get_total_yesterday_morning,
        ),
    ):
        gauge = _gauge(f"rocketmq_brokeruntime_{metric}", doc, _RUNTIME_LABELS)
        gauge.add_metric(labels, value)
        runtime.append(gauge)
    # brokerRuntime's "t10 t60 t600" rates (putTps, getTransferedTps, getFoundTps, getMissTps, getTotalTps).
    for metric, fields in (
        ("put", (1,)),
        ("gettransfered", (2,)),
        ("getfound", (3,)),
        ("getmiss", (4,)),
        ("gettotal", (3, 4)),
    ):
        rates = stats.broker_tps(*fields).split()
        for window, rate in zip(("10", "60", "600"), rates, strict=False):
            gauge = _gauge(
                f"rocketmq_brokeruntime_{metric}_tps{window}",
                f"{metric} TPS over {window} s",
                _RUNTIME_LABELS,
            )
            gauge.add_metric(labels, float(rate))
            runtime.append(gauge)
    return runtime


def _rates(broker: BrokerFiguresView, out: list[Metric]) -> None:
    """rocketmq-exporter's per-minute rates: RocketMQ's stats items (VIEW_BROKER_STATS_DATA)."""
    cluster, name, host = _ids(broker)
    stats = broker.stats
    now_ms = int(time.time() * 1000)
    broker_tps = _gauge("rocketmq_broker_tps", "BrokerPutNums", ["cluster", "brokerIP", "broker"])
    broker_tps.add_metric([cluster, host, name], stats.broker_put.snapshot("minute", False, now_ms).tps)
    broker_qps = _gauge("rocketmq_broker_qps", "BrokerGetNums", ["cluster", "brokerIP", "broker"])
    broker_qps.add_metric([cluster, host, name], stats.broker_get.snapshot("minute", False, now_ms).tps)
    topic_labels = ["cluster", "broker", "topic"]
    producer_tps = _gauge("rocketmq_producer_tps", "TopicPutNums", topic_labels)
    producer_size = _gauge("rocketmq_producer_message_size", "TopicPutMessageSize", topic_labels)
    for topic, counter in stats.topic_puts.items():
        producer_tps.add_metric([cluster, name, topic], counter.snapshot("minute", False, now_ms).tps)
        producer_size.add_metric([cluster, name, topic], counter.snapshot("minute", True, now_ms).tps)
    group_labels = ["cluster", "broker", "topic", "group"]
    consumer_tps = _gauge("rocketmq_consumer_tps", "GroupGetNums", group_labels)
    consumer_size = _gauge("rocketmq_consumer_message_size", "GroupGetMessageSize", group_labels)
    for key, counter in stats.group_gets.items():
        topic, _, group = key.partition("@")
        consumer_tps.add_metric([cluster, name, topic, group], counter.snapshot("minute", False, now_ms).tps)
        consumer_size.add_metric([cluster, name, topic, group], counter.snapshot("minute", True, now_ms).tps)
    out += [broker_tps, broker_qps, producer_tps, producer_size, consumer_tps, consumer_size]


def _topic_offsets(broker: BrokerFiguresView, out: list[Metric]) -> dict[str, dict[int, int]]:
    """rocketmq_producer_offset and friends; returns topic -> queue -> max offset (readable end)."""
    cluster, name, _ = _ids(broker)
    store = broker.store
    producer = _gauge("rocketmq_producer_offset", "TopicOffset", ["cluster", "broker", "topic"])
    retry = _gauge("rocketmq_topic_retry_offset", "TopicRetryOffset", ["cluster", "broker", "topic"])
    dlq = _gauge("rocketmq_topic_dlq_offset", "TopicDLQOffset", ["cluster", "broker", "group"])
    max_offsets: dict[str, dict[int, int]] = {}
    # Queue ends as consumers see them: up to the confirm offset in controller mode (RocketMQ 5's
    # ConsumerLagCalculator and topic stats read its consume queues, dispatched up to it).
    end = broker.read_bound.max_offset if broker.read_bound.active else store.get_max_offset_in_queue
    for topic, queues in store.topics().items():
        per_queue = {qid: end(topic, qid) for qid in queues}
        max_offsets[topic] = per_queue
        total = sum(per_queue.values())
        if topic.startswith(_RETRY):
            retry.add_metric([cluster, name, topic], total)
        elif topic.startswith(_DLQ):
            dlq.add_metric([cluster, name, topic[len(_DLQ) :]], total)
        else:
            producer.add_metric([cluster, name, topic], total)
    out += [producer, retry, dlq]
    return max_offsets


def _consumer_offsets(
    broker: BrokerFiguresView, max_offsets: dict[str, dict[int, int]], out: list[Metric]
) -> None:
    cluster, name, _ = _ids(broker)
    store = broker.store
    consumer = _gauge(
        "rocketmq_consumer_offset", "GroupBrokerTotalOffset", ["cluster", "broker", "topic", "group"]
    )
    diff_labels = ["group", "topic", "countOfOnlineConsumers", "msgModel"]
    diff = _gauge("rocketmq_group_diff", "GroupDiff", diff_labels)
    retry_diff = _gauge("rocketmq_group_retrydiff", "GroupRetryDiff", diff_labels)
    dlq_diff = _gauge("rocketmq_group_dlqdiff", "GroupDLQDiff", diff_labels)
    latency = _gauge(
        "rocketmq_group_get_latency_by_storetime",
        "Age in ms of the oldest message the group has not consumed",
        ["cluster", "broker", "topic", "group"],
    )
    count = _gauge("rocketmq_group_count", "GroupCount", ["caddr", "localaddr", "group"])
    now_ms = time.time() * 1000
    groups = broker.consumers.groups
    table = broker.offsets.serialize()["offsetTable"]
    for key, queues in table.items():
        topic, _, group = key.partition("@")
        if not group:
            continue
        info = groups.get(group)
        online = str(len(info.channels)) if info is not None else "0"
        model = _MODEL_ORDINAL.get(info.message_model, "1") if info is not None else "1"
        tops = max_offsets.get(topic, {})
        committed = 0
        lag = 0
        oldest = 0.0
        for qid_text, offset in queues.items():
            qid = int(qid_text)
            committed += offset
            top = tops.get(qid, offset)
            if top > offset:
                lag += top - offset
                stored = store.get_store_time(topic, qid, offset)
                if stored > 0:
                    oldest = max(oldest, now_ms - stored)
        consumer.add_metric([cluster, name, topic, group], committed)
        target = retry_diff if topic.startswith(_RETRY) else dlq_diff if topic.startswith(_DLQ) else diff
        target.add_metric([group, topic, online, model], lag)
        latency.add_metric([cluster, name, topic, group], oldest)
    for group, info in groups.items():
        addrs = ",".join(sorted(ch.address for ch in info.channels.values()))
        count.add_metric([addrs, broker.address, group], len(info.channels))
    out += [consumer, diff, retry_diff, dlq_diff, latency, count]


def _disk(root: Path) -> tuple[int, int]:
    """(bytes on disk, files) under ``root``: allocated blocks, so sparse files count what they use."""
    used = files = 0
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    used += entry.stat(follow_symlinks=False).st_blocks * 512
                    files += 1
            except OSError:
                continue
    return used, files


def _store(broker: BrokerFiguresView, out: list[Metric]) -> None:
    store = broker.store
    positions = _gauge("tidemq_commitlog_offset_bytes", "Commit-log positions", ["position"])
    positions.add_metric(["max"], store.get_max_phy_offset())
    positions.add_metric(["min"], store.get_min_phy_offset())
    out.append(positions)
    disk = _gauge("tidemq_store_disk_bytes", "Disk space the store's files use", ["kind"])
    files = _gauge("tidemq_store_files", "Files of the store", ["kind"])
    root = Path(broker.data_dir)
    for kind in ("commitlog", "consumequeue", "index"):
        path = root / kind
        if path.exists():
            used, n = _disk(path)
            disk.add_metric([kind], used)
            files.add_metric([kind], n)
    out += [disk, files]
    introspection = store_introspection(store)
    flush = introspection.flush_statistics() if introspection is not None else None
    if flush is not None:
        family = CounterMetricFamily("tidemq_flush_rounds", "Flushes (fdatasync rounds) of the commit log")
        family.add_metric([], flush.flush_rounds)
        out.append(family)
        # rate(requests) / rate(rounds) is the group-commit batch size.
        family = CounterMetricFamily("tidemq_flush_requests", "Puts that asked the flush policy to flush")
        family.add_metric([], flush.requests)
        out.append(family)
        out.append(
            _histogram(
                "tidemq_flush_latency_seconds",
                "Seconds per commit-log flush (fdatasync) round",
                flush.flush_seconds,
            )
        )
        if flush.batch_sizes is not None:
            out.append(
                _histogram(
                    "tidemq_group_commit_batch_size",
                    "Puts made durable by one flush round (sync flush)",
                    flush.batch_sizes,
                )
            )
        if isinstance(flush, RoundStatistics):  # sync flush: inline, compiled, gathered rounds, kicks
            out += flush_round_families(flush.round_stats())
    index = broker.index
    if isinstance(index, IndexBacklog):
        waiting, age = index.pending()
        backlog = _gauge("tidemq_index_backlog_messages", "Messages whose keys wait for the index thread")
        backlog.add_metric([], waiting)
        lag = _gauge("tidemq_index_lag_seconds", "Age of the oldest put waiting for the index thread")
        lag.add_metric([], age)
        out += [backlog, lag]
    out.append(
        _histogram(
            "tidemq_put_latency_seconds",
            "Seconds from a send's put to the store's answer (flush included under sync flush)",
            broker.stats.put_seconds,
        )
    )
    recovery = _gauge("tidemq_recovery_seconds", "Seconds the store took to load (recover) at start-up")
    recovery.add_metric([], broker.recovery_seconds)
    out.append(recovery)


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], buckets.cumulative(), sum_value=buckets.total)
    return family


def _service(broker: BrokerFiguresView, out: list[Metric]) -> None:
    held = _gauge("tidemq_pull_held", "Long-polling pulls waiting for messages")
    held.add_metric([], broker.hold.waiting if broker.hold is not None else 0)
    conns = _gauge("tidemq_client_connections", "Client connections by role", ["role"])
    conns.add_metric(["producer"], sum(len(c) for c in broker.producers.groups.values()))
    conns.add_metric(["consumer"], sum(len(i.channels) for i in broker.consumers.groups.values()))
    groups = _gauge("tidemq_groups", "Groups with a connected client", ["role"])
    groups.add_metric(["producer"], len(broker.producers.groups))
    groups.add_metric(["consumer"], len(broker.consumers.groups))
    refused = CounterMetricFamily("tidemq_acl_refusals", "Requests the access validator refused")
    refused.add_metric([], broker.acl_refusals)
    out += [held, conns, groups, refused]
    # Endpoints plugins serve beside the remoting transport (the gRPC one): their own counters.
    for endpoint, figures in sorted(broker.endpoint_figures.items()):
        for figure, value in sorted(figures().items()):
            name = f"tidemq_{endpoint}_{figure}"
            doc = f"{endpoint} endpoint: {figure.replace('_', ' ')}"
            if figure.endswith("_total"):  # prometheus_client adds the _total suffix itself
                counter = CounterMetricFamily(name[: -len("_total")], doc)
                counter.add_metric([], value)
                out.append(counter)
            else:
                gauge = _gauge(name, doc)
                gauge.add_metric([], value)
                out.append(gauge)
    replication = broker.replication
    if not isinstance(replication, MasterAware):  # the runtime info of master-slave and controller
        return
    info = replication.runtime_info()
    slaves = info.get("haConnectedSlaves")
    if slaves is not None:
        family = _gauge("tidemq_replication_connected_slaves", "Slaves connected to this master")
        family.add_metric([], int(slaves))
        out.append(family)
    behind = info.get("haSlaveFallBehind")
    if behind is not None and int(behind) >= 0:
        family = _gauge(
            "tidemq_replication_lag_bytes", "Commit-log bytes the slaves (or this slave) lag behind"
        )
        family.add_metric([], int(behind))
        out.append(family)
    out += controller_families(info)


def controller_families(info: dict[str, str]) -> list[Metric]:
    """Controller mode's figures from the replication's runtime info (none without ``controllerRole``).

    ``tidemq_controller_epoch``, ``tidemq_controller_master`` (1 on the elected master),
    ``tidemq_controller_in_sync_replicas`` (the in-sync set's size as etcd holds it),
    ``tidemq_controller_replica_lag_bytes{broker_id}`` and ``tidemq_controller_etcd_reachable``.
    """
    role = info.get("controllerRole")
    if role is None:
        return []
    epoch = _gauge("tidemq_controller_epoch", "The election epoch this replica serves or follows")
    epoch.add_metric([], int(info.get("controllerEpoch", "0") or 0))
    master = _gauge("tidemq_controller_master", "1 on the group's elected master, 0 on a slave")
    master.add_metric([], 0 if role == "SLAVE" else 1)
    etcd = _gauge("tidemq_controller_etcd_reachable", "0 while a master serves without reaching etcd")
    etcd.add_metric([], 0 if info.get("controllerEtcd") == "unreachable" else 1)
    out: list[Metric] = [epoch, master, etcd]
    members = [m for m in info.get("controllerSyncSet", "").split(",") if m]
    if members:
        in_sync = _gauge("tidemq_controller_in_sync_replicas", "Members of the group's in-sync set")
        in_sync.add_metric([], len(members))
        out.append(in_sync)
    lags = [part.split("=", 1) for part in info.get("controllerLag", "").split(";") if "=" in part]
    if lags:
        lag = _gauge(
            "tidemq_controller_replica_lag_bytes",
            "Each replica's lag behind the master (etcd reports)",
            ["broker_id"],
        )
        for broker_id, value in lags:
            lag.add_metric([broker_id], int(value))
        out.append(lag)
    return out
