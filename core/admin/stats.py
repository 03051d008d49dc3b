"""mqadmin's statistics and queue commands: brokerStatus, statsAll, brokerConsumeStats, queryCq...

Names, flags and output follow RocketMQ 4.9's mqadmin (``tools/command/{broker,stats,queue,
message,producer,connection,cluster}``); tables are aligned by :func:`_table`.
The message-printing and send-probe commands are in :mod:`tidemq.admin.messages`.
"""

from __future__ import annotations

import time
from typing import Any

import click
import orjson

from tidemq.admin import messages  # noqa: F401  (registers the message and send-probe commands)
from tidemq.admin._common import _run, _table, admin
from tidemq.admin._requests import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    consume_stats_rows,
    consumers_of,
    json_body,
    mq_rows,
    null_text,
    parse_timestamp,
    pull,
    queue_range,
    readable,
    runtime_info,
    stats_data,
    sum_24h,
)
from tidemq.client.admin import AdminClient, AdminError
from tidemq.client.diagnostics import version_desc
from tidemq.remoting.codes import RequestCode

# What tidemq.admin.commands and the tests use from here.
__all__ = [
    "consume_stats_rows",
    "consumers_of",
    "json_body",
    "mq_rows",
    "parse_timestamp",
    "pull",
    "queue_range",
    "readable",
    "runtime_info",
    "stats_data",
]


# ---------------------------------------------------------------------- broker statistics
@admin.command("brokerStatus")
@click.option("-b", "--brokerAddr", "broker_addr", help="Broker address (host:port).")
@click.option("-c", "--clusterName", "cluster", help="Every master of this cluster.")
@_run
@readable
async def broker_status(client: AdminClient, broker_addr: str | None, cluster: str | None) -> None:
    """A broker's runtime figures (GET_BROKER_RUNTIME_INFO), one key per line."""
    if broker_addr:
        for key, value in sorted((await runtime_info(client, broker_addr)).items()):
            click.echo(f"{key:<32}: {value}")
        return
    if not cluster:
        raise AdminError("give -b BROKER_ADDR or -c CLUSTER")
    for addr in sorted((await client.masters(cluster)).values()):
        for key, value in sorted((await runtime_info(client, addr)).items()):
            click.echo(f"{addr:<24} {key:<32}: {value}")


@admin.command("statsAll")
@click.option("-a", "--activeTopic", "active", is_flag=True, help="Print active topics only.")
@click.option("-t", "--topic", help="Print this topic only.")
@_run
@readable
async def stats_all(client: AdminClient, active: bool, topic: str | None) -> None:
    """Per topic and consumer group: backlog, in/out TPS and messages over 24 hours."""
    resp = await client.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    topics = sorted(str(t) for t in json_body(resp.body, "GET_ALL_TOPIC_LIST").get("topicList") or [])
    rows: list[list[Any]] = []
    for name in topics:
        if name.startswith((RETRY_PREFIX, DLQ_PREFIX)) or (topic and name != topic):
            continue
        try:
            rows.extend(await _topic_stats_rows(client, name, active))
        except AdminError:
            continue  # a topic without a route (being deleted): mqadmin skips it too
    _table(
        rows,
        ["#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour"],
    )


