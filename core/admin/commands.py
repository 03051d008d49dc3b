"""The first mqadmin commands: topics, routes, cluster list, consumer progress, messages."""

from __future__ import annotations

import time

import click
import orjson

from tidemq.admin._common import (
    PRODUCER_GROUP,
    TOOLS_GROUP,
    _fmt_ts,
    _print_message,
    _run,
    _table,
    admin,
)
from tidemq.client.admin import AdminClient, AdminError, NoRouteError
from tidemq.client.route import loads_lenient
from tidemq.message import MessageExt, Prop, decode_message_id, iter_messages, properties_to_string
from tidemq.remoting.codes import RequestCode, ResponseCode


@admin.command("updateTopic")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--broker-addr", help="Create on this broker only (host:port).")
@click.option("-c", "--cluster", help="Create on every master of this cluster (default: every master).")
@click.option("-r", "--read-queues", default=8, show_default=True, type=int)
@click.option("-w", "--write-queues", default=8, show_default=True, type=int)
@click.option("-p", "--perm", default=6, show_default=True, type=int, help="2 write, 4 read, 6 read+write.")
@click.option("-o", "--order", is_flag=True, help="Mark the topic as ordered.")
@_run
async def update_topic(
    client: AdminClient,
    topic: str,
    broker_addr: str | None,
    cluster: str | None,
    read_queues: int,
    write_queues: int,
    perm: int,
    order: bool,
) -> None:
    """Create a topic or change its queues and permission."""
    targets = [broker_addr] if broker_addr else list((await client.masters(cluster)).values())
    if not targets:
        raise AdminError("no broker master is registered with the NameServer")
    fields = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": read_queues,
        "writeQueueNums": write_queues,
        "perm": perm,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": order,
    }
    for addr in targets:
        await client.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        click.echo(f"create topic to {addr} success.")
    click.echo(
        f"TopicConfig [topicName={topic}, readQueueNums={read_queues}, writeQueueNums={write_queues}, perm={perm}, order={order}]"
    )