async def _topic_stats_rows(client: AdminClient, topic: str, active: bool) -> list[list[Any]]:
    """StatsAllSubCommand.printTopicDetail for one topic."""
    route = await client.route(topic)
    masters = sorted(route.addresses().values())
    in_tps, in_today = 0.0, 0
    groups: set[str] = set()
    for addr in masters:
        data = await stats_data(client, addr, "TOPIC_PUT_NUMS", topic)
        if data is not None:
            in_tps += float((data.get("statsMinute") or {}).get("tps", 0.0))
            in_today += sum_24h(data)
        groups.update(await consumers_of(client, addr, topic))
    rows: list[list[Any]] = []
    if not groups:
        if not active or in_today > 0:
            rows.append([topic, "", 0, f"{in_tps:.2f}", "", in_today, "NO_CONSUMER"])
        return rows
    for group in sorted(groups):
        out_tps, out_today, backlog = 0.0, 0, 0
        for addr in masters:
            data = await stats_data(client, addr, "GROUP_GET_NUMS", f"{topic}@{group}")
            if data is not None:
                out_tps += float((data.get("statsMinute") or {}).get("tps", 0.0))
                out_today += sum_24h(data)
            try:
                stats = await consume_stats_rows(client, addr, group, topic)
            except AdminError:
                continue
            backlog += sum(int(r["brokerOffset"]) - int(r["consumerOffset"]) for r in stats)
        if not active or in_today > 0 or out_today > 0:
            rows.append(
                [topic, group, max(backlog, 0), f"{in_tps:.2f}", f"{out_tps:.2f}", in_today, out_today]
            )
    return rows


@admin.command("brokerConsumeStats")
@click.option("-b", "--brokerAddr", "broker_addr", required=True, help="Broker address (host:port).")
@click.option("-o", "--order", default="false", show_default=True, help="true: ordered topics only.")
@click.option(
    "-l", "--level", default=0, show_default=True, type=int, help="Print queues with a diff of at least this."
)
@click.option("-t", "--timeoutMillis", "timeout_ms", default=50_000, show_default=True, type=int)
@_run
@readable
async def broker_consume_stats(
    client: AdminClient, broker_addr: str, order: str, level: int, timeout_ms: int
) -> None:
    """Every consumer group's offsets and lag on one broker (GET_BROKER_CONSUME_STATS)."""
    client.timeout = timeout_ms / 1000
    is_order = order.strip().lower() == "true"
    resp = await client.call(broker_addr, RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": is_order})
    data = json_body(resp.body, "GET_BROKER_CONSUME_STATS")
    rows: list[list[Any]] = []
    try:
        for per_group in data.get("consumeStatsList") or []:
            for group, stats_list in sorted(per_group.items()):
                for stats in stats_list or []:
                    for r in mq_rows(stats.get("offsetTable"), "GET_BROKER_CONSUME_STATS"):
                        diff = int(r["brokerOffset"]) - int(r["consumerOffset"])
                        last = int(r.get("lastTimestamp") or 0)
                        # As mqadmin: queues below the level, or never consumed, are not listed.
                        if diff < level or last <= 0:
                            continue
                        rows.append(
                            [
                                r["topic"],
                                group,
                                r["brokerName"],
                                r["queueId"],
                                r["brokerOffset"],
                                r["consumerOffset"],
                                diff,
                                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last / 1000)),
                            ]
                        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AdminError(f"cannot read the GET_BROKER_CONSUME_STATS answer: {exc!r}") from None
    _table(
        rows,
        [
            "#Topic",
            "#Group",
            "#Broker Name",
            "#QID",
            "#Broker Offset",
            "#Consumer Offset",
            "#Diff",
            "#LastTime",
        ],
    )
    click.echo(f"\nDiff Total: {int(data.get('totalDiff', 0))}")


# ---------------------------------------------------------------------- producers
@admin.command("producerConnection")
@click.option("-g", "--producerGroup", "group", required=True)
@click.option("-t", "--topic", required=True)
@_run
@readable
async def producer_connection(client: AdminClient, group: str, topic: str) -> None:
    """The connections of a producer group (asked of the brokers of a topic it sends to)."""
    route = await client.route(topic)
    last: AdminError | None = None
    for addr in sorted(route.addresses().values()):
        try:
            resp = await client.call(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group})
        except AdminError as exc:
            last = exc
            continue
        conns = json_body(resp.body, "GET_PRODUCER_CONNECTION_LIST").get("connectionSet") or []
        for i, c in enumerate(sorted(conns, key=lambda c: str(c.get("clientId"))), 1):
            click.echo(
                f"{i:04d}  {c.get('clientId', ''):<32} {c.get('clientAddr', ''):<22} "
                f"{c.get('language', ''):<8} {version_desc(int(c.get('version') or 0))}"
            )
        return
    raise AdminError(str(last) if last else f"topic {topic!r} has no broker")