@admin.command("deleteTopic")
@click.option("-t", "--topic", required=True)
@click.option("-c", "--cluster", help="Delete from this cluster's masters (default: every master).")
@_run
async def delete_topic(client: AdminClient, topic: str, cluster: str | None) -> None:
    """Delete a topic from the brokers and the NameServers."""
    for name, addr in (await client.masters(cluster)).items():
        await client.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        click.echo(f"delete topic [{topic}] from broker {name} ({addr}) success.")
    for ns in client.namesrv:
        await client.call(ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
        click.echo(f"delete topic [{topic}] from NameServer {ns} success.")


@admin.command("topicList")
@_run
async def topic_list(client: AdminClient) -> None:
    """List every topic the NameServer knows."""
    resp = await client.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    for topic in sorted(loads_lenient(resp.body or b"{}").get("topicList") or []):
        click.echo(topic)


@admin.command("topicRoute")
@click.option("-t", "--topic", required=True)
@_run
async def topic_route(client: AdminClient, topic: str) -> None:
    """Print a topic's route (queues per broker, broker addresses) as JSON."""
    route = await client.route(topic)
    data = {
        "queueDatas": [
            {
                "brokerName": q.broker_name,
                "readQueueNums": q.read_queue_nums,
                "writeQueueNums": q.write_queue_nums,
                "perm": q.perm,
            }
            for q in route.queue_datas
        ],
        "brokerDatas": [
            {
                "cluster": b.cluster,
                "brokerName": b.broker_name,
                "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()},
            }
            for b in route.broker_datas
        ],
    }
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@admin.command("topicStatus")
@click.option("-t", "--topic", required=True)
@_run
async def topic_status(client: AdminClient, topic: str) -> None:
    """Min/max offsets and last store time of each queue of a topic."""
    route = await client.route(topic)
    rows = []
    for name, addr in sorted(route.addresses().items()):
        resp = await client.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
        for r in loads_lenient(resp.body or b"{}").get("offsetTable") or []:
            rows.append(
                [
                    name,
                    r["queueId"],
                    r["minOffset"],
                    r["maxOffset"],
                    _fmt_ts(int(r.get("lastUpdateTimestamp", 0))),
                ]
            )
    _table(rows, ["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"])


@admin.command("clusterList")
@_run
async def cluster_list(client: AdminClient) -> None:
    """Clusters, their brokers and each broker's message counts."""
    info = await client.cluster_info()
    brokers = info.get("brokerAddrTable") or {}
    rows = []
    for cluster, names in sorted((info.get("clusterAddrTable") or {}).items()):
        for name in sorted(names):
            for bid, addr in sorted(
                ((int(k), v) for k, v in (brokers.get(name, {}).get("brokerAddrs") or {}).items())
            ):
                put = get = version = "-"
                try:
                    resp = await client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
                    table = loads_lenient(resp.body or b"{}").get("table") or {}
                    put, get = table.get("msgPutTotalTodayNow", "-"), table.get("msgGetTotalTodayNow", "-")
                    version = table.get("brokerVersionDesc", "-")
                except AdminError:
                    pass
                rows.append([cluster, name, bid, addr, version, put, get])
    _table(rows, ["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#Put Total", "#Get Total"])


@admin.command("consumerProgress")
@click.option("-g", "--group", required=True, help="Consumer group.")
@click.option("-t", "--topic", help="Only this topic.")
@_run
async def consumer_progress(client: AdminClient, group: str, topic: str | None) -> None:
    """Committed offset and lag of a consumer group, per queue."""
    if topic:
        targets = (await client.route(topic)).addresses()
    else:
        targets = await client.masters()
    rows = []
    total = 0
    for name, addr in sorted(targets.items()):
        fields = {"consumerGroup": group, **({"topic": topic} if topic else {})}
        try:
            resp = await client.call(addr, RequestCode.GET_CONSUME_STATS, fields)
        except AdminError:
            continue
        for r in loads_lenient(resp.body or b"{}").get("offsetTable") or []:
            consumer = int(r["consumerOffset"])
            diff = int(r["brokerOffset"]) - max(consumer, 0)
            total += diff
            rows.append(
                [
                    r["topic"],
                    name,
                    r["queueId"],
                    r["brokerOffset"],
                    consumer,
                    diff,
                    _fmt_ts(int(r.get("lastTimestamp", 0))),
                ]
            )
    if not rows:
        raise AdminError(f"no broker knows consumer group {group!r}")
    _table(
        rows, ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime"]
    )
    click.echo(f"\nDiff Total: {total}")


async def _query(client: AdminClient, topic: str, key: str, unique: bool) -> list[MessageExt]:
    """Messages of ``topic`` with ``key`` (a unique id when ``unique``), from every broker."""
    return await client.query_messages(topic, key, unique)


@admin.command("queryMsgByKey")
@click.option("-t", "--topic", required=True)
@click.option("-k", "--key", "msg_key", required=True)
@_run
async def query_msg_by_key(client: AdminClient, topic: str, msg_key: str) -> None:
    """Find messages by one of their keys (through the brokers' key index)."""
    msgs = await _query(client, topic, msg_key, unique=False)
    if not msgs:
        raise AdminError(f"no message of topic {topic!r} has the key {msg_key!r}")
    _table(
        [
            [m.uniq_key or m.msg_id, m.msg_id, m.queue_id, m.queue_offset, _fmt_ts(m.store_timestamp)]
            for m in msgs
        ],
        ["#Message ID", "#Offset ID", "#QID", "#Offset", "#Store Time"],
    )


async def _broker_addresses(client: AdminClient) -> set[str]:
    """Registered broker addresses, also as IP:port (an offset id holds the store host's IP)."""
    import socket

    known = set(await client.broker_addresses())
    for addr in list(known):
        host, _, port = addr.rpartition(":")
        try:
            known.add(f"{socket.gethostbyname(host.strip('[]'))}:{port}")
        except OSError:
            pass
    return known


@admin.command("queryMsgById")
@click.option("-i", "--msg-id", required=True, help="Offset message id, or a unique id with -t.")
@click.option("-t", "--topic", help="Topic, needed to look up a producer's unique message id.")
@_run
async def query_msg_by_id(client: AdminClient, msg_id: str, topic: str | None) -> None:
    """Print one message, found by its offset id (or its unique id and topic)."""
    msgs: list[MessageExt] = []
    # Producer (unique) ids and offset ids can both be 16 bytes of hex: with a topic, ask the
    # key index first, then read the id as an offset id (RocketMQ's viewMessage does the same).
    if topic:
        msgs = [m for m in await _query(client, topic, msg_id, unique=True) if m.uniq_key == msg_id]
    if not msgs:
        try:
            (host, port), offset = decode_message_id(msg_id)
        except ValueError:
            if not topic:
                raise AdminError(
                    f"{msg_id!r} is not an offset message id; give -t TOPIC to look up a unique id"
                ) from None
        else:
            # Only ask a broker the cluster has: a producer's id read as an offset id names some
            # other machine (the official client's even a byte-swapped IP), and whatever answers
            # there is no broker.
            addr = f"{host}:{port}" if 0 < port < 65536 else ""
            if addr and addr in await _broker_addresses(client):
                resp = await client.call(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
                msgs = list(iter_messages(resp.payload()))
            elif not topic:
                raise AdminError(
                    f"{msg_id} is not an offset message id of this cluster (read as one it names "
                    f"{addr or f'port {port}'}, which is no broker the NameServer knows); a producer's "
                    f"message id (the msg_id a send prints) needs its topic: "
                    f"tidemq admin queryMsgById -i {msg_id} -t TOPIC"
                )
    if not msgs:
        raise AdminError(f"message {msg_id} not found")
    for m in msgs:
        _print_message(m)


@admin.command("sendMessage")
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", required=True, help="Message body (UTF-8).")
@click.option("-k", "--keys", default="", help="Keys, separated by spaces.")
@click.option("-c", "--tags", default="", help="Tag.")
@click.option("-b", "--broker-name", help="Send to this broker.")
@click.option("-i", "--queue-id", type=int, help="Send to this queue.")
@_run
async def send_message(
    client: AdminClient,
    topic: str,
    body: str,
    keys: str,
    tags: str,
    broker_name: str | None,
    queue_id: int | None,
) -> None:
    """Send one message (auto-creates the topic when the brokers allow it)."""
    from tidemq.client.message import new_message_id

    try:
        route = await client.route(topic)
    except NoRouteError:
        try:
            route = await client.route("TBW102")  # the template brokers create new topics from
        except NoRouteError:
            # No broker offers the template: every broker runs with auto_create_topic = false.
            raise AdminError(
                f"topic {topic!r} does not exist and the brokers do not create topics on first send "
                f"([broker] auto_create_topic = false): create it with `tidemq admin updateTopic -t {topic}`"
            ) from None
    queues = route.publish_queues(topic, 4)
    if broker_name:
        queues = [q for q in queues if q.broker_name == broker_name]
    if queue_id is not None:
        queues = [q for q in queues if q.queue_id == queue_id]
    if not queues:
        raise AdminError(f"no writable queue of topic {topic!r} matches")
    mq = queues[int(time.time() * 1000) % len(queues)]
    props = {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: new_message_id(), Prop.WAIT_STORE_MSG_OK: "true"}
    if keys:
        props[Prop.KEYS] = keys
    if tags:
        props[Prop.TAGS] = tags
    fields = {
        "a": PRODUCER_GROUP,
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": mq.queue_id,
        "f": 0,
        "g": int(time.time() * 1000),
        "h": 0,
        "i": properties_to_string(props),
        "j": 0,
        "k": False,
    }
    addr = route.addresses()[mq.broker_name]
    resp = await client.call(addr, RequestCode.SEND_MESSAGE_V2, fields, body.encode())
    _table(
        [
            [
                mq.broker_name,
                mq.queue_id,
                "SEND_OK",
                props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
                resp.ext_fields.get("msgId", ""),
            ]
        ],
        ["#Broker Name", "#QID", "#Send Result", "#MsgId", "#OffsetId"],
    )


@admin.command("consumeMessage")
@click.option("-t", "--topic", required=True)
@click.option("-g", "--group", default=TOOLS_GROUP, show_default=True)
@click.option(
    "-c", "--count", default=128, show_default=True, type=int, help="Stop after this many messages."
)
@click.option("-s", "--sub", "expression", default="*", show_default=True, help="Tag expression.")
@_run
async def consume_message(client: AdminClient, topic: str, group: str, count: int, expression: str) -> None:
    """Print messages of a topic from the start of each queue (commits nothing)."""
    route = await client.route(topic)
    addrs = route.addresses()
    printed = 0
    for mq in route.subscribe_queues():
        addr = addrs.get(mq.broker_name)
        if addr is None:
            continue
        offset = 0
        while printed < count:
            fields = {
                "consumerGroup": group,
                "topic": topic,
                "queueId": mq.queue_id,
                "queueOffset": offset,
                "maxMsgNums": min(32, count - printed),
                "sysFlag": 4,  # subscription carried in the request, no suspend, no commit
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": expression,
                "subVersion": 0,
                "expressionType": "TAG",
            }
            resp = await client.call(
                addr,
                RequestCode.PULL_MESSAGE,
                fields,
                ok=(
                    0,
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY,
                    ResponseCode.PULL_OFFSET_MOVED,
                ),
            )
            next_offset = int(resp.ext_fields.get("nextBeginOffset", offset))
            if resp.code == ResponseCode.SUCCESS:
                for m in iter_messages(resp.payload()):
                    click.echo(
                        f"{mq.broker_name} q{m.queue_id}@{m.queue_offset} id={m.uniq_key or m.msg_id} "
                        f"tags={m.tags or ''} keys={' '.join(m.keys)} body={m.body.decode('utf-8', 'replace')}"
                    )
                    printed += 1
            elif resp.code == ResponseCode.PULL_NOT_FOUND or next_offset == offset:
                break
            offset = next_offset
    click.echo(f"{printed} message(s)")