@admin.command("producer")
@click.option("-b", "--broker", "broker_addr", required=True, help="Broker address (host:port).")
@_run
@readable
async def producer(client: AdminClient, broker_addr: str) -> None:
    """Every producer instance connected to a broker (GET_ALL_PRODUCER_INFO)."""
    resp = await client.call(broker_addr, RequestCode.GET_ALL_PRODUCER_INFO)
    table = json_body(resp.body, "GET_ALL_PRODUCER_INFO").get("data") or {}
    if not isinstance(table, dict):
        raise AdminError("cannot read the GET_ALL_PRODUCER_INFO answer: data is not a map")
    for group, instances in sorted(table.items()):
        if not instances:
            click.echo(f"producer group ({group}) instances are empty")
            continue
        for p in instances:
            click.echo(
                f"producer group ({group}) instance : clientId={p.get('clientId')},remoteIP={p.get('remoteIP')}, "
                f"language={p.get('language')}, version={p.get('version')}, "
                f"lastUpdateTimestamp={p.get('lastUpdateTimestamp')}"
            )


# ---------------------------------------------------------------------- queues
@admin.command("queryCq")
@click.option("-t", "--topic", required=True)
@click.option("-q", "--queue", "queue_id", required=True, type=int, help="Queue id.")
@click.option("-i", "--index", required=True, type=int, help="First queue index (offset).")
@click.option("-c", "--count", default=10, show_default=True, type=int)
@click.option("-b", "--broker", "broker_addr", help="Broker address (default: the topic's first broker).")
@click.option("-g", "--consumer", "group", help="Consumer group: also show its subscription.")
@_run
@readable
async def query_cq(
    client: AdminClient,
    topic: str,
    queue_id: int,
    index: int,
    count: int,
    broker_addr: str | None,
    group: str | None,
) -> None:
    """Raw entries of a consume queue (QUERY_CONSUME_QUEUE)."""
    if not broker_addr:
        addrs = (await client.route(topic)).addresses()
        if not addrs:
            raise AdminError("No topic route data!")
        broker_addr = addrs[sorted(addrs)[0]]
    fields: dict[str, Any] = {"topic": topic, "queueId": queue_id, "index": index, "count": count}
    if group:
        fields["consumerGroup"] = group
    resp = await client.call(broker_addr, RequestCode.QUERY_CONSUME_QUEUE, fields)
    if not resp.body:
        raise AdminError(resp.remark or f"index {index} of {queue_id}@{topic} does not exist")
    data = json_body(resp.body, "QUERY_CONSUME_QUEUE")
    if data.get("subscriptionData") is not None:
        sub = orjson.dumps(data["subscriptionData"], option=orjson.OPT_INDENT_2).decode()
        click.echo(f"Subscription data: \n{sub}")
        click.echo("======================================")
    if data.get("filterData") is not None:
        click.echo(f"Filter data: \n{data['filterData']}")
        click.echo("======================================")
    click.echo(f"Queue data: \nmax: {data.get('maxQueueIndex')}, min: {data.get('minQueueIndex')}")
    click.echo("======================================")
    for i, row in enumerate(data.get("queueData") or [], index):
        click.echo(f"idx: {i}")
        click.echo(
            f"ConsumeQueueData{{physicOffset={row.get('physicOffset')}, physicSize={row.get('physicSize')}, "
            f"tagsCode={row.get('tagsCode')}, extendDataJson='{null_text(row.get('extendDataJson'))}', "
            f"bitMap='{null_text(row.get('bitMap'))}', eval={str(bool(row.get('eval'))).lower()}, msg='{null_text(row.get('msg'))}'}}"
        )
        click.echo("======================================")
